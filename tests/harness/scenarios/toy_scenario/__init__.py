"""``toy``: a scenario written only to prove that adding a scenario is adding a folder. It
times the attention core ``repeat`` times on the same seeded inputs (a test copies this folder
into a temporary copy of ``harness/scenarios/`` and runs a one-point suite of it).
"""

from harness.columns import Column, point_column

COLUMNS = (
    point_column("repeat", "", "int", "toy scenario: core calls per timed call"),
    Column("toy_calls", "", "int", "toy scenario: core calls of the checked run"),
    Column("toy_order", "", "text", "toy scenario: its own `[measure] toy_order`, as read"),
)
