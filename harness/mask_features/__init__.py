"""The mask's geometry, one module per feature (attention-gym style: a feature is a clause).

The dense rule of :mod:`harness.masks` is these clauses composed in one order::

    keep = pattern                      # window.py and dilation.py, or bigbird_blocks.py
    keep = keep | visible               # globals.py, and every plug-in feature (RunsFeature)
    keep = keep & causal                # causal.py
    keep = keep | prefix                # prefix.py
    keep = keep & predicate             # predicate.py: every PredicateFeature (an AND)
    keep = keep & same document         # documents.py (positions counted per document)

Each module states its clause (a builder, called once per spec, of an elementwise function on
Python constants that writes nothing in place: :func:`harness.masks.pair_keep` composes them,
and that one function is the dense rule and Flex's ``mask_mod``), its part of the
closed-form pair count (what it puts in :mod:`harness.paircount`'s :class:`BandRule` /
:class:`LayoutRule`, assembled by :func:`harness.masks.pair_rule`) and so its part of the one
block plan (:mod:`harness.block_plan`: exact per-block counts, so a (query block,
key block) pair is skipped, full or partial; the element predicate of a partial one is the
dense rule). Readers of the geometry: the CPU tiles (:mod:`implementations._kernels.tiles`),
Flex's ``BlockMask`` (:mod:`implementations._flex_masks`), the Triton band and block tables
(:mod:`implementations._kernels.triton.band_plan`, ``blocklist_plan``).

A feature outside MaskSpec's named fields is carried in ``MaskSpec.extra``, in one of two
forms: a :class:`RunsFeature` (see :mod:`.visible_runs`), whose geometry is runs of visible keys
and rows, which every reader above already handles for global tokens; or a
:class:`~.predicate.PredicateFeature` (see :mod:`.predicate`), an element predicate that
restricts the pairs, given for torch and as a ``@triton.jit`` function, with a block
classification the block plan reads.
"""



class MaskError(ValueError):
    """A MaskSpec whose fields contradict each other, or that does not fit the lengths."""


# after MaskError: the feature modules raise it
from harness.mask_features.visible_runs import RunsFeature, merge_runs  # noqa: E402

__all__ = ["MaskError", "RunsFeature", "merge_runs"]
