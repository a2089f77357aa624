"""The order in which ``--dist loadfile`` hands out test files (tests/conftest.py): the dearest
files first, then the rest by their number of tests."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import HEAVY_FILES, heavy_first

ROOT = Path(__file__).resolve().parents[1]


def test_every_heavy_file_exists_once():
    """A renamed or deleted file would silently fall back to xdist's order."""
    assert [f for f in HEAVY_FILES if not (ROOT / f).is_file()] == []
    assert len(set(HEAVY_FILES)) == len(HEAVY_FILES)


def test_heavy_files_go_first_in_their_order_then_the_most_tests():
    aot, report = HEAVY_FILES[0], HEAVY_FILES[1]
    counts = {"tests/a.py": 3, report: 20, "tests/b.py": 900, aot: 11, "tests/c.py": 900,
              "tests/d.py": 40}
    assert heavy_first(counts) == [aot, report, "tests/b.py", "tests/c.py", "tests/d.py",
                                   "tests/a.py"]
    assert heavy_first({}) == []
