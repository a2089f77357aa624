"""The split-KV decode's split count: from the device's SM count and the cache length.

At batch 1 the (K/V head, slot) programs alone leave most SMs idle, so a decode call splits the
keys until there are ``DECODE_WAVES`` programs per SM, as long as each split keeps
``MIN_SPLIT_KEYS`` keys. Checked with fake SM counts (an H100's 132, an A100's 108, a small
GPU's 16), no GPU needed.
"""

from __future__ import annotations

import pytest

from implementations._kernels import triton_tables
from implementations._kernels.triton_tables import DECODE_WAVES, MIN_SPLIT_KEYS, split_count


@pytest.fixture
def sms(monkeypatch):
    """Set the device's SM count: ``sms(132)``."""

    def set_count(count: int) -> None:
        monkeypatch.setattr(triton_tables, "sm_count", lambda device: count)

    return set_count


@pytest.mark.parametrize(
    ("count", "kv_programs", "keys", "want"),
    [
        (132, 8, 32768, 64),  # GQA 32/8 at 32k: 66 wanted, 64 chunks of 512 keys
        (132, 32, 32768, 17),  # MHA 32 heads at 32k: 17 x 32 = 544 programs >= 4 x 132
        (132, 32, 131072, 17),  # a longer cache does not add programs the SMs cannot hold
        (108, 32, 32768, 14),  # an A100: 14 x 32 = 448 >= 4 x 108
        (16, 8, 32768, 8),  # a small GPU: 8 x 8 = 64 = 4 x 16
        (132, 8, 2000, 3),  # a short cache: 3 chunks of 512 keys at least
        (132, 8, 500, 1),  # shorter than one chunk
        (132, 512, 32768, 2),  # batch 64 x 8 K/V heads: 1024 programs already fill the SMs
        (132, 1024, 32768, 1),
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
    assert split_count(8, 4, 32768, "cuda:0") == 17
    assert split_count(8, 1, 32768, "cuda:0") == 64
