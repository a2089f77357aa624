"""Triton compiles of a process, one JSON line each, and the count of the misses among them.

:func:`record` is a Triton compilation listener (``triton.knobs.compilation.listener``, Triton
3.6: called by ``triton.compiler.compile`` with ``src``, ``metadata``, ``metadata_group``,
``times`` and ``cache_hit``, on an on-disk cache hit as on a miss; a launch that finds its
kernel in the JIT's in-memory cache calls nothing). Each call appends one line to the file
named by ``ATTNBENCH_TRITON_MISSES``::

    {"kernel": "band_fwd", "hit": false, "us": 41250312, "pid": 812, "hash": "2b1f..."}

``us`` is Triton's own measure of the compile (``CompileTimes.total``, microseconds; for a
hit, the time ``compile()`` took: on a process's first compile it includes hashing Triton's
files). :func:`count` reads such a file back. Standard library only: the proof's summary
imports this module in a process without Triton, or runs it:

    python lease/triton_listen/triton_misses.py FILE    # prints summary_line(FILE)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV = "ATTNBENCH_TRITON_MISSES"


def line(kernel: str, hit: bool, us: int, digest: str = "") -> str:
    """One compile as a JSON line (no newline)."""
    return json.dumps({"kernel": kernel, "hit": bool(hit), "us": int(us), "pid": os.getpid(),
                       "hash": digest})


def record(*, src=None, metadata=None, metadata_group=None, times=None, cache_hit=False,
           **_ignored) -> None:
    """Triton's compilation listener: append this compile's line to ``$ATTNBENCH_TRITON_MISSES``
    (nothing when the variable is unset). Never raises: a listener that fails would fail the
    compile it watches."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        name = getattr(src, "name", None) or (metadata or {}).get("name", "?")
        us = getattr(times, "total", 0) if times is not None else 0
        text = line(str(name), cache_hit, us() if callable(us) else us,
                    str((metadata or {}).get("hash", "")))
        with open(path, "a") as fh:  # one short write per line: lines of processes interleave
            fh.write(text + "\n")  # whole (O_APPEND)
    except Exception:  # see the docstring
        return


def count(path: str | Path) -> dict:
    """``{"compiles", "hits", "misses", "miss_s", "kernels"}`` of a listener's file: how many
    compiles, on-disk hits and misses, the seconds the misses took and the missed kernels' names
    with their counts. A missing file counts nothing; an unreadable line is skipped."""
    out = {"compiles": 0, "hits": 0, "misses": 0, "miss_s": 0.0, "kernels": {}}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for text in lines:
        try:
            row = json.loads(text)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        out["compiles"] += 1
        if row.get("hit"):
            out["hits"] += 1
            continue
        out["misses"] += 1
        out["miss_s"] += float(row.get("us", 0)) / 1e6
        name = str(row.get("kernel", "?"))
        out["kernels"][name] = out["kernels"].get(name, 0) + 1
    out["miss_s"] = round(out["miss_s"], 3)
    return out


def summary_line(path: str | Path) -> str:
    """One line for the proof's summary: ``triton compiles: 40 (38 hits, 2 misses: 61.2 s;
    band_dq x2)``."""
    c = count(path)
    if not c["compiles"]:
        return "triton compiles: none recorded"
    named = ", ".join(f"{k} x{n}" for k, n in sorted(c["kernels"].items()))
    tail = f": {c['miss_s']:.1f} s; {named}" if c["misses"] else ""
    return f"triton compiles: {c['compiles']} ({c['hits']} hits, {c['misses']} misses{tail})"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python lease/triton_listen/triton_misses.py FILE", file=sys.stderr)
        sys.exit(2)
    print(summary_line(sys.argv[1]))
