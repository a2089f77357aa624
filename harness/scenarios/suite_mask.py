"""A point's mask as one value, :class:`PointMask`, and its flat row columns.

The rules read a :class:`harness.masks.MaskSpec`, whose ``documents`` are realised lengths. A
suite may give the documents as a rule (``"uniform:512"``, :mod:`harness.scenarios.packing`)
that only a sequence length realises, and rows and point ids keep that spelling. So a point
holds its MaskSpec without the documents, plus the documents as written;
:meth:`PointMask.resolve` realises them for a sequence length.

Columns: every MaskSpec field is one column of its name, in the MaskSpec's order, except
``window``, which is two (``window_left``, ``window_right``; None = unbounded side); global
positions and documents are held as text in a row. A field added to MaskSpec is a column (and a
suite key, typed by its annotation) at once. :data:`FIRST_COLUMNS` are the mask columns every
point id has hashed since the first results; any other column counts in the id only when it is
not at its default, so adding a field leaves every existing id as it was.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from harness.mask_fields import column_fields
from harness.masks import MaskSpec, Side
from harness.scenarios import packing

# the mask columns of the first point ids: hashed whatever their value
FIRST_COLUMNS = (
    "causal", "window_left", "window_right", "dilation", "global_tokens", "block_size",
    "random_blocks", "seed",
)  # fmt: skip


def _column_hints() -> dict[str, object]:
    """Mask column -> the annotation of the MaskSpec field it holds (a window side: Side)."""
    hints = typing.get_type_hints(MaskSpec)
    out: dict[str, object] = {}
    for f in column_fields():
        if f.name == "window":
            out["window_left"] = out["window_right"] = Side
        else:
            out[f.name] = hints[f.name]
    return out


HINTS: dict[str, object] = _column_hints()
COLUMNS: tuple[str, ...] = tuple(HINTS)


def suite_types() -> dict[str, type | tuple[type, ...]]:
    """Mask column -> the TOML value types a suite may give it: the annotation's types, a tuple
    as a list, without None; ``documents`` is a rule's text or the lengths."""
    out: dict[str, type | tuple[type, ...]] = {}
    for name, hint in HINTS.items():
        kinds = typing.get_args(hint) or (hint,)
        given = tuple(list if typing.get_origin(k) is tuple else k for k in kinds)
        given = tuple(k for k in given if k is not types.NoneType)
        out[name] = given[0] if len(given) == 1 else given
    out["documents"] = (str, list)
    return out


@dataclass(frozen=True)
class PointMask:
    """Which (query, key) pairs a point's attention keeps, as its suite wrote them: ``spec`` is
    the MaskSpec of every rule but the documents, ``documents`` the packed documents as written
    (a rule's text, or the lengths; None = one sequence). A ``spec`` given with documents of its
    own hands them to ``documents``."""

    spec: MaskSpec = field(default_factory=MaskSpec)
    documents: packing.Documents | None = None

    def __post_init__(self) -> None:
        docs = self.documents
        if self.spec.documents is not None:
            if docs is not None:
                raise ValueError("documents given twice: in the MaskSpec and as written")
            docs = self.spec.documents
            object.__setattr__(self, "spec", self.spec.without_documents())
        if isinstance(docs, list):
            docs = tuple(docs)
        object.__setattr__(self, "documents", docs)

    def resolve(self, seq_len: int) -> MaskSpec:
        """The MaskSpec of a sequence of ``seq_len`` tokens: the documents realised."""
        if self.documents is None:
            return self.spec
        return replace(self.spec, documents=packing.lengths(self.documents, seq_len))

    @classmethod
    def from_columns(cls, values: Mapping[str, object]) -> PointMask:
        """The mask of the mask columns in ``values`` (others ignored; absent: the default), as
        a suite or a row spells them: global positions and documents as text or a list.
        Raises :class:`harness.masks.MaskError` for fields that contradict each other."""
        given = {k: values[k] for k in COLUMNS if values.get(k) is not None}
        window = None
        left, right = given.pop("window_left", None), given.pop("window_right", None)
        if left is not None or right is not None:
            window = (left, right)
        if isinstance(given.get("global_tokens"), str | list):
            given["global_tokens"] = packing.parse(given["global_tokens"])
        documents = given.pop("documents", None)
        if documents is not None:
            documents = packing.parse(documents)
        return cls(MaskSpec(window=window, **given), documents)

    def columns(self, complete: bool = True) -> dict[str, object]:
        """The mask columns in order (module docstring); ``complete=False`` leaves out each
        column added after the first point ids while it is at its default (the id form)."""
        out: dict[str, object] = {}
        for f in column_fields():
            if f.name == "window":
                out["window_left"], out["window_right"] = self.spec.left, self.spec.right
                continue
            value = self.documents if f.name == "documents" else getattr(self.spec, f.name)
            if complete or f.name in FIRST_COLUMNS or value != f.default:
                out[f.name] = packing.text(value) if isinstance(value, tuple) else value
        return out
