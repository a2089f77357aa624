"""The one launch mechanism (``[measure] cuda_graph``, decode's ``decode_graph``) on a CPU with
a fake capture: what falls back to the eager call, and why the row says so."""

from __future__ import annotations

import pytest
import torch

from harness.measure import graphs


@pytest.fixture
def capture(fake_capture):
    return fake_capture


def _weights() -> torch.Tensor:
    return torch.randn(5, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def test_a_captured_call_replays_what_the_eager_call_computes(capture):
    w = _weights()
    launched = graphs.launch(lambda: w @ w.T, "cuda-graph")
    assert launched.mode == "cuda-graph" and launched.reason is None
    assert isinstance(launched.run, graphs.GraphedCall)
    torch.testing.assert_close(launched.run(), w @ w.T, rtol=0, atol=0)


def test_a_failed_capture_runs_eagerly_and_says_why(capture):
    capture.fail = "operation not permitted when stream is capturing\nmore"
    w = _weights()

    def eager():
        return w.sum()

    launched = graphs.launch(eager, "cuda-graph")
    assert launched.run is eager and launched.mode == "none"
    assert launched.reason == (
        "cuda-graph failed: RuntimeError: operation not permitted when stream is capturing")


def test_a_replay_that_differs_from_the_eager_call_runs_eagerly(capture):
    """A call that reads a Python value per call (a counter here) is not static: the graph
    replays the value of the capture. The check after capture sees it."""
    count = [0]

    def moving() -> torch.Tensor:
        count[0] += 1
        return torch.full((3,), float(count[0]))

    launched = graphs.launch(moving, "cuda-graph")
    assert launched.mode == "none" and launched.run is moving
    assert launched.reason.startswith("cuda-graph replay differs from the eager call: max |")


def test_an_empty_graph_is_caught_by_its_poisoned_output(capture):
    """On the H100 the attention and block captures came out empty ("The CUDA Graph is empty")
    while their replays 'agreed': the output was the eager result of the capture call. The
    poisoned output catches it."""
    capture.empty = True
    w = _weights()

    def eager():
        return w @ w.T

    launched = graphs.launch(eager, "cuda-graph")
    assert launched.mode == "none" and launched.run is eager
    assert "left its output unwritten" in launched.reason


def test_eager_keeps_the_reason_it_was_given():
    assert graphs.launch(lambda: None, "none", graphs.NO_CUDA).reason == graphs.NO_CUDA
    with pytest.raises(ValueError, match="launch mode"):
        graphs.launch(lambda: None, "graph")


def test_replay_difference_allows_reduction_order_and_nothing_more():
    a = torch.randn(64, generator=torch.Generator().manual_seed(1), dtype=torch.bfloat16)
    ulp = torch.finfo(torch.bfloat16).eps * float(a.abs().max())
    assert graphs.replay_difference(a + 0, a) is None
    assert graphs.replay_difference((a, a), (a, a.clone())) is None
    near = a.double() + 2 * ulp
    assert graphs.replay_difference(near.to(torch.bfloat16), a) is None
    assert "difference" in graphs.replay_difference(a * 1.5, a)
    assert graphs.replay_difference(a[:3], a) == "a different output shape"
    assert graphs.replay_difference((a,), (a, a)) == "a different number of outputs"
    nan = torch.tensor([float("nan"), 1.0])
    assert graphs.replay_difference(nan, nan) is None  # non-finite: the runner's check says so
