"""The row columns are declared once (harness/schema.py): the loaders' column order, the README's
column table and every metric list of the table, figure, compare and analysis code agree with it."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import scenarios, schema
from harness.analysis import claims, frames, regime
from harness.compare import rules as thresholds
from harness.render import panels, table
from harness.results import ROW_COLUMNS
from harness.scenarios import interface

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "results" / "README.md"
# compare's metric names (``--threshold time=...,mem=...``) -> the row column each one judges
COMPARED_COLUMNS = {"time": "time_median_s", "mem": "peak_mem_bytes"}
# a table metric's display unit, by the schema's format kind ("rate": the column's own unit)
TABLE_LABELS = {
    "seconds": "ms",
    "bytes": "MiB",
    "flops": "GFLOP",
    "share": "%",
    "error": "",
    "int": "",
}


def undeclared(names) -> set[str]:
    """The names of ``names`` that the schema does not declare (empty = all declared)."""
    return set(names) - set(schema.BY_NAME)


def test_row_columns_are_the_schema_names_in_order():
    assert tuple(c.name for c in schema.COLUMNS) == ROW_COLUMNS
    assert len(set(ROW_COLUMNS)) == len(ROW_COLUMNS)


@pytest.mark.parametrize("column", schema.COLUMNS, ids=lambda c: c.name)
def test_every_column_has_a_kind_and_a_one_line_doc(column):
    assert column.kind in schema.KINDS
    assert column.doc and "\n" not in column.doc and column.doc == column.doc.strip()
    assert column.name == column.name.lower() and " " not in column.name


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown kind"):
        schema.Column("x", "", "colour", "a column")


def test_readme_column_table_is_the_generated_one():
    text = README.read_text()
    assert text.count(schema.GENERATED_BEGIN) == 1 and text.count(schema.GENERATED_END) == 1
    start = text.index(schema.GENERATED_BEGIN)
    end = text.index(schema.GENERATED_END) + len(schema.GENERATED_END)
    assert text[start:end] == schema.generated_block(), (
        "results/README.md is stale: replace its column table with `python -m harness.schema`"
    )


def test_python_m_harness_schema_prints_the_block():
    out = subprocess.run(
        [sys.executable, "-m", "harness.schema"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert out == schema.generated_block() + "\n"
    assert re.search(r"\| `time_median_s` +\| s +\|", out)
    assert re.search(r"\| `time_samples_s` +\| list of s +\|", out)


def test_table_metric_lists_are_declared_with_matching_units():
    assert not undeclared(table.METRICS)
    assert not undeclared(table.TITLES)
    assert not undeclared(table.DEFAULT_METRICS)
    for name in table.METRICS:
        column = schema.BY_NAME[name]
        own_unit = column.kind in ("rate", "number")
        expected = column.unit if own_unit else TABLE_LABELS[column.kind]
        assert table.unit_of(name).label == expected, name


def test_table_units_come_from_the_schema_kind_not_the_column_name(monkeypatch):
    """A column's display unit is its declared kind: a name ending in ``_s`` that holds bytes
    is shown in MiB, and an undeclared ``_s`` column is no metric at all."""
    odd = schema.Column("spill_s", "B", "bytes", "bytes spilled (a name that looks like seconds)")
    monkeypatch.setitem(schema.BY_NAME, "spill_s", odd)
    assert table.unit_of("spill_s").label == "MiB"
    assert table.fmt_value("spill_s", 3 * 2**20) == "3"
    assert table.unit_of("made_up_s") is None
    assert table.metric_problem("pass_medians_s") and table.metric_problem("seq_len")


def test_figure_metric_lists_are_declared():
    assert not undeclared(table.TITLES)
    assert not undeclared(panels.CI_COLUMNS)
    assert not undeclared(c for pair in panels.CI_COLUMNS.values() for c in pair)


def test_compare_metrics_name_declared_columns():
    assert set(thresholds.METRICS) == set(COMPARED_COLUMNS)
    assert set(thresholds.DEFAULT_THRESHOLDS) <= set(COMPARED_COLUMNS)
    assert not undeclared(COMPARED_COLUMNS.values())


def test_analysis_metric_lists_are_declared():
    assert not undeclared(claims.TIMED_METRICS)
    assert not undeclared(frames.TIME_METRICS)
    assert not undeclared(regime.TIMED) and not undeclared(regime.TIMED.values())


def test_point_columns_are_the_point_fields_in_order():
    """Renderers read the point fields from the schema (no torch import): same names, order."""
    assert interface.point_fields() == schema.POINT_COLUMNS


@pytest.mark.parametrize("word", interface.names())
def test_every_setting_of_a_scenario_is_a_point_column_of_its_folder(word):
    """A scenario's settings dataclass and the columns its folder declares name the same
    fields: rows carry every setting as a documented point column."""
    scenario = interface.get(word)
    folder = importlib.import_module(type(scenario).__module__.rsplit(".", 1)[0])
    declared = {c.name for c in folder.COLUMNS if c.point}
    assert set(interface.settings_types(scenario)) == declared


def test_every_column_a_scenario_adds_is_in_the_schema_once():
    names = [c.name for c in schema.COLUMNS]
    for column in scenarios.declared_columns():
        assert names.count(column.name) == 1 and schema.BY_NAME[column.name] == column


def test_schema_and_results_import_no_torch():
    """The table verb reads the schema: the scenario folders declare their columns without
    importing torch."""
    code = "import harness.results, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
