"""``linear``: the linear transformer (Katharopoulos et al. 2020, "Transformers are RNNs").

    φ(x) = elu(x) + 1 elementwise,  out_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i),
    S_i = Σ_{j ∈ K(i)} φ(k_j) v_jᵀ,  z_i = Σ_{j ∈ K(i)} φ(k_j)

with no 1/√D scaling and no epsilon (φ > 0, so the normaliser is positive whenever a key is
kept). K(i) is every key, or the causal prefix ``j <= i + n_k - n_q`` (bottom-right). Not
causal: O(n·D²) by associativity; causal: the chunkwise-parallel form, every chunk of C
positions at once with the D×(D + 1) state before each chunk from one cumulative sum (see
:mod:`implementations._feature_maps`); memory O(n·D) per head, in segments whose size the device
decides (``segment_bytes``). Its recurrent form
(:class:`LinearState`) decodes one token in O(D²), whatever the context length.

On CUDA, non-causal forward calls run three fused Triton launches instead (``fused``,
:mod:`implementations._kernels.triton.feature_attention`): q, k, v read once, no fp32 copies.
Causal forward calls have the fused chunkwise kernel too
(:mod:`implementations._kernels.triton.linear_chunk`, three launches, the state in fp32
registers); ``fused`` = 1 forces it, the default keeps PyTorch until a GPU measures it.

Not an approximation of softmax attention but a different attention: the agreement check holds
it to its own float64 definition (:func:`linear_reference`); its distance from softmax attention
is the measured ``approx_err``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import problem_of, register
from harness.spec import FLOAT_DTYPES, Capabilities, Cost, Problem, Recurrence
from implementations._feature_maps import (
    FeatureState,
    check_inputs,
    compute_dtype,
    feature_state_attention,
    state_dims,
)
from implementations._feature_maps_spec import (
    EXECUTION,
    FeatureCosts,
    feature_definition,
    kernel_flops,
)
from implementations._kernels.triton.feature_attention import (
    chunk_attention,
    feature_attention,
    takes_fused,
)


def elu_features(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 in the compute dtype: (…, D) -> (…, D), every entry > 0."""
    return F.elu(x.to(compute_dtype(x.dtype))).add_(1.0)


class LinearState(FeatureState):
    """The linear transformer's recurrent state: ``[S | z]`` (B·H_kv, D, Dv + 1)."""

    def __init__(
        self, problem: Problem, chunk_size: int = 64, segment_bytes: int = 0, fused: int = -1
    ):
        """``fused`` is accepted with the call's parameters: a recurrent state runs PyTorch."""
        p = problem
        super().__init__(*state_dims(p, p.head_dim), chunk_size, segment_bytes)
        # elu runs on a float32 copy of half inputs
        self.map_temps = 0 if p.dtype == self.dtype else p.head_dim

    def query_features(self, q: Tensor) -> Tensor:
        return elu_features(q)

    def key_features(self, k: Tensor) -> Tensor:
        return elu_features(k)


def no_scale(scale: float | None) -> None:
    """Refuse a softmax scale: φ(q)ᵀφ(k) has none (a silent one would change the kernel)."""
    if scale is not None:
        raise ValueError("linear attention has no softmax scale (φ(q)ᵀφ(k) is unscaled)")


def linear_reference(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None,
                     **params: object) -> Tensor:
    """The definition in the inputs' dtype (float64 inputs: the float64 reference), O(n²):
    weights φ(q_i)ᵀφ(k_j) over the kept pairs, normalised; ``rows`` limits the output to those
    rows. Every parameter (``chunk_size``, ``segment_bytes``, ``fused``) says how a call runs,
    not what it computes: none is read."""
    return elu_definition(q, k, v, mask, rows)


def elu_definition(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None,
                   eps: float = 0.0) -> Tensor:
    """Feature-space attention with φ = elu + 1 written out, O(n²), in the inputs' dtype:
    ``linear``'s definition (eps = 0) and ``fla-linear``'s (1e-10 added to the normaliser)."""
    return feature_definition(F.elu(q) + 1, F.elu(k) + 1, v, mask, rows, eps=eps)


def elu_flops(p: Problem) -> int:
    """φ = elu + 1 keeps D features: the feature-space attention's FLOPs at F = D."""
    return kernel_flops(p, p.head_dim)


def _map_temps(p: Problem) -> int:
    """φ(x) = elu(x) + 1 is computed in place after elu; half inputs are copied to float32
    first (D elements per row beside the features)."""
    return p.head_dim if p.dtype != compute_dtype(p.dtype) else 0


COSTS = FeatureCosts(features=lambda p: p.head_dim, map_temps=_map_temps)


@register(
    "linear",
    family="linear",
    caps=Capabilities(dtypes=FLOAT_DTYPES, mask_features={"causal"}, grouped_kv=True),
    cost=Cost(
        time_exponent=1,
        memory_exponent=1,
        memory_model=COSTS.workspace,
        flops=elu_flops,
    ),
    description="linear transformer, φ = elu + 1: O(n·D²); causal chunk by chunk with a state",
    params={**EXECUTION},
    extra_reasons=COSTS.reasons,
    reference=linear_reference,
    recurrence=Recurrence(new_state=LinearState, state_bytes=COSTS.state_bytes),
)
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None,
    chunk_size: int = 64, segment_bytes: int = 0, fused: int = -1,
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D). Non-causal forward calls
    on CUDA run the fused Triton kernels (``fused``: :data:`FUSED`; ``fused`` = 1 also causal
    ones, the chunk kernel), the rest the PyTorch path."""
    no_scale(scale)
    check_inputs(q, k, v)
    if takes_fused(int(fused), q, k, v, mask.causal, chunked=True):
        if mask.causal:
            return chunk_attention(q, k, v)
        return feature_attention(q, k, v, combine=int(fused) == 2)
    state = LinearState(problem_of(q, k, v, mask), chunk_size, segment_bytes)
    return feature_state_attention(state, q, k, v, mask.causal)
