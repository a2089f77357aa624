"""The report in a real browser (headless Chromium): not blank, the summary's sentences at the
top, no console errors, no horizontal overflow; and a page with a planted console error,
broken image and overflowing element is caught. Without a browser these skip, unless
``ATTNBENCH_REQUIRE_BROWSER`` is set (CI installs one and sets it): then they fail."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from harness.render import report
from tests.harness.render import browser

SMOKE = Path(__file__).parents[3] / "results" / "baselines" / "cpu-intel-r-xeon-r-t1" / "smoke"


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = browser.find()
    if binary is None:
        message = f"no chromium binary on PATH (tried {', '.join(browser.NAMES)})"
        if os.environ.get(browser.REQUIRE):
            pytest.fail(f"{message}; {browser.REQUIRE} is set: the browser tests must run")
        pytest.skip(message)
    return binary


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    """The report of the committed smoke baseline (real rows, every section it has)."""
    return report.build_report([SMOKE], tmp_path_factory.mktemp("report") / "out")


@pytest.fixture(scope="module")
def every_section(synthetic_report) -> Path:
    """A page with the sections the smoke run lacks (heat maps, per-layer costs): the
    synthetic rows' report (``conftest.synthetic_report``, built once with test_report's)."""
    return synthetic_report[1]


@pytest.fixture(scope="module")
def looks(chromium, tmp_path_factory):
    """``browser.look`` of a page at a width, made once for the module: the summary test and
    the claims-section test read the same page at the same widths (two Chromium runs each)."""
    seen: dict[tuple[Path, int], browser.Look] = {}

    def look(page: Path, width: int) -> browser.Look:
        if (page, width) not in seen:
            workdir = tmp_path_factory.mktemp(f"look-{width}")
            seen[page, width] = browser.look(page, width, workdir, chromium)
        return seen[page, width]

    return look


def _summary_bullets(page: Path) -> list[str]:
    md = (page.parent / "report.md").read_text(encoding="utf-8")
    block = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- (.*)$", block, flags=re.M)


@pytest.mark.parametrize("width", [1280, 800])
def test_the_report_in_a_browser_has_its_summary_no_errors_and_no_overflow(looks, page, width):
    seen = looks(page, width)
    assert browser.ink(seen.screenshot) > 0.01, "the screenshot is blank"
    assert seen.text > 1000
    bullets = _summary_bullets(page)
    assert 3 <= len(seen.summary) <= 6 and seen.summary == bullets
    assert any(s.startswith("attention: ") and ("fastest" in s or "level" in s)
               for s in seen.summary)
    assert any("agree with the float64 reference" in s for s in seen.summary)
    assert seen.summary_top is not None and seen.summary_top < 900, "summary not on screen one"
    assert seen.errors == []
    assert seen.overflow <= 0, f"{seen.overflow} px wider than the window: {seen.wide}"


def test_the_probe_catches_console_errors_overflow_and_a_blank_page(chromium, page, tmp_path):
    broken = tmp_path / "broken.html"
    planted = ('<script>console.error("planted");</script><img src="nowhere.png">'
               '<div id="wide" style="width:3000px">wide</div></body>')
    broken.write_text(page.read_text(encoding="utf-8").replace("</body>", planted),
                      encoding="utf-8")
    seen = browser.look(broken, 900, tmp_path, chromium)
    assert "console.error: planted" in seen.errors
    assert any(e.startswith("failed to load") and "nowhere.png" in e for e in seen.errors)
    assert seen.overflow > 1000 and any(w.startswith("div ") for w in seen.wide)
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><html><head></head><body></body></html>")
    empty = browser.look(blank, 900, tmp_path, chromium)
    assert browser.ink(empty.screenshot) < 0.001 and empty.summary == [] and empty.text == 0


@pytest.mark.parametrize("width", [1280, 800])
def test_a_page_with_every_section_has_no_errors_and_no_overflow(
    chromium, every_section, tmp_path, width
):
    seen = browser.look(every_section, width, tmp_path, chromium)
    assert browser.ink(seen.screenshot) > 0.01 and seen.summary
    assert seen.errors == []
    assert seen.overflow <= 0, f"{seen.overflow} px wider than the window: {seen.wide}"


@pytest.mark.parametrize("width", [1280, 800])
def test_the_claims_section_fits_the_page_and_reads_like_the_cli(looks, page, width):
    """The claims table, folded rows opened: no sideways scroll, the reasons in a column that
    is on screen and wide, no row stretched tall by narrow columns."""
    seen = looks(page, width)
    claims = seen.claims
    assert claims is not None
    assert claims["scroll"] <= 0, f"the claims table scrolls sideways by {claims['scroll']} px"
    assert claims["lastHeading"] == "statement and reason"
    assert claims["lastRight"] <= width and claims["lastShare"] >= 0.4, claims
    assert claims["tallestRow"] < 420, claims
    text = page.read_text(encoding="utf-8")
    section = text[text.index('<section id="claims">') :]
    section = section[: section.index("</section>")]
    assert section.count("<details>") == 1  # one fold, one title
    assert "\\n" not in section and "expected 2 ±0.2" in section
