"""``flex-local``, ``flex-dilated``, ``flex-blocksparse``: the same patterns via FlexAttention.

``torch.nn.attention.flex_attention`` only skips work when compiled: eager FlexAttention
materializes the n² scores. So :func:`_prepare` builds the block mask and the compiled call
outside the timed region; the first call's compilation (seconds) is the runner's ``first_call_s``.
The mask mods and block masks (specialized on the spec's numbers; packed documents, prefix and
global positions included) are :mod:`implementations._flex_masks`.

Traps handled here:
- every distinct spec compiles its own kernel (the numbers are constants), and past dynamo's
  ``recompile_limit`` (8 by default) dynamo silently falls back to eager, i.e. back to O(n²).
  We raise the limits and make hitting them an error (``fail_on_recompile_limit_hit``): a
  point then fails loudly instead of running eager.
- ``create_block_mask`` evaluates the mask on the full n_q × n_k grid. We build the
  :class:`BlockMask` from the block plan instead (:mod:`harness.block_plan`: exact per-block
  pair counts of the candidate blocks), which also gives the executed pairs.

FlexAttention has no CPU backward (torch 2.13): backward points on CPU say so and are skipped.

``flex-local``'s paged form (the decode scenario's paged and ragged steps) is FlexAttention with
PyTorch's own paged block mask, :mod:`implementations._flex_paged`.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from functools import lru_cache

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import FLOAT_DTYPES, AttnFn, Capabilities, Cost, Paged, Problem
from implementations._flex_masks import (  # block_counts: the public name benchmarks read
    BLOCK,
    block_counts,  # noqa: F401
    build_block_mask,
    flex_plan,
)
from implementations._flex_paged import flex_paged

RECOMPILE_LIMIT = 1024  # distinct (spec, shape) kernels one process may compile
DTYPES = FLOAT_DTYPES - {torch.float64}  # no float64 kernels


def dynamo_unsupported_reason() -> str | None:
    """Why torch.compile cannot run on this interpreter (None: it can), without importing
    ``torch._dynamo`` (0.85 s here, 3.8 s of `attnbench list` on a cold H100 machine): torch's
    own rule (``torch._dynamo.eval_frame.check_if_dynamo_supported``, torch 2.11-2.13), which a
    test holds equal to ``torch._dynamo.is_dynamo_supported()`` on the interpreter it runs on."""
    if sys.version_info >= (3, 15):
        major, minor = sys.version_info[:2]
        return f"torch.compile (dynamo) does not support Python {major}.{minor}"
    if sysconfig.get_config_var("Py_GIL_DISABLED") == 1 and sys.version_info < (3, 13, 3):
        return "torch.compile (dynamo) needs Python 3.13.3+ when built without the GIL"
    return None


def _reasons(p: Problem) -> list[str]:
    out = []
    if p.device_type == "cpu":
        if p.backward:
            out.append("FlexAttention has no backward on CPU")
        if shutil.which("g++") is None and shutil.which("c++") is None:
            out.append("no C++ compiler for inductor's CPU code")
        if p.dtype == torch.float16:
            out.append("FlexAttention on CPU supports float32/bfloat16, not float16")
    return out


def raise_recompile_limits(limit: int = RECOMPILE_LIMIT) -> None:
    """Past dynamo's recompile limit flex silently runs eager (O(n²)): lift the limits, and
    make reaching them an error rather than a silent fallback."""
    cfg = torch._dynamo.config
    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), limit))
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


@lru_cache(maxsize=1)
def _compiled_flex():
    raise_recompile_limits()
    from torch.nn.attention.flex_attention import flex_attention  # pulls in torch._dynamo

    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=16)
def _cached_block_mask(spec: MaskSpec, n_q: int, n_k: int, device: str):
    return build_block_mask(spec, n_q, n_k, device)


def _prepare(problem: Problem) -> AttnFn:
    """Block mask and compiled handle, both outside the timed call."""
    block_mask = _cached_block_mask(problem.mask, problem.n_q, problem.n_k, problem.device)
    flex = _compiled_flex()
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask)


def flex_pattern(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D), compiled FlexAttention."""
    block_mask = _cached_block_mask(mask, q.shape[-2], k.shape[-2], str(q.device))
    return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale)


def _executed(p: Problem) -> int:
    return flex_plan(p.mask, p.n_q, p.n_k).executed_pairs


def _workspace(p: Problem) -> int:
    """Compiled flex keeps one (BLOCK, BLOCK) score tile per thread plus O(n) row state; the
    block mask's index tensors are O((n/128)²) int32."""
    n_qb, n_kb = -(-p.n_q // BLOCK), -(-p.n_k // BLOCK)
    return 4 * (4 * BLOCK * BLOCK * 16 + 4 * n_qb * n_kb + 2 * p.batch * p.heads * p.n_q)


_GLOBAL = {"global", "global_positions"}
_BAND = {"causal", "window", "documents", "prefix", "predicate"} | _GLOBAL
_VARIANTS = {
    "flex-local": (_BAND, "sliding window (+ global tokens, prefix, packed documents)"),
    "flex-dilated": (_BAND | {"dilation"}, "dilated sliding window"),
    "flex-blocksparse": ({"causal", "window", "block_sparse"} | _GLOBAL, "BigBird block layout"),
}


def paged_flex(
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """Compiled FlexAttention over a paged pool (:data:`harness.spec.PagedFn`)."""
    return flex_paged(q, k_pages, v_pages, block_table, context_lens, scale, flex=_compiled_flex())


PAGED = Paged(
    paged_flex,
    availability=dynamo_unsupported_reason,
    caps=Capabilities(dtypes=DTYPES, mask_features={"causal"}, grouped_kv=True),
)

for _name, (_features, _what) in _VARIANTS.items():
    register(
        _name,
        family="flex",
        caps=Capabilities(dtypes=DTYPES, mask_features=_features),
        cost=Cost(
            time_exponent=1, memory_exponent=1, memory_model=_workspace, executed_pairs=_executed
        ),
        description=f"FlexAttention under torch.compile, 128x128 block skipping: {_what}",
        availability=dynamo_unsupported_reason,
        extra_reasons=_reasons,
        prepare=_prepare,
        paged=PAGED if _name == "flex-local" else None,
    )(flex_pattern)
