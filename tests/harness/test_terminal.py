"""What a person sees while a run works: progress lines with an ETA off a terminal, and a
console that never cuts a table in a file."""

from __future__ import annotations

import io

from rich.table import Table

from harness.terminal import (
    LINE_EVERY_S,
    PIPE_WIDTH,
    Progress,
    console,
    duration,
    text_width,
    word_table,
)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_follow_the_runs_pace():
    """Predicted 1 s a step, but the run takes 5.5 s a step: the ETA says 11 s for the two
    steps left, not 2 s; lines come at most every LINE_EVERY_S seconds, and at the end."""
    clock, stream = Clock(), io.StringIO()
    with Progress([1.0] * 4, stream=stream, clock=clock) as bar:
        assert bar.eta_s() == 4.0  # nothing done yet: the prediction
        clock.now += 5
        bar.step("sdpa n=64 pass 1/2: ok", 1.0)
        assert stream.getvalue() == ""  # under LINE_EVERY_S since the start
        clock.now += LINE_EVERY_S - 4
        bar.step("sdpa n=128 pass 1/2: ok", 1.0)
        first = stream.getvalue().splitlines()
        assert first == ["attnbench: 2/4 point-passes (50%), 11 s so far, ETA 11 s; "
                         "last: sdpa n=128 pass 1/2: ok"]
        bar.forget([1.0])  # a point failed its first pass: its second never runs
        clock.now += 1
        bar.step("sdpa n=64 pass 2/2: ok", 1.0)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("attnbench: 3/3 point-passes (100%)")
    assert "ETA" not in lines[1]


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (42, 200, 4 * 3600)] == ["42 s", "3.3 min", "4.0 h"]


def test_a_console_on_a_file_never_cuts_or_wraps():
    table = Table("name", "dtypes")
    long = ", ".join(["bfloat16", "float16", "float32", "float64"] * 8)
    table.add_row("flash-tiled", long)
    stream = io.StringIO()
    out = console(stream)
    out.print(table)
    out.print("x" * 500)
    text = stream.getvalue()
    assert long in text and "…" not in text and "x" * 500 in text
    assert "\x1b[" not in text  # no colour codes in a file


def test_a_word_table_wraps_prose_columns_and_keeps_narrow_ones_whole():
    header = ("name", "family", "features")
    rows = [("flex-blocksparse", "block-sparse", "block_sparse, causal, global, window, prefix"),
            ("sdpa", "sdpa", "causal")]
    text = word_table(header, rows, 50)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 50
    assert lines[0].split() == list(header) and set(lines[1]) == {"-", " "}
    assert lines[2].startswith("flex-blocksparse  block-sparse  ")  # whole, not wrapped
    assert "block_sparse," in text and "prefix" in text and "sdpa" in lines[-1]
    assert word_table(header, rows, 200).splitlines()[2].endswith("window, prefix")
    assert word_table(header, rows, 44) is None  # the longest words do not fit side by side
    assert word_table(header, rows, 50, max_lines=1) is None  # a row needs more lines


def test_text_width_off_a_terminal_is_columns_or_the_pipe_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert text_width(io.StringIO()) == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "132")
    assert text_width(io.StringIO()) == 132
    monkeypatch.setenv("COLUMNS", "wide")
    assert text_width(io.StringIO()) == PIPE_WIDTH
