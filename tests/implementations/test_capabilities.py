"""Every registered implementation's declared ``Capabilities`` agree with what its call does.

A declared mask feature or dtype never makes a valid call raise ``NotSupportedError``; an
undeclared one always does, and the message names it. The correctness matrix
(``test_matrix.py``) holds accepted calls to the float64 definition but skips a case the
implementation refuses, so a declaration its call does not honour would go unseen there; this
file is that check. Small shapes (n = 40, D = 16), forward only; FlexAttention (a kernel
compile per mask on CPU) is checked at the support check its call runs first, and the matrix
runs its accepted masks.

Two rules ``Capabilities`` cannot state are named here: BigBird needs ``block_size`` (its
other features are parts of a block layout), and a declared dtype may be refused on one
device by a reason that names that device (FlexAttention has no CPU float16).
"""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.masks import MaskSpec
from harness.registry import Implementation, NotSupportedError
from harness.spec import FLOAT_DTYPES, MASK_FEATURES, Problem
from tests.conftest import make_qkv
from tests.implementations.test_plugin_features import MASKS as PLUGIN_MASKS

N, N_Q, D = 40, 24, 16  # square and unequal (bottom-right) lengths
BLOCK = 8
POOL = {  # valid masks at n = 40: every feature alone where it can be, and mixed
    "dense": MaskSpec(),
    "causal": MaskSpec(causal=True),
    "window": MaskSpec(window=(5, 3)),
    "causal-window": MaskSpec(causal=True, window=(9, 0)),
    "dilation": MaskSpec(window=(4, 2), dilation=3),
    "global-only": MaskSpec(global_tokens=3),
    "global": MaskSpec(causal=True, window=(6, 0), global_tokens=5),
    "global-positions": MaskSpec(window=(3, 1), dilation=2, global_tokens=(0, 1, 20, N - 1)),
    "prefix": MaskSpec(causal=True, prefix_len=12),
    "prefix-window-global": MaskSpec(causal=True, window=(7, 0), prefix_len=12,
                                     global_tokens=(3, N - 2)),
    "prefix-dilation": MaskSpec(causal=True, window=(6, 0), dilation=2, prefix_len=6),
    "block-sparse": MaskSpec(causal=True, window=(1, 0), block_size=BLOCK, random_blocks=2,
                             seed=3),
    "block-sparse-first-last": MaskSpec(window=(1, 1), block_size=BLOCK, random_blocks=1,
                                        global_tokens=(*range(BLOCK), *range(N - BLOCK, N))),
    "documents": MaskSpec(documents=(14, 1, 25)),
    "documents-causal": MaskSpec(causal=True, documents=(14, 1, 25)),
    "documents-window-prefix": MaskSpec(causal=True, window=(5, 0), prefix_len=4,
                                        documents=(14, 1, 25)),
    "documents-dilated-global": MaskSpec(window=(2, 2), dilation=2, global_tokens=1,
                                         documents=(10,) * 4),
    "documents-global-positions": MaskSpec(causal=True, window=(3, 0), global_tokens=(0, 7),
                                           documents=(14, 1, 25)),
    # plug-in features (tests/implementations/test_plugin_features.py checks their answers)
    **{f"plugin-{form}": mask for form, mask in PLUGIN_MASKS.items()},
}
REQUIRES = {"bigbird": frozenset({"block_sparse"})}  # refused without these features
COMPILED_FAMILIES = {"flex"}  # each distinct mask is a kernel compile: support check only


def _impls() -> list[str]:
    return [impl.name for impl in registry.all_implementations()]


def _params(impl: Implementation) -> dict:
    """Each declared method parameter at a size that fits n = 40 (a projection of 16 rows)."""
    return {name: min(p.default, 16) for name, p in impl.params.items()}


def _shapes(impl: Implementation) -> list[tuple[int, int]]:
    return [(N, N), (N_Q, N)] if impl.caps.unequal_lengths else [(N, N)]


def _fits(mask: MaskSpec, n_q: int, n_k: int) -> bool:
    return mask.documents is None or n_q == n_k


def _problem(impl: Implementation, mask: MaskSpec, n_q: int, n_k: int, dtype=torch.float32,
             device: str = "cpu") -> Problem:
    return Problem(1, 2, n_q, n_k, D, dtype=dtype, device=device, mask=mask,
                   params=tuple(sorted(_params(impl).items())))


def _accepted_masks(impl: Implementation) -> dict[str, MaskSpec]:
    """The pool's masks within the declared features (and with what the implementation needs)."""
    need = REQUIRES.get(impl.name, frozenset())
    return {k: m for k, m in POOL.items()
            if m.capabilities <= impl.caps.mask_features and need <= m.features}


def _runnable_here(impl: Implementation) -> Implementation:
    if "cpu" not in impl.caps.devices:
        pytest.skip(f"{impl.name} declares {sorted(impl.caps.devices)} only")
    reason = impl.unavailable_reason("cpu")
    if reason:
        pytest.skip(f"{impl.name} is unavailable here: {reason}")
    return impl


def _call(impl: Implementation, mask: MaskSpec, n_q: int, n_k: int, dtype=torch.float32):
    q, k, v = make_qkv(1, 2, n_q, n_k, D, dtype=dtype, seed=n_q + 3 * n_k)
    with torch.no_grad():
        return q, impl(q, k, v, mask, **_params(impl))


def test_the_pool_uses_every_mask_feature():
    assert set().union(*(m.capabilities for m in POOL.values())) == MASK_FEATURES


@pytest.mark.parametrize("name", _impls())
def test_every_declared_mask_feature_is_accepted(name):
    """Every valid mask within the declared features runs (float32 or the first declared
    dtype), and each declared feature is among them."""
    impl = _runnable_here(registry.get(name))
    dtype = torch.float32 if torch.float32 in impl.caps.dtypes else min(impl.caps.dtypes, key=str)
    masks = _accepted_masks(impl)
    assert impl.caps.mask_features <= set().union(*(m.capabilities for m in masks.values()))
    for mask_id, mask in masks.items():
        for n_q, n_k in _shapes(impl):
            if not _fits(mask, n_q, n_k):
                continue
            if impl.family in COMPILED_FAMILIES:
                reasons = impl.not_supported(_problem(impl, mask, n_q, n_k, dtype))
                assert reasons == [], (mask_id, n_q, n_k, reasons)
                continue
            try:
                q, out = _call(impl, mask, n_q, n_k, dtype)
            except NotSupportedError as exc:
                pytest.fail(f"{name} declares {sorted(mask.features)} but refuses {mask_id} "
                            f"at {n_q}x{n_k}: {exc}")
            assert out.shape == q.shape and out.dtype == dtype and bool(out.isfinite().all())


@pytest.mark.parametrize("name", _impls())
def test_every_undeclared_mask_feature_is_refused_by_name(name):
    impl = _runnable_here(registry.get(name))
    for mask_id, mask in POOL.items():
        needs = mask.plugin_needs  # a plug-in feature is refused by its name, for its need
        missing = sorted(f for f in mask.features if needs.get(f, f) not in impl.caps.mask_features)
        if not missing:
            continue
        with pytest.raises(NotSupportedError) as caught:
            _call(impl, mask, N, N)
        for feature in missing:
            assert f"'{feature}'" in str(caught.value), (mask_id, str(caught.value))


@pytest.mark.parametrize("name", _impls())
def test_declared_dtypes_are_accepted_and_others_refused_by_name(name):
    impl = _runnable_here(registry.get(name))
    mask = next(iter(_accepted_masks(impl).values()))
    for dtype in sorted(FLOAT_DTYPES, key=str):
        dtype_name = str(dtype).removeprefix("torch.")
        if dtype not in impl.caps.dtypes:
            with pytest.raises(NotSupportedError, match=f"dtype {dtype_name}"):
                _call(impl, mask, N, N, dtype)
            continue
        reasons = impl.not_supported(_problem(impl, mask, N, N, dtype))
        if reasons:  # a declared dtype this device lacks: only a reason that says so
            assert all("cpu" in r.lower() for r in reasons), (dtype_name, reasons)
            continue
        if impl.family not in COMPILED_FAMILIES:
            q, out = _call(impl, mask, N, N, dtype)
            assert out.shape == q.shape and out.dtype == dtype and bool(out.isfinite().all())


@pytest.mark.parametrize("name", _impls())
def test_declared_mask_features_are_accepted_for_cuda(name):
    """The support check of a CUDA call, made here without a GPU (implementations that need
    no probe of the device: the fused Triton path's rules among them). Every declared mask is
    accepted: no combination is left to the CPU."""
    impl = registry.get(name)
    if "cuda" not in impl.caps.devices or impl.unavailable_reason("cuda"):
        pytest.skip(f"{name}: its CUDA support check needs the device")
    dtype = torch.bfloat16 if torch.bfloat16 in impl.caps.dtypes else min(impl.caps.dtypes,
                                                                          key=str)
    for mask_id, mask in _accepted_masks(impl).items():
        for n_q, n_k in _shapes(impl):
            if not _fits(mask, n_q, n_k):
                continue
            reasons = impl.not_supported(_problem(impl, mask, n_q, n_k, dtype, "cuda"))
            assert reasons == [], (mask_id, n_q, n_k, reasons)


def test_the_named_rules_hold():
    """``REQUIRES`` is real: BigBird refuses a mask without a block layout, naming it."""
    q, k, v = make_qkv(1, 2, N, N, D, seed=1)
    with pytest.raises(NotSupportedError, match="block_size"):
        registry.get("bigbird")(q, k, v, MaskSpec(causal=True))
