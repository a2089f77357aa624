"""The fused Nyströmformer (``nystrom`` with ``fused = 1``: four Triton launches) against its
float64 definition at odd sizes, m not dividing n, n_q != n_k, grouped K/V, fp32 and bf16, and
at GPU tile sizes; its launches per call; its workspace formula; its refusals and the default.

Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from harness import registry
from harness.masks import MaskSpec
from harness.measure.dispatch import OpCount
from harness.oracle.agreement import output_agreement
from harness.registry import NotSupportedError, problem_of
from implementations._kernels.triton import kernel_launch
from implementations._kernels.triton import nystrom_path as nf
from tests.conftest import kernel_arithmetic, make_qkv, prepared_peak_beyond_output

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAUNCHES = ["nys_landmarks", "nys_key_pass", "nys_pinv", "nys_output"]
# (batch, heads, kv_heads, n_q, n_k, head_dim, landmarks): m not dividing n (unequal
# row groups), n_q != n_k both ways, grouped K/V, odd D (200: the key pass in value blocks);
# then GPU tile sizes (n = 256 = 4 key tiles, D = 64, m = 64)
SHAPES = [(2, 4, 2, 97, 130, 59, 13), (1, 2, 2, 161, 33, 16, 33), (1, 1, 1, 100, 300, 32, 7),
          (1, 1, 1, 70, 90, 200, 16), (1, 2, 1, 256, 256, 64, 64)]


def _agreement(impl, out, q, k, v, mask, **params) -> dict:
    """The harness's agreement of ``out`` with ``impl``'s float64 definition on q, k, v (the
    naive scale in the kernels' arithmetic: :func:`tests.conftest.kernel_arithmetic`)."""
    ref = impl.define(q.double(), k.double(), v.double(), mask, **params)
    with kernel_arithmetic():
        naive = impl.define(q, k, v, mask, **params)
    return output_agreement(out, ref, q.dtype, naive=naive)


def _inputs(shape, dtype, seed):
    b, h, hk, n_q, n_k, d, _ = shape
    return [t.to(DEVICE) for t in make_qkv(b, h, n_q, n_k, d, kv_heads=hk, dtype=dtype,
                                           seed=seed)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_nystrom_matches_the_float64_definition(shape, dtype):
    """The harness's agreement rule (k × the naive same-dtype error + ε), in four launches;
    the key pass has more than one split where n allows, so its combine counts."""
    q, k, v = _inputs(shape, dtype, seed=sum(shape))
    m, impl, mask = shape[-1], registry.get("nystrom"), MaskSpec()
    assert nf.runs_fused(problem_of(q, k, v, mask, (("fused", 1), ("landmarks", m))))
    launches = []
    with torch.no_grad(), kernel_launch.watching(launches.append):
        out = impl(q, k, v, mask, landmarks=m, fused=1)
    assert [x.name for x in launches] == LAUNCHES
    result = _agreement(impl, out, q, k, v, mask, landmarks=m)
    assert out.dtype == dtype and result["agree"], result
    if shape[4] > 64:
        assert nf.splits(shape[0] * shape[1], shape[4])[0] >= 2


def test_a_wrong_iteration_count_is_caught():
    """One pseudo-inverse iteration where the definition takes six: off the definition (the
    check can fail)."""
    shape = SHAPES[0]
    q, k, v = _inputs(shape, torch.float32, seed=3)
    impl = registry.get("nystrom")
    with torch.no_grad():
        out = impl(q, k, v, MaskSpec(), landmarks=13, pinv_iters=1, fused=1)
    assert not _agreement(impl, out, q, k, v, MaskSpec(), landmarks=13)["agree"]


def test_launches_and_host_ops_do_not_grow_with_n():
    """Four launches and the same host ops at n = 128 and 8192 (recorded, not run)."""
    counts = []
    for n in (128, 8192):
        q, k, v = _inputs((1, 4, 2, n, n, 32, 16), torch.float32, seed=n)
        launches = []
        with torch.no_grad(), kernel_launch.watching(launches.append, execute=False), \
                OpCount() as ops:
            registry.get("nystrom")(q, k, v, MaskSpec(), landmarks=16, fused=1)
        counts.append(([x.name for x in launches], ops.ops))
    assert counts[0] == counts[1] and counts[0][0] == LAUNCHES


def test_workspace_formula_is_the_measured_peak():
    """Peak bytes above the inputs and output = the fused workspace formula, the registered
    memory model of a fused call; on CUDA torch's allocator rounds each of the 6 buffers up to
    512 B."""
    shape = SHAPES[0]
    q, k, v = _inputs(shape, torch.float32, seed=1)
    impl = registry.get("nystrom")
    problem = problem_of(q, k, v, MaskSpec(), (("fused", 1), ("landmarks", 13)))
    formula = nf.workspace_bytes(problem)
    n_split = nf.splits(8, 130)[0]
    assert impl.cost.memory_model(problem) == formula
    assert formula == 4 * 13 * (2 * 8 * 59 + 4 * 59 + 8 * n_split * 61)
    extra = prepared_peak_beyond_output(impl.name, problem, q, k, v) - formula
    assert extra == 0 or (DEVICE == "cuda" and 0 <= extra < 6 * 512), (extra, formula)


def test_refusals_and_the_default():
    """fused = 1 where the kernels cannot run: one line naming why (more than 64 landmarks,
    float64, autograd); the default keeps PyTorch (a candidate), on CUDA too."""
    impl = registry.get("nystrom")
    q, k, v = _inputs((1, 2, 2, 130, 130, 16, 0), torch.float32, seed=4)
    with pytest.raises(NotSupportedError, match="at most 64 landmarks, not 65"):
        impl(q, k, v, MaskSpec(), landmarks=65, fused=1)
    with pytest.raises(ValueError, match="fused = 1: the fused Nyström kernels take at most"):
        impl.fn(q, k, v, MaskSpec(), landmarks=65, fused=1)
    with pytest.raises(NotSupportedError, match="not float64"):
        impl(q.double(), k.double(), v.double(), MaskSpec(), landmarks=8, fused=1)
    with pytest.raises(NotSupportedError, match="forward-only"):
        impl(q.requires_grad_(), k, v, MaskSpec(), landmarks=8, fused=1)
    launches = []
    with torch.no_grad(), kernel_launch.watching(launches.append):
        out = impl(q.detach(), k, v, MaskSpec(), landmarks=8)
    ref = impl.define(q.double(), k.double(), v.double(), MaskSpec(), landmarks=8)
    assert launches == [] and (out.double() - ref).abs().max() < 1e-5
    default = problem_of(q.detach(), k, v, MaskSpec(), (("landmarks", 8),))
    assert not nf.runs_fused(default) and not nf.AUTO
