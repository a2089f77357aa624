"""The mask specification: fields, validation and the features a spec uses.

What the fields mean (the rules) is :mod:`harness.masks`, which re-exports :class:`MaskSpec`;
import it from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from harness.mask_features import MaskError
from harness.mask_features.predicate import PredicateFeature
from harness.mask_features.visible_runs import RunsFeature
from harness.mask_features.window import side
from harness.paircount import Runs, positions_to_runs

Side = int | None
Globals = int | tuple[int, ...]


@dataclass(frozen=True)
class MaskSpec:
    """Which (query, key) pairs attend; :mod:`harness.masks` states the exact rules."""

    causal: bool = False
    window: tuple[Side, Side] | None = None
    dilation: int = 1
    global_tokens: Globals = 0
    block_size: int | None = None
    random_blocks: int = 0
    seed: int = 0
    documents: tuple[int, ...] | None = None
    prefix_len: int = 0
    # plug-in features (harness.mask_features: RunsFeature, PredicateFeature), not a result column
    extra: tuple[RunsFeature | PredicateFeature, ...] = field(
        default=(), metadata={"column": False}
    )

    def __post_init__(self) -> None:
        if self.window is not None:
            try:
                object.__setattr__(self, "window", tuple(side(s) for s in self.window))
            except ValueError as exc:
                raise MaskError(str(exc)) from None
        self._check_extra()
        if self.dilation < 1:
            raise MaskError(f"dilation must be >= 1, got {self.dilation}")
        object.__setattr__(self, "global_tokens", _normal_globals(self.global_tokens))
        if self.random_blocks < 0:
            raise MaskError("random_blocks must be >= 0")
        if self.prefix_len < 0:
            raise MaskError(f"prefix_len must be >= 0, got {self.prefix_len}")
        if self.documents is not None:
            docs = tuple(int(x) for x in self.documents)
            if not docs or min(docs) < 1:
                raise MaskError(f"documents must be lengths >= 1, got {self.documents}")
            object.__setattr__(self, "documents", docs)
        if self.block_size is not None:
            if self.block_size < 1:
                raise MaskError(f"block_size must be >= 1, got {self.block_size}")
            if self.dilation != 1:
                raise MaskError("dilation cannot be combined with block_size")
            if self.documents is not None:
                raise MaskError("documents cannot be combined with block_size")
            _check_whole_blocks(self.global_tokens, self.block_size)
        elif self.random_blocks:
            raise MaskError("random_blocks needs block_size")

    def _check_extra(self) -> None:
        extra = tuple(self.extra)
        for feature in extra:
            if not isinstance(feature, RunsFeature | PredicateFeature):
                raise MaskError(
                    f"a plug-in mask feature must be a RunsFeature or a PredicateFeature, "
                    f"got {feature!r}"
                )
            try:
                feature.check()
            except ValueError as exc:
                raise MaskError(f"{feature.name}: {exc}") from None
        if extra and self.block_size is not None:
            names = sorted(f.name for f in extra)
            raise MaskError(f"mask features {names} cannot be combined with block_size")
        object.__setattr__(self, "extra", extra)

    @property
    def left(self) -> Side:
        return None if self.window is None else self.window[0]

    @property
    def right(self) -> Side:
        return None if self.window is None else self.window[1]

    @property
    def is_dense(self) -> bool:
        """True when every pair is kept (plain non-causal attention)."""
        return (
            not self.causal
            and self.window in (None, (None, None))
            and self.dilation == 1
            and self.block_size is None
            and self.documents is None
            and not any(isinstance(f, PredicateFeature) for f in self.extra)
        )

    @property
    def features(self) -> frozenset[str]:
        """Mask features this spec uses, as named in ``Capabilities.mask_features``."""
        used = set()
        if self.causal:
            used.add("causal")
        if self.window not in (None, (None, None)):
            used.add("window")
        if self.dilation > 1:
            used.add("dilation")
        if self.global_tokens:
            used.add("global")
        if isinstance(self.global_tokens, tuple):
            used.add("global_positions")
        if self.block_size is not None:
            used.add("block_sparse")
        if self.documents is not None:
            used.add("documents")
        if self.prefix_len:
            used.add("prefix")
        used.update(f.name for f in self.extra)
        return frozenset(used)

    @property
    def capabilities(self) -> frozenset[str]:
        """The ``Capabilities.mask_features`` a path must declare to run this mask: the named
        features, and for each plug-in feature the capability it needs instead of its name."""
        needs = self.plugin_needs
        return frozenset(self.features - set(needs)) | frozenset(needs.values())

    @property
    def plugin_needs(self) -> dict[str, str]:
        """Each plug-in feature's name -> the capability a path needs to run it."""
        return {f.name: f.needs for f in self.extra}

    def global_positions(self, n: int) -> tuple[int, ...]:
        """The global positions below ``n``, ascending."""
        g = self.global_tokens
        return tuple(range(min(g, n))) if isinstance(g, int) else tuple(x for x in g if x < n)

    @property
    def global_runs(self) -> Runs:
        """The global positions as sorted ``[start, end)`` runs."""
        g = self.global_tokens
        if isinstance(g, int):
            return ((0, g),) if g else ()
        return positions_to_runs(g)

    def without_documents(self) -> MaskSpec:
        """The mask each document applies in its own coordinates (rules 1-4)."""
        return self if self.documents is None else replace(self, documents=None)

    def check_lengths(self, n_q: int, n_k: int) -> None:
        """Raise :class:`MaskError` when this spec cannot apply to n_q queries over n_k keys:
        documents need ``n_q == n_k`` and must sum to it; global positions (inside a document,
        with documents) and the prefix must lie inside the sequence; a block-sparse global
        block may only be short where the sequence ends."""
        longest = n_k
        if self.documents is not None:
            if n_q != n_k:
                raise MaskError(f"documents need n_q == n_k, got {n_q} queries over {n_k} keys")
            if sum(self.documents) != n_k:
                raise MaskError(
                    f"documents sum to {sum(self.documents)}, not the sequence length {n_k}"
                )
            longest = max(self.documents)
        if isinstance(self.global_tokens, tuple) and self.global_tokens[-1] >= longest:
            where = f"every document (the longest has {longest})" if self.documents else (
                f"a sequence of {n_k}")
            raise MaskError(f"global position {self.global_tokens[-1]} is outside {where}")
        if self.prefix_len > n_k:
            raise MaskError(f"prefix_len {self.prefix_len} > sequence length {n_k}")
        if self.block_size is not None and self.global_runs:
            b, end = self.block_size, min(self.global_runs[-1][1], n_k)
            if end % b and end != n_k:
                raise MaskError(
                    f"global positions must be whole blocks of block_size={b}: the block of "
                    f"position {end - 1} is cut short before the sequence ends at {n_k}"
                )

    def describe(self) -> str:
        """A short human label, e.g. ``causal,window=(255,0)``."""
        parts = []
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"window=({_side(self.left)},{_side(self.right)})")
        if self.dilation > 1:
            parts.append(f"dilation={self.dilation}")
        if isinstance(self.global_tokens, tuple):
            runs = " ".join(f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in self.global_runs)
            parts.append(f"global=[{runs}]")
        elif self.global_tokens:
            parts.append(f"global={self.global_tokens}")
        if self.block_size is not None:
            parts.append(f"block={self.block_size},random={self.random_blocks}")
        if self.prefix_len:
            parts.append(f"prefix={self.prefix_len}")
        if self.documents is not None:
            parts.append(f"documents={len(self.documents)}")
        parts.extend(f.label() for f in self.extra)
        return ",".join(parts) or "dense"


def column_fields() -> tuple:
    """The MaskSpec fields that are result columns (plug-in features are not)."""
    return tuple(f for f in fields(MaskSpec) if f.metadata.get("column", True))


def _side(s: Side) -> str:
    return "-1" if s is None else str(s)


def _normal_globals(g) -> Globals:
    """An int count stays; a collection of positions becomes a sorted tuple without repeats,
    stored as the count ``g`` when it is exactly ``0..g-1`` (one spelling per mask)."""
    if isinstance(g, bool) or not isinstance(g, int | tuple | list):
        raise MaskError(f"global_tokens must be a count or a tuple of positions, got {g!r}")
    if isinstance(g, int):
        if g < 0:
            raise MaskError(f"global_tokens must be >= 0, got {g}")
        return g
    positions = tuple(sorted({int(x) for x in g}))
    if positions and positions[0] < 0:
        raise MaskError(f"global positions must be >= 0, got {positions[0]}")
    if positions == tuple(range(len(positions))):
        return len(positions)
    return positions


def _check_whole_blocks(g: Globals, b: int) -> None:
    """Block-sparse global tokens must be whole blocks: a count that is a multiple of b, or
    runs of positions that start where a block starts and end where one ends. Only the last
    run may end early, where the sequence ends (:meth:`MaskSpec.check_lengths` knows where)."""
    if isinstance(g, int):
        if g % b:
            raise MaskError(f"global_tokens={g} must be a multiple of block_size={b}")
        return
    runs = positions_to_runs(g)
    if any(a % b for a, _ in runs) or any(e % b for _, e in runs[:-1]):
        raise MaskError(f"global positions must be whole blocks of block_size={b}, got {g}")
