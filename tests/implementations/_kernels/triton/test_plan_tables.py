"""The split-KV decode's split count: from the device's SM count and the cache length.

At batch 1 the (K/V head, slot) programs alone leave most SMs idle, so a decode call splits the
keys until there are ``DECODE_WAVES`` programs per SM, as long as each split keeps
``MIN_SPLIT_KEYS`` keys. Checked with fake SM counts (an H100's 132, an A100's 108, a small
GPU's 16), no GPU needed. ``DECODE_WAVES`` is 2, the fastest of 1, 2, 4 and 8 on an H100 at each
decode shape of the kernel sweep (its committed rows, read here).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from implementations._kernels.triton import plan_tables
from implementations._kernels.triton.plan_tables import DECODE_WAVES, MIN_SPLIT_KEYS, split_count

ROOT = Path(__file__).resolve().parents[4]
SWEEP = ROOT / "docs/results/h100/2026-11-26-second-lease/kernel-sweep.csv"


@pytest.fixture
def sms(monkeypatch):
    """Set the device's SM count: ``sms(132)``."""

    def set_count(count: int) -> None:
        monkeypatch.setattr(plan_tables, "sm_count", lambda device: count)

    return set_count


@pytest.mark.parametrize(
    ("count", "kv_programs", "keys", "want"),
    [
        (132, 8, 32768, 33),  # GQA 32/8 at 32k: 33 x 8 = 264 programs >= 2 x 132 (the H100's)
        (132, 8, 131072, 33),  # a longer cache does not add programs the SMs cannot hold
        (132, 32, 32768, 9),  # MHA 32 heads at 32k: 9 x 32 = 288 >= 2 x 132
        (108, 32, 32768, 7),  # an A100: 7 x 32 = 224 >= 2 x 108
        (16, 8, 32768, 4),  # a small GPU: 4 x 8 = 32 = 2 x 16
        (132, 8, 2000, 3),  # a short cache: 3 chunks of 512 keys at least
        (132, 8, 500, 1),  # shorter than one chunk
        (132, 256, 32768, 2),  # batch 32 x 8 K/V heads: 2 x 256 = 512 >= 264
        (132, 512, 32768, 1),  # batch 64 x 8: 512 programs already fill the SMs twice
    ],
)
def test_split_count_fills_the_sms_and_keeps_chunks_long(sms, count, kv_programs, keys, want):
    sms(count)
    n = split_count(kv_programs, 1, keys, "cuda:0")
    assert n == want
    if n > 1:  # each chunk keeps MIN_SPLIT_KEYS keys
        assert keys // n >= MIN_SPLIT_KEYS
    if keys // MIN_SPLIT_KEYS >= -(-DECODE_WAVES * count // kv_programs):  # keys do not bind
        assert n * kv_programs >= DECODE_WAVES * count
        assert (n - 1) * kv_programs < DECODE_WAVES * count  # and no more than that


def test_slots_count_as_programs(sms):
    """A mask with several slots (a global row, dilation classes) has more programs per K/V
    head: fewer splits each."""
    sms(132)
    assert split_count(8, 4, 32768, "cuda:0") == 9
    assert split_count(8, 1, 32768, "cuda:0") == 33


def _decode_rows() -> list[dict]:
    with SWEEP.open() as fh:
        return [r for r in csv.DictReader(fh) if r["kernel"] == "band_fwd_split"
                and r["status"] == "ok" and (r["default"] == "True" or "waves=" in r["config"])]


def test_the_waves_are_the_h100_sweeps_fastest_and_its_split_counts(sms):
    """The committed H100 rows (kernel sweep, 2026-11-26; the default config at 1, 2, 4 and 8
    programs per SM, the default row being the rule's 4 then): ``DECODE_WAVES`` is the fastest
    at every decode shape, and the rule gives the split counts those rows ran (132 SMs;
    MIN_SPLIT_KEYS as then)."""
    rows = _decode_rows()
    shapes = {"decode-32k": (8, 32768), "decode-128k": (8, 131072), "decode-32k-mha": (32, 32768)}
    assert {r["case"] for r in rows} == set(shapes)
    assert MIN_SPLIT_KEYS == 512
    sms(132)
    rule = {int(r["note"].split("the rule's: ")[1].rstrip(")")) for r in rows if r["note"]}
    assert rule == {4}  # the default rows ran at 4 programs per SM
    for case, (kv_heads, keys) in shapes.items():
        mine = {int(r["config"].split("waves=")[1]) if "waves=" in r["config"] else 4: r
                for r in rows if r["case"] == case}
        assert sorted(mine) == [1, 2, 4, 8]
        fastest = min(mine, key=lambda w: float(mine[w]["ms"]))
        assert fastest == DECODE_WAVES, (case, {w: r["ms"] for w, r in mine.items()})
        assert split_count(kv_heads, 1, keys, "cuda:0") == int(float(mine[DECODE_WAVES]["splits"]))
