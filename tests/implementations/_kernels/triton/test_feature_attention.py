"""The fused feature-map attention (``linear``, ``performer`` with ``fused = 1``), non-causal
and the causal chunk kernel, against the float64 definitions, at odd sizes, n_q != n_k,
grouped K/V, fp32 and bf16; its launches per call; FAVOR+'s stabiliser across key splits; its
workspace formula; the path rule.

Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, tests/conftest.py).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from harness import registry
from harness.masks import MaskSpec
from harness.measure.dispatch import OpCount
from harness.oracle.agreement import output_agreement
from harness.registry import NotSupportedError, problem_of
from harness.spec import Problem
from implementations._kernels.triton import feature_attention as fa
from implementations._kernels.triton import fused_path, kernel_launch
from implementations.performer import orthogonal_features
from tests.conftest import kernel_arithmetic, make_qkv, prepared_peak_beyond_output

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PARAMS = {"linear": {"fused": 1}, "performer": {"features": 48, "fused": 1}}
# (batch, heads, kv_heads, n_q, n_k, head_dim): odd sizes, unequal lengths, grouped K/V
SHAPES = [(2, 4, 2, 97, 130, 59), (1, 2, 2, 161, 33, 16), (2, 3, 3, 97, 97, 59)]


def _agreement(impl, out, q, k, v, mask, **params) -> dict:
    """The harness's agreement of ``out`` with ``impl``'s float64 definition on q, k, v (its
    error scaled by the naive definition's in q's dtype, evaluated in the kernels' arithmetic:
    :func:`tests.conftest.kernel_arithmetic`); ``rows=`` compares those rows."""
    ref = impl.define(q.double(), k.double(), v.double(), mask, **params)
    with kernel_arithmetic():
        naive = impl.define(q, k, v, mask, **params)
    rows = params.get("rows")
    got = out if rows is None else out[:, :, rows.to(out.device)]
    return output_agreement(got, ref, q.dtype, naive=naive)


def _inputs(shape, dtype, seed):
    b, h, hk, n_q, n_k, d = shape
    return [t.to(DEVICE) for t in make_qkv(b, h, n_q, n_k, d, kv_heads=hk, dtype=dtype,
                                           seed=seed)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_fused_path_matches_the_float64_definition(name, shape, dtype):
    """The harness's agreement rule: within k × the error of the definition evaluated naively
    in the dtype, + ε."""
    q, k, v = _inputs(shape, dtype, seed=sum(shape) + len(name))
    mask, impl = MaskSpec(seed=11), registry.get(name)
    assert fa.runs_fused(problem_of(q, k, v, mask, tuple(sorted(PARAMS[name].items()))))
    with torch.no_grad():
        out = impl(q, k, v, mask, **PARAMS[name])
    result = _agreement(impl, out, q, k, v, mask, **PARAMS[name])
    assert out.dtype == dtype and result["agree"], result


def test_a_wrong_state_is_caught():
    """The fused output with a perturbed key is off the definition: the check can fail."""
    q, k, v = _inputs(SHAPES[0], torch.float32, seed=5)
    impl = registry.get("linear")
    with torch.no_grad():
        out = impl(q, k[:, :, 1:], v[:, :, 1:], MaskSpec(), fused=1)  # one key short
    assert not _agreement(impl, out, q, k, v, MaskSpec())["agree"]


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_launches_and_host_ops_do_not_grow_with_n(name):
    """Three kernel launches per call and the same number of ATen ops on the host (the
    buffers) at n = 64 and n = 2048 (launches recorded, not run)."""
    counts, impl = [], registry.get(name)
    with torch.no_grad():  # what a first call caches (FAVOR+'s W: by m and D, not n), made
        # by one run at the small n (the interpreter would take seconds to run n = 2048)
        impl(*_inputs((1, 4, 4, 64, 64, 32), torch.float32, seed=0), MaskSpec(),
             **PARAMS[name])
    for n in (64, 2048):
        q, k, v = _inputs((1, 4, 4, n, n, 32), torch.float32, seed=n)
        launches = []
        with (torch.no_grad(), kernel_launch.watching(launches.append, execute=False),
              OpCount() as ops):
            impl(q, k, v, MaskSpec(), **PARAMS[name])
        counts.append(([x.name for x in launches], ops.ops))
    assert counts[0] == counts[1]
    assert counts[0][0] == ["feature_state", "feature_combine", "feature_output"]


def test_favor_stabiliser_is_exact_when_key_logits_differ_by_over_100():
    """Keys along W's rows (logits |W'_f|²/2 > 88: exp overflows fp32 unshifted) in later
    splits, small keys (logits near 0) in the first: each split's own maxima, rescaled to the
    head's, give the float64 definition under its global key maximum."""
    d, m, n_k, s = 256, 64, 97, 1.0 / 16
    mask = MaskSpec(seed=3)
    q, k, v = _inputs((1, 1, 1, 33, n_k, d), torch.float32, seed=9)
    w = orthogonal_features(m, d, mask.seed) * math.sqrt(s)  # W' (m, D) float64
    k = k * 0.05
    rows = torch.arange(40, n_k) % m
    k[0, 0, 40:] = (w[rows] / s).to(k)  # logit of feature f_j: |W'_f|² / (2 s) · s = |W'_f|²/2
    logits = k[0, 0].double().cpu() @ w.T - s * (k[0, 0].double().cpu() ** 2).sum(-1)[:, None] / 2
    per_key = logits.amax(-1)
    assert per_key.max() > 88.8 and per_key.max() - per_key[:32].max() > 100  # split 0: 32 keys
    assert fa.key_splits(1, n_k, m, fa.tiles(d, True))[0] >= 3
    impl = registry.get("performer")
    with torch.no_grad():
        out = impl(q, k, v, mask, features=m, scale=s, fused=1)
    assert torch.isfinite(out).all()
    result = _agreement(impl, out, q, k, v, mask, scale=s, features=m)
    assert result["agree"], result


@pytest.mark.parametrize("name,favor", [("linear", False), ("performer", True)])
def test_workspace_formula_is_the_measured_peak(name, favor):
    """Peak bytes above the inputs and output (profiler allocation events, on the CPU under the
    interpreter) = the fused workspace formula, the registered memory model of a call that runs
    the fused path; on CUDA torch's allocator rounds each of the 5 buffers up to 512 B."""
    shape = (2, 4, 2, 97, 130, 59)
    q, k, v = _inputs(shape, torch.float32, seed=1)
    params = dict(PARAMS[name])
    impl = registry.get(name)
    problem = problem_of(q, k, v, MaskSpec(), tuple(sorted(params.items())))
    features = params.get("features", 59)
    formula = fa.feature_workspace_bytes(problem, features, favor)
    assert impl.cost.memory_model(problem) == formula
    n_split = fa.key_splits(4, 130, features, fa.tiles(59, favor))[0]
    assert formula == 4 * 4 * (n_split * features * (60 + favor) + features * 60)
    extra = prepared_peak_beyond_output(impl.name, problem, q, k, v) - formula
    assert extra == 0 or (DEVICE == "cuda" and 0 <= extra < 5 * 512), (extra, formula)


def test_the_workspace_does_not_grow_past_the_split_cap():
    """The partial states are about PROGRAMS programs' worth, whatever n: at most a few per cent
    of q, k and v at n = 64k (B1 H16 D64 bf16, m = 256)."""
    for favor, f in ((False, 64), (True, 256)):
        p = Problem(1, 16, 65536, 65536, 64, dtype=torch.bfloat16, device="cuda")
        assert fa.feature_workspace_bytes(p, f, favor) < 0.05 * 3 * 65536 * 16 * 64 * 2


def test_path_rule_and_refusals():
    """auto: the fused path on CUDA for non-causal calls without autograd only; fused = 1
    where it cannot run: one line naming why (registry reason and direct call)."""
    cuda = Problem(1, 2, 64, 64, 64, dtype=torch.bfloat16, device="cuda")
    assert fa.runs_fused(cuda) == (fused_path.unavailable_reason(fa.IMPORT_ERROR) is None)
    assert not fa.runs_fused(Problem(1, 2, 64, 64, 64, device="cpu"))
    assert not fa.runs_fused(Problem(1, 2, 64, 64, 64, device="cuda", mask=MaskSpec(causal=True)))
    assert not fa.runs_fused(Problem(1, 2, 64, 64, 64, device="cuda", backward=True))
    assert not fa.runs_fused(Problem(1, 2, 64, 64, 64, device="cuda", params=(("fused", 0),)))
    q, k, v = _inputs((1, 2, 2, 33, 33, 16), torch.float32, seed=2)
    impl, performer = registry.get("linear"), registry.get("performer")
    many = "fused = 1: the causal chunk kernel holds at most 256 random features, not 300"
    with pytest.raises(NotSupportedError, match=many):
        performer(q, k, v, MaskSpec(causal=True), features=300, fused=1)
    with pytest.raises(NotSupportedError, match="forward-only"):
        impl(q.requires_grad_(), k, v, MaskSpec(), fused=1)
    with pytest.raises(ValueError, match=many):
        performer.fn(q.detach(), k, v, MaskSpec(causal=True), features=300, fused=1)
    with torch.no_grad():  # the non-causal kernels take any m
        performer(q.detach(), k, v, MaskSpec(), features=300, fused=1)
    q64 = q.detach().double()
    reasons = impl.not_supported(problem_of(q64, k.double(), v.double(), MaskSpec(),
                                            (("fused", 1),)))
    assert reasons == ["fused = 1: the fused kernels cover fp32/fp16/bf16, not float64"]


def test_auto_keeps_the_pytorch_path_off_cuda(monkeypatch):
    """On a CPU (and for causal or autograd calls anywhere) auto never launches a kernel."""
    q, k, v = _inputs((1, 2, 2, 33, 33, 16), torch.float32, seed=4)
    launches = []
    with kernel_launch.watching(launches.append), torch.no_grad():
        for name in PARAMS:
            registry.get(name)(q, k, v, MaskSpec(causal=True))
            if DEVICE == "cpu":
                registry.get(name)(q, k, v, MaskSpec())
    assert launches == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_auto_takes_the_fused_path_on_cuda_and_agrees(name):
    """On CUDA the default call (fused = -1) launches the three kernels and matches the float64
    definition at B1 H16 D64 bf16, n = 4096 (m = 256 for FAVOR+)."""
    q, k, v = _inputs((1, 16, 16, 4096, 4096, 64), torch.bfloat16, seed=1)
    impl, mask, launches = registry.get(name), MaskSpec(seed=1), []
    with kernel_launch.watching(launches.append), torch.no_grad():
        out = impl(q, k, v, mask)
    assert [x.name for x in launches] == ["feature_state", "feature_combine", "feature_output"]
    rows = torch.arange(0, 4096, 61)
    result = _agreement(impl, out, q, k, v, mask, rows=rows)
    assert result["agree"], result


# the causal chunk kernel (``linear``, fused = 1): (batch, heads, kv_heads, n, head_dim), odd
# sizes (n = 97 is 4 chunks of 32 with a tail of 1; 200 at D = 128 is 7 key splits) and GPU tile
# sizes (n = 256 at D = 64: whole chunks, whole splits)
CAUSAL_SHAPES = [(2, 4, 2, 97, 59), (1, 2, 2, 161, 16), (1, 1, 1, 200, 128), (1, 2, 1, 256, 64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_causal_chunk_kernel_matches_the_float64_definition(shape, dtype):
    """The chunkwise kernel (key states per split, their prefix, chunk by chunk outputs) within
    the agreement rule of the float64 definition; more than one split, so the prefix counts."""
    b, h, hk, n, d = shape
    q, k, v = _inputs((b, h, hk, n, n, d), dtype, seed=n + d)
    mask, impl = MaskSpec(causal=True), registry.get("linear")
    assert fa.key_splits(b * hk, n, d, fa.tiles(d, False))[0] >= 2
    assert fa.runs_fused(problem_of(q, k, v, mask, (("fused", 1),)), chunked=True)
    launches = []
    with torch.no_grad(), kernel_launch.watching(launches.append):
        out = impl(q, k, v, mask, fused=1)
    assert [x.name for x in launches] == ["feature_state", "feature_scan", "feature_chunk"]
    result = _agreement(impl, out, q, k, v, mask)
    assert out.dtype == dtype and result["agree"], result


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 2, 2, 33, 50, 16), (2, 4, 2, 50, 33, 59),
                                   (1, 2, 1, 97, 200, 64), (1, 1, 1, 1, 70, 16)],
                         ids=lambda s: "x".join(map(str, s)))
def test_causal_chunk_kernel_with_unequal_lengths(shape, dtype):
    """n_q != n_k, bottom-right: n_q < n_k (every query keeps a prefix of keys before its own
    position), n_q > n_k (the first n_q - n_k queries keep no key: zeros, as the definition).
    One query (a decode step) keeps every key: the registry hands the path the reduced mask
    (:func:`harness.masks.reduced`), and the non-causal kernels run."""
    q, k, v = _inputs(shape, dtype, seed=shape[3] + shape[4])
    mask, impl = MaskSpec(causal=True), registry.get("linear")
    launches = []
    with torch.no_grad(), kernel_launch.watching(launches.append):
        out = impl(q, k, v, mask, fused=1)
    path = ["feature_state", "feature_scan", "feature_chunk"]
    if shape[3] == 1:
        path = ["feature_state", "feature_combine", "feature_output"]
    assert [x.name for x in launches] == path
    result = _agreement(impl, out, q, k, v, mask)
    assert result["agree"], result
    if shape[3] > shape[4]:
        assert (out[:, :, : shape[3] - shape[4]] == 0).all()


def test_causal_chunk_kernel_is_causal():
    """Its output is off the non-causal definition and off a definition with the diagonal
    shifted by one key (the check can fail on a wrong mask)."""
    q, k, v = _inputs((1, 2, 2, 97, 97, 32), torch.float32, seed=8)
    impl = registry.get("linear")
    with torch.no_grad():
        out = impl(q, k, v, MaskSpec(causal=True), fused=1)
    assert not _agreement(impl, out, q, k, v, MaskSpec())["agree"]
    fq, fk = (torch.nn.functional.elu(x.double()) + 1 for x in (q, k))
    fk = fk.repeat_interleave(2 // k.shape[1], 1)
    weights = (fq @ fk.transpose(-1, -2)).tril(1)  # one key past the diagonal
    shifted = weights @ v.double().repeat_interleave(2 // k.shape[1], 1)
    shifted = shifted / weights.sum(-1, keepdim=True)
    assert (out.double() - shifted).abs().max() > 1e-3 > (out.double() - impl.define(
        q.double(), k.double(), v.double(), MaskSpec(causal=True))).abs().max()


def test_causal_chunk_launches_do_not_grow_with_n():
    """Three launches and the same host ops at n = 64 and n = 4096 (recorded, not run)."""
    counts = []
    for n in (64, 4096):
        q, k, v = _inputs((1, 4, 2, n, n, 32), torch.float32, seed=n)
        launches = []
        with torch.no_grad(), kernel_launch.watching(launches.append, execute=False), \
                OpCount() as ops:
            registry.get("linear")(q, k, v, MaskSpec(causal=True), fused=1)
        counts.append(([x.name for x in launches], ops.ops))
    assert counts[0] == counts[1]
    assert counts[0][0] == ["feature_state", "feature_scan", "feature_chunk"]


def test_causal_chunk_refusals_and_the_default():
    """D > 256 and float64 with fused = 1: refused with the reason; auto takes PyTorch for
    causal calls, on CUDA too (a candidate until a GPU measures it)."""
    impl = registry.get("linear")
    q, k, v = _inputs((1, 2, 2, 33, 50, 16), torch.float32, seed=3)
    launches = []
    with torch.no_grad(), kernel_launch.watching(launches.append):
        out = impl(q, k, v, MaskSpec(causal=True))
    ref = impl.define(q.double(), k.double(), v.double(), MaskSpec(causal=True))
    assert launches == [] and (out.double() - ref).abs().max() < 1e-5
    for bad, why in (((1, 2, 2, 40, 40, 257), "D <= 256, not 257"),):
        q, k, v = _inputs(bad, torch.float32, seed=4)
        with pytest.raises(NotSupportedError, match=why):
            impl(q, k, v, MaskSpec(causal=True), fused=1)
    q, k, v = (x.double() for x in _inputs((1, 2, 2, 40, 40, 16), torch.float32, seed=4))
    with pytest.raises(NotSupportedError, match="not float64"):
        impl(q, k, v, MaskSpec(causal=True), fused=1)
    cuda = Problem(1, 2, 64, 64, 64, dtype=torch.bfloat16, device="cuda",
                   mask=MaskSpec(causal=True))
    assert not fa.runs_fused(cuda, chunked=True) and not fa.AUTO_CAUSAL
    assert fa.feature_reasons(cuda, chunked=True) == (
        [r for r in [fused_path.unavailable_reason(fa.IMPORT_ERROR)] if r])


def test_causal_chunk_workspace_formula_is_the_measured_peak():
    """Peak bytes above the inputs and output = the causal workspace formula, the registered
    memory model of a causal call with fused = 1 (the prefix is made in place)."""
    q, k, v = _inputs((2, 4, 2, 97, 97, 59), torch.float32, seed=1)
    impl, mask = registry.get("linear"), MaskSpec(causal=True)
    problem = problem_of(q, k, v, mask, (("fused", 1),))
    formula = fa.chunk_workspace_bytes(problem)
    n_split = fa.key_splits(4, 97, 59, fa.tiles(59, False))[0]
    assert impl.cost.memory_model(problem) == formula == 4 * 4 * n_split * 59 * 60
    extra = prepared_peak_beyond_output(impl.name, problem, q, k, v) - formula
    assert extra == 0 or (DEVICE == "cuda" and 0 <= extra < 3 * 512), (extra, formula)


# the causal chunk kernel with FAVOR+ (``performer``, fused = 1): (batch, heads, kv_heads, n,
# head_dim, m), odd sizes (n = 97: 6 chunks of 16 and a tail of 1; m = 48, 20 below a power of
# two) and GPU tile sizes (n = 256, D = 64, m = 256: whole chunks, whole splits)
FAVOR_CAUSAL = [(2, 4, 2, 97, 59, 48), (1, 2, 2, 161, 16, 20), (1, 2, 1, 256, 64, 256)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", FAVOR_CAUSAL, ids=lambda s: "x".join(map(str, s)))
def test_causal_favor_chunk_kernel_matches_the_float64_definition(shape, dtype):
    """FAVOR+ through the chunk kernel (the splits' states under their own maxima, the prefix
    under the head's, the chunks' features made in registers) within the agreement rule of the
    float64 definition; more than one split, so the prefix and its rescaling count."""
    b, h, hk, n, d, m = shape
    q, k, v = _inputs((b, h, hk, n, n, d), dtype, seed=n + m)
    mask, impl = MaskSpec(causal=True, seed=7), registry.get("performer")
    params = (("features", m), ("fused", 1))
    assert fa.key_splits(b * hk, n, m, fa.tiles(d, True))[0] >= 2
    assert fa.runs_fused(problem_of(q, k, v, mask, params), chunked=True, features=m)
    launches = []
    with torch.no_grad(), kernel_launch.watching(launches.append):
        out = impl(q, k, v, mask, features=m, fused=1)
    assert [x.name for x in launches] == ["feature_state", "feature_scan", "feature_chunk"]
    result = _agreement(impl, out, q, k, v, mask, features=m)
    assert out.dtype == dtype and result["agree"], result


@pytest.mark.parametrize("shape", [(1, 2, 2, 33, 50, 16), (2, 4, 2, 50, 33, 59),
                                   (1, 1, 1, 1, 70, 32)], ids=lambda s: "x".join(map(str, s)))
def test_causal_favor_chunk_kernel_with_unequal_lengths(shape):
    """n_q != n_k, bottom-right, as the φ = elu + 1 kernel: n_q < n_k (one query: a decode
    step), n_q > n_k (the first n_q - n_k queries keep no key: zeros)."""
    q, k, v = _inputs(shape, torch.float32, seed=shape[3] * shape[4])
    mask, impl = MaskSpec(causal=True, seed=2), registry.get("performer")
    with torch.no_grad():
        out = impl(q, k, v, mask, features=40, fused=1)
    result = _agreement(impl, out, q, k, v, mask, features=40)
    assert result["agree"], result
    if shape[3] > shape[4]:
        assert (out[:, :, : shape[3] - shape[4]] == 0).all()


def test_causal_favor_stabiliser_is_exact_across_splits():
    """Every key along a row of W: key logits above 88.7 (exp overflows fp32 unshifted), the
    first splits' maxima 30 below the later ones'. The prefix rescales every
    split to the head's largest key logit and the chunks shift their keys by it, so the output
    is the float64 definition under its global key maximum."""
    d, m, n, s = 256, 64, 97, 1.0 / 16
    mask = MaskSpec(causal=True, seed=3)
    q, k, v = _inputs((1, 1, 1, n, n, d), torch.float32, seed=9)
    w = orthogonal_features(m, d, mask.seed) * math.sqrt(s)  # W' (m, D) float64
    # key j = a_j·W'_f/|W'_f| (f = j mod m; W's m < D rows are orthogonal): its largest logit
    # a|W'_f| − s·a²/2 is 70 for the first 48 keys, 100 after
    target = torch.where(torch.arange(n) < 48, 70.0, 100.0).double()
    rows = w[torch.arange(n) % m]
    length = rows.norm(dim=-1)
    a = (length - (length**2 - 2 * s * target).sqrt()) / s
    k[0, 0] = (rows / length[:, None] * a[:, None]).to(k)
    lk = k[0, 0].double().cpu() @ w.T - s * (k[0, 0].double().cpu() ** 2).sum(-1)[:, None] / 2
    top = lk.amax(-1)
    assert top.max() > 88.8 and top.max() - top[:48].max() > 20
    assert top.max() - top.min() < 60  # no key feature underflows fp32 under the global shift
    assert fa.key_splits(1, n, m, fa.tiles(d, True))[0] >= 3
    impl = registry.get("performer")
    with torch.no_grad():
        out = impl(q, k, v, mask, features=m, scale=s, fused=1)
    assert torch.isfinite(out).all()
    result = _agreement(impl, out, q, k, v, mask, scale=s, features=m)
    assert result["agree"], result


def test_causal_favor_launches_do_not_grow_with_n():
    """Three launches and the same host ops at n = 64 and n = 4096 (recorded, not run)."""
    counts, impl = [], registry.get("performer")
    with torch.no_grad():  # W made once (it depends on the features and D, not on n): run
        # at the small n only, since the interpreter would take ~40 s to run n = 4096
        impl(*_inputs((1, 4, 2, 64, 64, 32), torch.float32, seed=0), MaskSpec(causal=True),
             features=64, fused=1)
    for n in (64, 4096):
        q, k, v = _inputs((1, 4, 2, n, n, 32), torch.float32, seed=n)
        launches = []
        with (torch.no_grad(), kernel_launch.watching(launches.append, execute=False),
              OpCount() as ops):
            impl(q, k, v, MaskSpec(causal=True), features=64, fused=1)
        counts.append(([x.name for x in launches], ops.ops))
    assert counts[0] == counts[1]
    assert counts[0][0] == ["feature_state", "feature_scan", "feature_chunk"]


def test_causal_favor_workspace_formula_is_the_measured_peak():
    """Peak bytes above the inputs and output = the causal FAVOR+ workspace formula (the
    splits' states, sums and maxima, the heads' largest logits), the registered memory model of
    a causal call with fused = 1."""
    q, k, v = _inputs((2, 2, 1, 97, 97, 19), torch.float32, seed=1)  # odd, small: interpreted
    impl, mask = registry.get("performer"), MaskSpec(causal=True)
    problem = problem_of(q, k, v, mask, (("features", 24), ("fused", 1)))
    formula = fa.chunk_workspace_bytes(problem, 24)
    n_split = fa.key_splits(2, 97, 24, fa.tiles(19, True))[0]
    assert impl.cost.memory_model(problem) == formula == 4 * 2 * (n_split * 24 * 21 + 1)
    extra = prepared_peak_beyond_output(impl.name, problem, q, k, v) - formula
    assert extra == 0 or (DEVICE == "cuda" and 0 <= extra < 5 * 512), (extra, formula)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [*SHAPES[:2], (1, 2, 1, 256, 256, 64)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_two_launch_path_is_the_three_launch_path_bit_for_bit(name, shape, dtype):
    """fused = 2: the key pass's last program per (head, feature block) combines the partial
    states in split order, so the output is the three-launch path's, bit for bit, and within
    the agreement rule of the float64 definition; its counters are back at zero after the
    call, so the next call starts as this one did (a counter left set makes a wrong program
    combine: the test below)."""
    q, k, v = _inputs(shape, dtype, seed=sum(shape))
    mask, impl = MaskSpec(seed=5), registry.get(name)
    two = dict(PARAMS[name], fused=2)
    launches = []
    with torch.no_grad():
        three = impl(q, k, v, mask, **PARAMS[name])
        with kernel_launch.watching(launches.append):
            out = impl(q, k, v, mask, **two)
    assert [x.name for x in launches] == ["feature_state", "feature_output"]
    assert torch.equal(out, three)
    assert fa._COUNTERS and all(int(c.count_nonzero()) == 0 for c in fa._COUNTERS.values())
    result = _agreement(impl, out, q, k, v, mask, **PARAMS[name])
    assert result["agree"], result


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # unwritten states
def test_two_launch_counters_are_what_chooses_the_combining_program():
    """A counter left non-zero (a planted fault: as if an earlier call had stopped midway)
    makes the wrong program combine early (over partial states not yet written), and the
    output is off the definition: the test above would see a counter that did not reset."""
    q, k, v = _inputs((1, 2, 2, 161, 161, 16), torch.float32, seed=3)
    impl = registry.get("linear")
    with torch.no_grad():
        impl(q, k, v, MaskSpec(), fused=2)
        for c in fa._COUNTERS.values():
            c.fill_(1)
        out = impl(q, k, v, MaskSpec(), fused=2)
        for c in fa._COUNTERS.values():
            c.zero_()
    assert fa.key_splits(2, 161, 16, fa.tiles(16, False))[0] >= 2
    assert not _agreement(impl, out, q, k, v, MaskSpec())["agree"]


def test_two_launch_launches_do_not_grow_with_n():
    """Two launches and the same host ops at n = 64 and 4096 (recorded, not run)."""
    counts = []
    with torch.no_grad():  # the counters, made once (by heads and feature blocks, not n): one
        # run at the small n (the interpreter would take seconds to run n = 4096)
        registry.get("linear")(*_inputs((1, 4, 4, 64, 64, 32), torch.float32, seed=0),
                               MaskSpec(), fused=2)
    for n in (64, 4096):
        q, k, v = _inputs((1, 4, 4, n, n, 32), torch.float32, seed=n)
        launches = []
        with (torch.no_grad(), kernel_launch.watching(launches.append, execute=False),
              OpCount() as ops):
            registry.get("linear")(q, k, v, MaskSpec(), fused=2)
        counts.append(([x.name for x in launches], ops.ops))
    assert counts[0] == counts[1] and counts[0][0] == ["feature_state", "feature_output"]
