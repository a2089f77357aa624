"""docs/masks.md's convention table, checked: each outside definition, written here from its
source's documented rule (not its code), against ``dense_mask`` at odd lengths; and every
implementation that declares documents, a prefix or global positions against attention-gym's
document, prefix-LM and global-window definitions in float64 (float32 where it declares no
float64).

Outside definitions are functions of broadcast index tensors ``(q, kv) -> bool``, as
attention-gym's ``mask_mod``s are.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from harness import registry
from harness.masks import MaskSpec, dense_mask
from harness.oracle.agreement import output_agreement
from harness.oracle.reference import naive_attention
from harness.spec import Problem
from tests.conftest import make_qkv

Rule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
DOC = Path(__file__).resolve().parents[2] / "docs" / "masks.md"


def hf_sliding_window(w: int) -> Rule:  # HF masking_utils: causal and kv > q - W
    return lambda q, kv: (kv <= q) & (kv > q - w)


def mistral_reference(w: int) -> Rule:  # one_file_ref: triu(diagonal=-W) of the causal mask
    return lambda q, kv: (kv <= q) & (kv >= q - w)


def xformers_local(w: int) -> Rule:  # LocalAttention: i - W < j <= i
    return lambda q, kv: (kv <= q) & (q - kv < w)


def hf_longformer(w: int) -> Rule:  # one-sided window attention_window // 2
    return lambda q, kv: (q - kv).abs() <= w // 2


def allenai_longformer(w: int) -> Rule:  # one-sided w
    return lambda q, kv: (q - kv).abs() <= w


def gym_sliding_window(w: int) -> Rule:  # q - kv <= W, and causal
    return lambda q, kv: (q - kv <= w) & (q >= kv)


def gym_dilated(w: int, d: int) -> Rule:  # |q - kv| <= W and |q - kv| % d == 0
    return lambda q, kv: ((q - kv).abs() <= w) & ((q - kv).abs() % d == 0)


def gym_prefix_lm(prefix: int) -> Rule:  # kv < P or causal
    return lambda q, kv: (kv < prefix) | (q >= kv)


def gym_global_window(w: int, is_global: torch.Tensor) -> Rule:  # |q-kv| <= W | g[q] | g[kv]
    return lambda q, kv: ((q - kv).abs() <= w) | is_global[q] | is_global[kv]


def gym_documents(inner: Rule, lengths: tuple[int, ...]) -> Rule:
    """The wrapped rule on document-local indices, within one document only."""
    starts = torch.tensor([0, *lengths]).cumsum(0)[:-1]
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def rule(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        same = doc[q] == doc[kv]
        return same & inner(q - starts[doc[q]], kv - starts[doc[kv]])

    return rule


def hf_bigbird(b: int, n: int) -> Rule:
    """Block level: the first and last query blocks see every key, every query sees the first
    and last key blocks, and each query block its 3 sliding neighbours (no random blocks)."""
    last = (n - 1) // b

    def rule(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        qb, kb = q // b, kv // b
        edge = (qb == 0) | (qb == last) | (kb == 0) | (kb == last)
        return edge | ((qb - kb).abs() <= 1)

    return rule


def _grid(rule: Rule, n: int) -> torch.Tensor:
    idx = torch.arange(n)
    return rule(idx[:, None], idx[None, :]).expand(n, n)


def _is_global(positions: tuple[int, ...]) -> torch.Tensor:
    return torch.isin(torch.arange(N), torch.tensor(positions))


N = 97  # odd lengths: windows and blocks never divide them (BigBird: its own lengths)
DOCS = (30, 1, 47, 19)  # sum 97
CONVENTIONS: dict[str, list[tuple[Rule, MaskSpec]]] = {
    "HF transformers `sliding_window`": [
        (hf_sliding_window(w), MaskSpec(causal=True, window=(w - 1, 0))) for w in (1, 4, 17)
    ],
    "Mistral reference `one_file_ref`": [
        (mistral_reference(w), MaskSpec(causal=True, window=(w, 0))) for w in (1, 4, 17)
    ],
    "xformers / mistral-inference local attention": [
        (xformers_local(w), MaskSpec(causal=True, window=(w - 1, 0))) for w in (1, 4, 17)
    ],
    "HF Longformer `attention_window`": [
        (hf_longformer(w), MaskSpec(window=(w // 2, w // 2))) for w in (2, 8, 32)
    ],
    "allenai Longformer": [(allenai_longformer(w), MaskSpec(window=(w, w))) for w in (1, 8, 31)],
    "attention-gym `generate_sliding_window`": [
        (gym_sliding_window(w), MaskSpec(causal=True, window=(w, 0))) for w in (0, 4, 17)
    ],
    "attention-gym `generate_dilated_sliding_window`": [
        (gym_dilated(w, d), MaskSpec(window=(w // d, w // d), dilation=d))
        for w, d in ((4, 2), (9, 3), (10, 4), (7, 1))
    ],
    "attention-gym `generate_prefix_lm_mask`": [
        (gym_prefix_lm(p), MaskSpec(causal=True, prefix_len=p)) for p in (1, 13, 96)
    ],
    "attention-gym `generate_global_sliding_window`": [
        (gym_global_window(3, _is_global(ps)), MaskSpec(window=(3, 3), global_tokens=ps))
        for ps in ((0,), (0, 8), (5, 50, 96))
    ],
    "attention-gym `generate_doc_mask_mod`": [
        (gym_documents(gym_prefix_lm(5), DOCS), MaskSpec(causal=True, prefix_len=5,
                                                          documents=DOCS)),
        (gym_documents(lambda q, kv: q >= kv, DOCS), MaskSpec(causal=True, documents=DOCS)),
        (gym_documents(lambda q, kv: q == q, DOCS), MaskSpec(documents=DOCS)),
        (gym_documents(gym_sliding_window(4), DOCS),
         MaskSpec(causal=True, window=(4, 0), documents=DOCS)),
    ],
    "FlashAttention `flash_attn_varlen_func`": [
        (gym_documents(lambda q, kv: (kv <= q) & (kv >= q - 6), DOCS),
         MaskSpec(causal=True, window=(6, 0), documents=DOCS)),
    ],
    "xformers `BlockDiagonalMask` / `BlockDiagonalCausalMask`": [
        (gym_documents(lambda q, kv: q == q, DOCS), MaskSpec(documents=DOCS)),
        (gym_documents(lambda q, kv: q >= kv, DOCS), MaskSpec(causal=True, documents=DOCS)),
    ],
    "HF BigBird `block_sparse`": [
        (hf_bigbird(b, n), MaskSpec(block_size=b, window=(1, 1),
                                    global_tokens=(*range(b), *range((n - 1) // b * b, n))))
        for b, n in ((8, 96), (16, 97), (4, 97))
    ],
}


def _table_sources() -> list[str]:
    """The first column of docs/masks.md's convention table."""
    text = DOC.read_text()
    table = text.split("## Conventions elsewhere")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return [re.split(r"\s*\|\s*", row.strip("| "))[0] for row in rows[1:]]


def test_every_row_of_the_doc_table_is_checked():
    assert sorted(_table_sources()) == sorted(CONVENTIONS)


@pytest.mark.parametrize("source", list(CONVENTIONS))
def test_the_table_reproduces_the_outside_definition(source):
    for rule, spec in CONVENTIONS[source]:
        n = _length(spec)
        assert torch.equal(dense_mask(spec, n, n), _grid(rule, n)), (source, spec.describe())


def _length(spec: MaskSpec) -> int:
    """N, or a BigBird case's own length (its last global position + 1)."""
    return spec.global_tokens[-1] + 1 if spec.block_size else N


# --- every implementation that declares the new masks, against attention-gym, in float64 ------


def _packed_prefix_global_window() -> tuple[Rule, MaskSpec]:
    """attention-gym's mask_mods composed as its or/and_masks would: a document mask around
    ((global window and causal) or the prefix square), global positions 0 and 5 of each
    document. (The prefix square is prefix_lm's ``kv < P`` for the prefix queries: alone with
    causality the two are the same mask; with a window attnbench keeps the prefix a region.)"""
    window = gym_global_window(3, torch.isin(torch.arange(N), torch.tensor((0, 5))))

    def inner(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (window(q, kv) & (q >= kv)) | ((kv < 4) & (q < 4))

    spec = MaskSpec(causal=True, window=(3, 3), global_tokens=(0, 5), prefix_len=4,
                    documents=DOCS)
    return gym_documents(inner, DOCS), spec


COMPILED_FAMILIES = {"flex"}  # a compile per mask: the combined and BigBird cases only


def _outside_cases():
    cases = {
        "documents-causal": CONVENTIONS["attention-gym `generate_doc_mask_mod`"][1],
        "documents-prefix": CONVENTIONS["attention-gym `generate_doc_mask_mod`"][0],
        "documents-window": CONVENTIONS["attention-gym `generate_doc_mask_mod`"][3],
        "prefix-lm": CONVENTIONS["attention-gym `generate_prefix_lm_mask`"][1],
        "global-window": CONVENTIONS["attention-gym `generate_global_sliding_window`"][2],
        "packed-prefix-global-window": _packed_prefix_global_window(),
        "hf-bigbird": CONVENTIONS["HF BigBird `block_sparse`"][1],
    }
    for impl in registry.all_implementations():
        for case_id, (rule, spec) in cases.items():
            if impl.family in COMPILED_FAMILIES and case_id not in (
                "packed-prefix-global-window", "hf-bigbird"
            ):
                continue
            new = spec.features & {"documents", "prefix", "global_positions"}
            if new and spec.features <= impl.caps.mask_features:
                yield pytest.param(impl.name, rule, spec, id=f"{impl.name}-{case_id}")


@pytest.mark.parametrize("name,rule,spec", list(_outside_cases()))
def test_implementations_agree_with_the_outside_definitions(name, rule, spec):
    """softmax(QKᵀ/√D) V under the outside rule, float64, against the implementation."""
    impl = registry.get(name)
    n = _length(spec)
    dtype = torch.float64 if torch.float64 in impl.caps.dtypes else torch.float32
    reasons = impl.not_supported(Problem(1, 2, n, n, 59, dtype=dtype, mask=spec))
    if reasons:
        pytest.skip("; ".join(reasons))
    q, k, v = make_qkv(1, 2, n, n, 59, dtype=dtype, seed=21)
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(59)
    scores = scores.masked_fill(~_grid(rule, n), float("-inf"))
    want = torch.softmax(scores, -1).nan_to_num(0.0) @ v.double()
    out = impl(q, k, v, spec)
    if dtype == torch.float64:
        assert float((out - want).abs().max()) <= 1e-10
    else:
        assert output_agreement(out, want, dtype, naive=naive_attention(q, k, v, spec))["agree"]
