"""What one result-row column is: its name, the unit it is stored in, how it is displayed and a
one-line description.

The columns themselves are declared where their values come from: the columns every row has in
:mod:`harness.schema`, the columns a scenario adds in its folder's ``__init__``
(``harness/scenarios/<name>/__init__.py``); :mod:`harness.schema` gathers them into one table.
Columns that several scenarios measure the same way are declared here once (:data:`BANDWIDTH`)
and listed by each. This module imports nothing, so both can import it.
"""

from __future__ import annotations

from dataclasses import dataclass

# display format kind -> how a value of that kind is shown
KINDS = {
    "text": "shown as written",
    "int": "an integer (a shape, a count, a setting)",
    "bool": "true or false",
    "seconds": "a duration; tables show ms",
    "bytes": "a size; tables show MiB",
    "flops": "a count of floating-point operations; tables show GFLOP",
    "rate": "an amount per second, in the column's unit",
    "error": "an error or tolerance, in scientific notation",
    "share": "a fraction of a whole; tables show %",
    "number": "a real number, to 4 significant digits",
}


@dataclass(frozen=True)
class Column:
    """One row column: ``unit`` as stored ("" = none or text), ``kind`` a key of KINDS.

    What the readers of rows make of it is declared here too, so a scenario's columns bring
    it with them: ``title`` is its human name in tables and figures ("" = its name);
    ``timed`` marks a time of a timed call (or a rate of one), which claims judge as a time;
    ``when_present`` puts it in the default table of a run that has a value of it;
    ``follows_impl`` marks a point field that the implementation sets (rows of two
    implementations are matched without it); ``moves_with`` names the point fields a derived
    column is made from (a fit along it lets them vary: ``context_tokens`` moves with
    ``seq_len`` and ``contexts``); ``time_power`` is the power of the timed call's time the
    column scales with (``bw_fraction``: -1), so claims bootstrap it from the time samples."""

    name: str
    unit: str
    kind: str
    doc: str
    many: bool = False  # a list: one value per sample, per timing pass or per document
    point: bool = False  # a field of the sweep point: identifies the point (in point_id)
    title: str = ""
    timed: bool = False
    when_present: bool = False
    follows_impl: bool = False
    moves_with: tuple[str, ...] = ()
    time_power: float = 0.0  # the power of the timed call's time it scales with (0: none)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name}: unknown kind {self.kind!r}")


def point_column(*args, **kwargs) -> Column:
    """A point field's column (``point=True``)."""
    return Column(*args, point=True, **kwargs)


# the memory roofline's columns: the attention and decode scenarios measure them the same way
BANDWIDTH: tuple[Column, ...] = (
    Column(
        "bw_fraction", "", "share",
        "attention and decode: the bytes the call must move (attention: `compulsory_bytes`; "
        "decode: `step_bytes`) / median time, as a fraction of the measured copy bandwidth",
        title="share of copy bandwidth",
        time_power=-1.0,
    ),
    Column(
        "bw_source", "", "text",
        "attention and decode: where that bandwidth came from: env.json "
        "`calibration.mem_bandwidth_bytes_per_s`, or measured in the process for isolated or "
        "resumed points",
    ),
)  # fmt: skip
