"""CPU peak memory is real: both methods agree with analytic allocations, and the
targets for `full`, `sdpa-flash` and `flash-tiled` hold."""

from __future__ import annotations

import itertools

import pytest
import torch

from harness import registry
from harness.masks import MaskSpec
from harness.measure.device import CpuDevice, profiler_peak_bytes, rss_hwm_peak_bytes
from tests.conftest import make_qkv

MiB = 2**20


@pytest.mark.parametrize("n", [512, 1500, 3000])
def test_profiler_method_is_exact_for_a_known_allocation(n):
    # the n x n float32 score matrix of eager attention, written so it is really allocated
    assert profiler_peak_bytes(lambda: torch.empty(n, n).fill_(1.0)) == n * n * 4


def test_profiler_method_sees_the_peak_not_the_end_state():
    def two_temporaries():
        a = torch.ones(1000, 1000)
        b = a * 2  # both alive: 8 MB peak
        del a
        return b.sum()

    assert profiler_peak_bytes(two_temporaries) == pytest.approx(8_000_000, rel=0.01)


def test_rss_method_is_within_two_mib_of_a_known_allocation():
    n = 4096
    reading = rss_hwm_peak_bytes(lambda: torch.empty(n, n).fill_(1.0))
    assert abs(reading - n * n * 4) < 2 * MiB


def peak(name: str, n: int, causal: bool = False) -> int:
    q, k, v = make_qkv(1, 8, n, n, 64, seed=n)
    impl = registry.get(name)

    def call():
        with torch.no_grad():
            return impl(q, k, v, MaskSpec(causal=causal))

    call()
    reading = CpuDevice().peak_memory(call)
    assert reading.method == "torch-profiler"
    return reading.peak_bytes


def test_full_attention_memory_is_the_score_matrix_and_quadratic():
    scores = 2048 * 2048 * 8 * 4  # B=1, H=8, fp32: 128 MiB
    at_2k = peak("full", 2048)
    assert scores <= at_2k <= 2.3 * scores
    assert peak("full", 1024) * 3.6 <= at_2k <= peak("full", 1024) * 4.4


def test_sdpa_flash_memory_stays_under_a_tenth_of_the_scores():
    assert peak("sdpa-flash", 2048, causal=True) < 0.1 * 2048 * 2048 * 8 * 4


def test_flash_tiled_memory_grows_linearly():
    readings = [peak("flash-tiled", n, causal=True) for n in (1024, 2048, 4096)]
    ratios = [b / a for a, b in itertools.pairwise(readings)]
    assert all(1.0 <= r <= 2.5 for r in ratios), (readings, ratios)
    assert readings[-1] < 0.1 * 4096 * 4096 * 8 * 4
