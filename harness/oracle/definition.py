"""What an implementation's output is held to: its definition, evaluated in float64.

An exact attention is held to softmax attention (:mod:`harness.oracle.reference`). An
approximation of it (Performer, Linformer, Nyström, linear attention: a registered
``reference``, :attr:`harness.registry.Implementation.approximate`) is held to its *own*
definition, with the same random features or projections, by the same agreement rule: the bugs
the rule exists for are in the code, not in the method. How far the method is from softmax
attention is measured apart, as ``approx_err`` (:func:`approximation_error`), and never gated.

Every function takes q (B, H, n_q, D), k/v (B, H_kv, n_k, D) and ``rows`` (1-D long query rows,
None = all) and returns (B, H, len(rows) or n_q, D).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from harness.masks import MaskSpec
from harness.oracle.agreement import rel_frobenius
from harness.oracle.reference import naive_attention, reference_attention
from harness.registry import Implementation
from harness.spec import ParamValue

CoreRef = Callable[[Tensor, Tensor, Tensor], Tensor]  # (q, k, v) -> out, the mask bound


@dataclass(frozen=True)
class Definition:
    """The definition a point's core is checked against: softmax attention, or the
    implementation's registered ``reference`` at the point's method parameters."""

    impl: Implementation | None = None
    params: dict[str, ParamValue] = field(default_factory=dict)

    @classmethod
    def of(cls, impl: Implementation | None, params: tuple = ()) -> Definition:
        """The definition of ``impl`` (None: a scenario's own baseline) at ``params`` (the
        point's (name, value) pairs; the declared defaults fill the rest)."""
        if impl is None or not impl.approximate:
            return cls(impl)
        return cls(impl, impl.param_values(dict(params)))

    @property
    def approximate(self) -> bool:
        return self.impl is not None and self.impl.approximate

    def evaluate(
        self, q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None
    ) -> Tensor:
        """The definition in the inputs' own dtype: the naive same-dtype computation whose error
        scales the agreement bound (float64 inputs: the float64 reference itself)."""
        if not self.approximate:
            return naive_attention(q, k, v, mask, rows=rows)
        return self.impl.define(q, k, v, mask, rows=rows, **self.params)

    def float64(
        self, q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None
    ) -> Tensor:
        """The definition in float64 (differentiable: autograd reaches q, k, v)."""
        if not self.approximate:
            return reference_attention(q, k, v, mask, rows=rows)
        return self.evaluate(q.double(), k.double(), v.double(), mask, rows)

    def core64(self, mask: MaskSpec) -> CoreRef:
        """The float64 core with ``mask`` bound, for a float64 copy of a block or decoder."""
        return lambda q, k, v: self.float64(q, k, v, mask)


def approximation_error(
    out: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None
) -> float:
    """``approx_err``: the relative Frobenius error of ``out`` (the output at ``rows``) against
    exact softmax attention with the same mask, in float64, on the same rows."""
    return rel_frobenius(out, reference_attention(q, k, v, mask, rows=rows))
