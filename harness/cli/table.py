"""``attnbench table RUN_DIR``: the comparison table of a run directory (text, markdown, CSV),
rendered by :mod:`harness.render.table`; ``attnbench run`` prints it after a run too."""

from __future__ import annotations

from pathlib import Path

from harness.cli.plugin_use import add_plugin_option, use_plugins
from harness.errors import CliError
from harness.render import table
from harness.render.pivot import in_suite_order
from harness.results import load_envs, load_rows


def add_cli(sub) -> None:
    """Add ``table``."""
    p = sub.add_parser("table", help="comparison table of a run directory (text, markdown, CSV)",
                       description="One line per point shape, one column per implementation; "
                       "only the point fields that vary are shown. CSV: one line per point, "
                       "raw units.")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--metric", action="append", metavar="COLUMN",
                   help="metric column to show (repeatable; default: time_median_s and "
                   "peak_mem_bytes, plus approx_err and cache_bytes where rows have them): "
                   "any documented numeric row column, e.g. tflops_per_s, "
                   "rel_err, tokens_per_s")
    p.add_argument("--format", choices=table.FORMATS, default="text", dest="fmt",
                   help="output format (default: text)")
    p.add_argument("--baseline", metavar="IMPL",
                   help="add speedups against this implementation (its time / each time)")
    add_plugin_option(p)
    p.set_defaults(func=cmd_table)


def cmd_table(args) -> int:
    if not args.run_dir.exists():
        raise CliError(f"{args.run_dir}: no such run directory")
    use_plugins(args.plugin, [args.run_dir])
    metrics = tuple(args.metric) if args.metric else None
    for metric in metrics or ():
        problem = table.metric_problem(metric)
        if problem:
            raise CliError(f"--metric {metric}: {problem} (metrics: {', '.join(table.METRICS)})")
    print_table(args.run_dir, metrics, args.fmt, args.baseline)
    return 0


def print_table(run_dir: Path, metrics: tuple[str, ...] | None = None, fmt: str = "text",
                baseline: str | None = None) -> None:
    """Print the table of ``run_dir``'s rows (``metrics`` None: the default metrics); rows the
    loader leaves out are said on stderr, a run with no usable row is a CliError."""
    frame = in_suite_order(load_rows(run_dir), load_envs([run_dir]).values())
    if baseline is not None and baseline not in set(frame["impl"]):
        impls = ", ".join(dict.fromkeys(frame["impl"].astype(str)))
        raise CliError(f"--baseline {baseline}: no rows of it in {run_dir} (has {impls})")
    print(table.render(frame, metrics or table.default_metrics(frame), fmt, baseline))
