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
    schedule = {(p, k): 1.0 for p in ("a", "b") for k in range(2)}
    with Progress(schedule, 2, stream=stream, clock=clock) as bar:
        assert bar.eta_s() == 4.0  # nothing done yet: the prediction
        clock.now += 5
        bar.step("a", 0, "sdpa n=64: ok")
        assert stream.getvalue() == ""  # under LINE_EVERY_S since the start
        clock.now += LINE_EVERY_S - 4
        bar.step("b", 0, "sdpa n=128: ok")
        first = stream.getvalue().splitlines()
        assert first == ["attnbench: pass 1/2: 2/2 points (100%), 11 s so far, ETA 11 s; "
                         "last: sdpa n=128: ok"]
        clock.now += 1
        bar.step("b", 1, "sdpa n=128: ok")
        clock.now += 1
        bar.step("a", 1, "sdpa n=64: ok")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("attnbench: pass 2/2: 2/2 points (100%)")
    assert "ETA" not in lines[1]


def run_progress(schedule: dict, passes: int, failing: set[str]) -> list[str]:
    """Every progress line of a run of ``schedule`` in which ``failing`` points fail their first
    pass (the runner's order: every point of a pass before the next pass; a line per step)."""
    clock, stream = Clock(), io.StringIO()
    with Progress(schedule, passes, stream=stream, clock=clock) as bar:
        for k in range(passes):
            for point, j in schedule:
                if j != k or (k > 0 and point in failing):
                    continue
                if k == 0 and point in failing:
                    bar.forget(point)
                clock.now += LINE_EVERY_S
                bar.step(point, k, f"{point}: {'error' if point in failing else 'ok'}")
    return stream.getvalue().splitlines()


def test_progress_totals_never_change_while_shown():
    """38 points in 3 passes, 2 of them failing their first pass: ``pass 1/3: k/38``, then
    ``pass 2/3: k/36`` and ``pass 3/3: k/36``; each count runs 1..total, the last line says
    100% and no ETA (the run once showed ``44/114`` point-passes, then ``82/108``)."""
    points = [f"p{i}" for i in range(38)]
    schedule = {(p, k): 0.5 for k in range(3) for p in points}
    lines = run_progress(schedule, 3, failing={"p3", "p17"})
    seen: dict[str, list[tuple[int, int]]] = {}
    for line in lines:
        pass_, counts = line.split(": ")[1:3]
        done, total = map(int, counts.split()[0].split("/"))
        seen.setdefault(pass_, []).append((done, total))
    assert list(seen) == ["pass 1/3", "pass 2/3", "pass 3/3"]
    for pass_, total in zip(seen, (38, 36, 36), strict=True):
        assert seen[pass_] == [(i, total) for i in range(1, total + 1)], pass_
    assert "(100%)" in lines[-1] and "ETA" not in lines[-1]
    assert all("ETA" in line for line in lines[:-1])


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
