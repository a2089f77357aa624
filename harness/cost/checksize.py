"""How much of a point's output the ``auto`` agreement check compares with the float64
reference: all of it up to :data:`FULL_CHECK_MAX_PAIRS` (query, key) pairs, sampled query rows
beyond. The check plan (:func:`harness.scenarios.base.check_plan`) and the decode memory
prediction (:mod:`harness.cost.decode`) read the same rule here.
"""

from __future__ import annotations

# Full float64 checks above this many (query, key) pairs cost more than the point itself;
# beyond it we check sampled query rows (forward) and say so in the `check` column.
FULL_CHECK_MAX_PAIRS = 4096 * 4096


def full_check_fits(point) -> bool:
    """Whether ``auto`` checks ``point`` in full: n_q · seq_len <= FULL_CHECK_MAX_PAIRS."""
    return point.n_q * point.seq_len <= FULL_CHECK_MAX_PAIRS
