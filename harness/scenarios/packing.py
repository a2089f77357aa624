"""Packed documents: how a point's ``documents`` becomes the lengths of the documents packed into
one sequence of ``seq_len`` tokens (the block-diagonal mask of FlashAttention's ``cu_seqlens``,
xformers' ``BlockDiagonalMask``; :class:`harness.masks.MaskSpec` ``documents``).

A suite writes one of three spellings; rows keep it as written in ``documents`` (a list as its
lengths joined by commas, ``"100,200,212"``) and the lengths in ``document_lengths``:

- ``"uniform:L"``: documents of L tokens, in order; when L does not divide seq_len the last one
  is shorter (seq_len = q·L + r: q documents of L, then one of r when r > 0).
- ``"lognormal:mean=M,sigma=S,seed=K"``: lengths whose mean is M tokens and whose logarithm has
  standard deviation S (sigma defaults to 1, seed to 0), the shape of real packed batches. The
  exact rule: with ``rng = random.Random(K)`` and ``mu = ln(M) - S²/2``, each length is
  ``max(1, round(exp(mu + S · NormalDist().inv_cdf(u))))`` for the next ``u = rng.random()``
  (a ``u`` of exactly 0 is drawn again); lengths are drawn until they reach seq_len, and the
  last one is cut so that they sum to seq_len exactly. ``Random.random()`` is the generator
  Python promises to keep for a seed across versions, and the rest is plain float arithmetic:
  every machine draws the same lengths.
- a list of lengths ``[l1, l2, ...]``: each at least 1, summing to seq_len.

Rows also carry ``document_len`` (:func:`document_len`), the numeric axis that packing claims
fit over: the token-weighted mean document length ``Σ lᵢ² / Σ lᵢ``, the length of the document
an average token is in. It is L for ``uniform:L`` when L divides seq_len, and with it the
pairs a packed mask keeps (no causal, no window) are exactly ``seq_len · document_len`` per
head: the ``Σ lᵢ² = n·l`` of the claim that packing makes attention cost grow with document
length, not sequence length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from functools import lru_cache
from statistics import NormalDist

Documents = str | tuple[int, ...]
KINDS = ("uniform", "lognormal")
LOGNORMAL_KEYS = {"mean": float, "sigma": float, "seed": int}


def parse(value: object) -> Documents:
    """A suite's (or a row's) ``documents`` value checked and normalised: a spec text as written,
    or a tuple of lengths (a list, or the comma-joined lengths of a row). Raises ValueError with
    the problem."""
    if isinstance(value, list | tuple):
        if not value or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            raise ValueError("a list of documents must be their lengths (whole numbers)")
        return tuple(value)
    if not isinstance(value, str):
        raise ValueError("documents are 'uniform:L', 'lognormal:mean=M,sigma=S,seed=K' or a list")
    kind, sep, args = value.partition(":")
    if not sep and value.replace(",", "").isdigit():  # a row's spelling of a list
        return tuple(int(x) for x in value.split(","))
    if kind == "uniform":
        if not args.isdigit() or int(args) < 1:
            raise ValueError("uniform:L needs a document length L >= 1")
    elif kind == "lognormal":
        _lognormal_args(args)
    else:
        raise ValueError(f"unknown documents kind {kind!r} (one of {list(KINDS)} or a list)")
    return value


def text(documents: Documents) -> str:
    """The row spelling of ``documents``: the spec as written, a tuple's lengths comma-joined."""
    return documents if isinstance(documents, str) else ",".join(map(str, documents))


@lru_cache(maxsize=256)
def lengths(documents: Documents, seq_len: int) -> tuple[int, ...]:
    """The lengths ``documents`` packs into ``seq_len`` tokens (a tuple as given: whether it
    sums to seq_len is the mask's check, :meth:`harness.masks.MaskSpec.check_lengths`)."""
    if not isinstance(documents, str):
        return documents
    kind, _, args = documents.partition(":")
    if kind == "uniform":
        size = int(args)
        whole, rest = divmod(seq_len, size)
        return (size,) * whole + ((rest,) if rest else ())
    mean, sigma, seed = _lognormal_args(args)
    return _lognormal(mean, sigma, seed, seq_len)


def nominal_length(documents: Documents) -> float | None:
    """The document length a rule names: L of ``uniform:L``, the mean of ``lognormal``; None for
    documents given as their lengths."""
    if not isinstance(documents, str):
        return None
    kind, _, args = documents.partition(":")
    return float(args) if kind == "uniform" else _lognormal_args(args)[0]


def document_len(lengths: tuple[int, ...]) -> float:
    """The token-weighted mean document length ``Σ lᵢ² / Σ lᵢ`` of realised ``lengths`` (module
    docstring): L for equal documents of L; ``seq_len`` for one document."""
    return sum(x * x for x in lengths) / sum(lengths)


def _lognormal_args(args: str) -> tuple[float, float, int]:
    """(mean, sigma, seed) of ``mean=M,sigma=S,seed=K``; raises ValueError naming the problem."""
    given: dict[str, float | int] = {"sigma": 1.0, "seed": 0}
    for part in filter(None, args.split(",")):
        key, _, raw = part.partition("=")
        kind = LOGNORMAL_KEYS.get(key.strip())
        if kind is None:
            raise ValueError(f"lognormal takes {sorted(LOGNORMAL_KEYS)}, not {key.strip()!r}")
        try:
            given[key.strip()] = kind(raw)
        except ValueError:
            raise ValueError(f"lognormal {key.strip()}={raw!r} is not a number") from None
    if "mean" not in given:
        raise ValueError("lognormal needs mean=M (the mean document length in tokens)")
    mean, sigma, seed = float(given["mean"]), float(given["sigma"]), int(given["seed"])
    if not (math.isfinite(mean) and mean >= 1 and math.isfinite(sigma) and sigma >= 0):
        raise ValueError("lognormal needs a finite mean >= 1 and sigma >= 0")
    if seed < 0:
        raise ValueError("lognormal needs a seed >= 0")
    return mean, sigma, seed


def normal_draws(seed: int) -> Iterator[float]:
    """Standard normal draws, the same on every machine: ``NormalDist().inv_cdf(u)`` of
    ``u = random.Random(seed).random()`` in turn (a ``u`` of exactly 0 is drawn again). The
    lognormal documents here and the decode scenario's lognormal contexts are drawn from it."""
    rng, normal = random.Random(seed), NormalDist()
    while True:
        u = rng.random()
        if u != 0.0:  # inv_cdf(0) is -inf
            yield normal.inv_cdf(u)


def _lognormal(mean: float, sigma: float, seed: int, seq_len: int) -> tuple[int, ...]:
    """The lognormal rule of the module docstring."""
    draws = normal_draws(seed)
    mu = math.log(mean) - sigma * sigma / 2
    out: list[int] = []
    total = 0
    while total < seq_len:
        length = max(1, round(math.exp(mu + sigma * next(draws))))
        length = min(length, seq_len - total)
        out.append(length)
        total += length
    return tuple(out)
