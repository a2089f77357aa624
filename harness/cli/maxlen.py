"""``attnbench maxlen IMPL``: the arguments of the search in :mod:`harness.execute.maxlen`."""

from __future__ import annotations

import argparse
import json
import sys

from harness.cli import parse_size
from harness.errors import CliError, Interrupted, SuiteError
from harness.execute.maxlen import find_max_len, report, verification_notice
from harness.execute.runner import default_budget
from harness.measure.device import get_device
from harness.scenarios import interface
from harness.scenarios.interface import Point, scenario_of
from harness.spec import DTYPES
from harness.sweep.suite import parse_suite


def add_cli(sub) -> None:
    """Add ``maxlen``."""
    p = sub.add_parser(
        "maxlen",
        help="largest seq_len that fits a memory budget "
        "(predicted, then verified in capped child processes)",
    )
    p.add_argument("impl", metavar="IMPL", help="implementation name (see `attnbench list`)")
    p.add_argument("--scenario", choices=interface.names(), default="attention")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    for name in (
        "batch",
        "heads",
        "kv-heads",
        "head-dim",
        "dilation",
        "global-tokens",
        "block-size",
        "layers",
    ):
        p.add_argument(f"--{name}", type=int, help="point field (see suite files)")
    p.add_argument("--causal", action="store_true")
    p.add_argument(
        "--window",
        type=int,
        nargs=2,
        metavar=("LEFT", "RIGHT"),
        help="window sides (-1 = unbounded)",
    )
    for name in ("norm", "ffn", "pos", "cache"):
        p.add_argument(f"--{name}", help="block/decode point field")
    p.add_argument(
        "--budget", type=parse_size, help="memory budget, e.g. 2GiB (default: 80%% of free memory)"
    )
    p.add_argument("--multiple", type=int, default=64, help="length granularity (default 64)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="per verification run; slower runs count as unverified (default 120)",
    )
    p.add_argument("--threads", type=int, help="CPU threads in the verification runs")
    p.add_argument("--no-verify", action="store_true", help="prediction only")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_maxlen)


def build_point(args: argparse.Namespace) -> Point:
    """The point the arguments describe, validated exactly like a suite's ``[fixed]`` table."""
    fixed = {"dtype": args.dtype, "causal": args.causal, "seq_len": args.multiple}
    for name in (
        "batch",
        "heads",
        "kv_heads",
        "head_dim",
        "dilation",
        "global_tokens",
        "block_size",
        "layers",
        "norm",
        "ffn",
        "pos",
        "cache",
    ):
        if getattr(args, name) is not None:
            fixed[name] = getattr(args, name)
    if args.window is not None:
        fixed["window"] = list(args.window)
    doc = {
        "name": "maxlen",
        "scenario": args.scenario,
        "implementations": [args.impl],
        "device": args.device,
        "fixed": fixed,
    }
    try:
        (point,) = parse_suite(doc, "maxlen").points
    except SuiteError as exc:
        message = str(exc).replace("fixed.", "--").replace("implementations = ", "IMPL = ")
        raise CliError(message) from None
    return point


def cmd_maxlen(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--multiple", args.multiple),
        ("--time-limit", args.time_limit),
        ("--threads", args.threads),
    ):
        if value is not None and not 0 < value < float("inf"):
            raise CliError(f"{flag} {value}: must be > 0")
    point = build_point(args)
    reasons = scenario_of(point).support(point)
    if reasons:
        raise CliError(f"{point.impl} cannot run this point: {'; '.join(reasons)}")
    try:
        device = get_device(point.device)
    except RuntimeError as exc:
        raise CliError(f"--device {point.device}: {exc}") from None
    budget = args.budget or default_budget(device)
    if not args.no_verify and not args.json:
        print(verification_notice(point, budget, args.multiple, args.time_limit), file=sys.stderr)
    log = None if args.json else (lambda line: print(f"  verify {line}", file=sys.stderr))
    try:
        result = find_max_len(
            point,
            budget,
            multiple=args.multiple,
            verify=not args.no_verify,
            time_limit_s=args.time_limit,
            threads=args.threads,
            log=log,
        )
    except KeyboardInterrupt:  # maxlen keeps no files: say what there is instead
        hint = "" if args.no_verify else " (add --no-verify for the prediction alone, at once)"
        raise Interrupted(f"interrupted: maxlen saves nothing, no answer was found{hint}") from None
    print(json.dumps(result.as_dict(), indent=2) if args.json else report(result))
    return 0
