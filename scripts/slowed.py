#!/usr/bin/env python
"""Run the ``attnbench`` CLI with one implementation made ``FACTOR`` times slower by a real delay
inside its calls: each call runs the implementation ``FACTOR`` times and returns the last
result. The work repeats on the same inputs with the same threads, so the slowdown looks to
the harness exactly like a slower kernel (same CPU use, same memory peak, same output).

A test tool for the regression gate (``scripts/gate_power.py``); rows keep the original
implementation name, so the run compares point by point with an honest baseline.

    python scripts/slowed.py flash-tiled 2 run suites/smoke.toml --out /tmp/slow
"""

from __future__ import annotations

import dataclasses
import sys


def slow_down(name: str, factor: int) -> None:
    """Replace ``name`` in the registry by a version whose calls repeat ``factor`` times."""
    from harness import registry

    impl = registry.get(name)

    def repeat(call):
        def slowed(*args, **kwargs):
            for _ in range(factor - 1):
                call(*args, **kwargs)  # the result is dropped at once: the peak stays the same
            return call(*args, **kwargs)

        return slowed

    slowed = dataclasses.replace(
        impl,
        fn=repeat(impl.fn),
        prepare_fn=lambda problem: repeat(impl.prepare(problem)),
    )
    registry._REGISTRY[name] = slowed  # test tool: swap the entry, keep the name


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[1].isdigit() or int(argv[1]) < 1:
        print("usage: slowed.py IMPL FACTOR ATTNBENCH-ARGS... (FACTOR: integer >= 1)",
              file=sys.stderr)
        return 2
    from harness import registry
    from harness.cli import main as cli_main

    try:
        registry.get(argv[0])
    except KeyError:
        print(f"slowed.py: unknown implementation {argv[0]!r}", file=sys.stderr)
        return 2
    slow_down(argv[0], int(argv[1]))
    return cli_main(argv[2:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
