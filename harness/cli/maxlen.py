"""``attnbench maxlen IMPL``: the arguments of the search in :mod:`harness.execute.maxlen`.

The point is written as a suite's ``[fixed]`` table would be, and read by the suite's own
parser (:func:`harness.sweep.suite.parse_suite`): ``--set KEY=VALUE`` takes any ``[fixed]`` key
with a TOML value (mask settings such as ``prefix_len`` and ``documents`` included); the
flags are shorthands for the same keys. The scenarios' settings flags (``--norm``, ``--cache``,
...) come from the settings each scenario declares, not from a list here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import typing

from harness import fmt
from harness.cli import SIZE_UNITS, parse_size
from harness.cli.plugin_use import add_plugin_option, use_plugins
from harness.errors import CliError, Interrupted, SuiteError
from harness.execute.maxlen import find_max_len, report, verification_notice
from harness.execute.runner import default_budget
from harness.mask_features.window import side
from harness.measure.device import get_device
from harness.scenarios import interface, packing
from harness.scenarios.interface import Point, scenario_of
from harness.scenarios.suite_mask import PointMask
from harness.spec import DTYPES
from harness.sweep.suite import parse_suite
from harness.sweep.validate import assignment, shortest_length

# point fields with a flag of their own (the names of their suite keys, - for _)
INT_FLAGS = ("batch", "heads", "kv_heads", "head_dim", "dilation", "global_tokens", "block_size")
# maxlen's own flags: a scenario setting of one of these names is reached through --set only
OWN_FLAGS = {*INT_FLAGS, "scenario", "device", "dtype", "causal", "window", "set", "budget",
             "multiple", "time_limit", "threads", "no_verify", "json", "help"}  # fmt: skip
# units as printed, by the lower-case spelling parse_size reads
UNIT_NAMES = {"": "B", "b": "B", "kb": "kB", "mb": "MB", "gb": "GB", "tb": "TB", "kib": "KiB",
              "mib": "MiB", "gib": "GiB", "tib": "TiB"}  # fmt: skip


def add_cli(sub) -> None:
    """Add ``maxlen``."""
    p = sub.add_parser(
        "maxlen",
        help="largest seq_len that fits a memory budget "
        "(predicted, then verified in capped child processes)",
        description="The largest seq_len whose measured peak memory is within --budget. The "
        "point is a suite's [fixed] table: --set KEY=VALUE takes any of its keys with a TOML "
        "value (e.g. --set prefix_len=64 --set documents=uniform:512 --set 'window=[255,0]'); "
        "the flags below are shorthands for the same keys. Masks that a point cannot honour "
        "are refused as a suite refuses them (docs/masks.md); the search starts at the "
        "shortest length the mask fits.",
    )
    p.add_argument("impl", metavar="IMPL", help="implementation name (see `attnbench list`)")
    p.add_argument("--scenario", choices=interface.names(), default="attention")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    for name in INT_FLAGS:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help="point field (suite key)")
    p.add_argument("--causal", action="store_true")
    p.add_argument(
        "--window",
        type=int,
        nargs=2,
        metavar=("LEFT", "RIGHT"),
        help="window sides (-1 = unbounded)",
    )
    settings = {k: v for k, v in scenario_settings().items() if k not in OWN_FLAGS}
    for name, (kind, scenarios) in settings.items():
        p.add_argument(
            f"--{name.replace('_', '-')}", type=kind, help=f"{'/'.join(scenarios)} setting"
        )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="assignments",
        help="any suite [fixed] key, value in TOML (a bare word is a string); repeatable",
    )
    p.add_argument(
        "--budget",
        type=lambda text: (parse_size(text), text),
        help="memory budget, e.g. 64MiB or 2GiB, reported in that unit "
        "(default: 80%% of free memory)",
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
    add_plugin_option(p)
    p.set_defaults(func=cmd_maxlen, settings_flags=tuple(settings))


def scenario_settings() -> dict[str, tuple[type, list[str]]]:
    """Every scenario's settings as flags: name -> (argparse type, the scenarios declaring it).
    A setting of several types (``int | float``) reads as the widest."""
    out: dict[str, tuple[type, list[str]]] = {}
    for word in interface.names():
        scenario = interface.get(word)
        for name, hint in interface.settings_types(scenario).items():
            kinds = typing.get_args(hint) or (hint,)
            kind = float if float in kinds else kinds[0]
            base = word.split("+")[0]
            _, seen = out.setdefault(name, (kind, []))
            if base not in seen:
                seen.append(base)
    return out


def given_values(args: argparse.Namespace) -> dict:
    """The ``[fixed]`` values the flags and ``--set`` give (a key given twice is refused)."""
    fixed: dict = {"dtype": args.dtype}
    if args.causal:
        fixed["causal"] = True
    for name in (*INT_FLAGS, *args.settings_flags):
        if getattr(args, name) is not None:
            fixed[name] = getattr(args, name)
    if args.window is not None:
        fixed["window"] = list(args.window)
    flags = set(fixed) - {"dtype"}
    for text in args.assignments:
        try:
            key, value = assignment(text)
        except SuiteError as exc:
            raise CliError(str(exc)) from None
        if key in ("seq_len", "device", "scenario"):
            where = "the search's" if key == "seq_len" else f"--{key}'s"
            raise CliError(f"--set {key}: {key} is {where} to set, not --set")
        if key in flags:  # (--dtype has a default: --set dtype=... replaces it)
            raise CliError(f"--set {key}: {key} is already set (by a flag or an earlier --set)")
        fixed[key] = value
        flags.add(key)
    if "documents" in fixed and _lengths_given(fixed["documents"]):
        raise CliError(
            f"--set documents = {fixed['documents']}: a list of lengths fixes seq_len, which "
            "maxlen searches; give a rule such as documents=uniform:512"
        )
    return fixed


def _lengths_given(documents: object) -> bool:
    """Are ``documents`` the lengths themselves (a list, or a row's ``"100,200"``)?"""
    try:
        return isinstance(packing.parse(documents), tuple)
    except ValueError:
        return False  # the suite parser says what is wrong with it


def shortest_on_grid(fixed: dict, multiple: int) -> int:
    """The shortest multiple of ``multiple`` every mask setting in ``fixed`` fits (the suite
    parser refuses a setting that is wrong in itself; here such a setting counts as 1)."""
    values = dict(fixed)
    window = values.pop("window", None)
    try:
        if isinstance(window, list) and len(window) == 2:
            values["window_left"], values["window_right"] = (side(s) for s in window)
        shortest = shortest_length(PointMask.from_columns(values))
    except (ValueError, TypeError, AttributeError, IndexError):
        shortest = 1
    return -(-shortest // multiple) * multiple


def build_point(args: argparse.Namespace) -> Point:
    """The point the arguments describe at the shortest length the search starts from,
    validated exactly like a suite's ``[fixed]`` table."""
    fixed = given_values(args)
    fixed["seq_len"] = shortest_on_grid(fixed, args.multiple)
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
        message = str(exc).replace("fixed.", "").replace("implementations = ", "IMPL = ")
        raise CliError(message) from None
    return point


def budget_unit(text: str | None, budget: int) -> tuple[str, tuple[str, int]]:
    """(the budget as the user wrote it, ``64MiB`` -> ``64 MiB``; its unit and scale). Without
    ``--budget``, the unit :func:`harness.fmt.size` picks."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text or "")
    if match is None:
        shown = fmt.size(budget)
        name = shown.split()[-1]
        scale = {"B": 1, "KiB": 2**10}.get(name, SIZE_UNITS.get(name.lower(), 2**20))
        return shown, (name, scale)
    unit = match.group(2).lower()
    return f"{match.group(1)} {UNIT_NAMES[unit]}", (UNIT_NAMES[unit], SIZE_UNITS[unit])


def cmd_maxlen(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--multiple", args.multiple),
        ("--time-limit", args.time_limit),
        ("--threads", args.threads),
    ):
        if value is not None and not 0 < value < float("inf"):
            raise CliError(f"{flag} {value}: must be > 0")
    use_plugins(args.plugin)
    point = build_point(args)
    reasons = scenario_of(point).support(point)
    if reasons:
        raise CliError(f"{point.impl} cannot run this point: {'; '.join(reasons)}")
    try:
        device = get_device(point.device)
    except RuntimeError as exc:
        raise CliError(f"--device {point.device}: {exc}") from None
    budget, given = args.budget or (default_budget(device), None)
    text, unit = budget_unit(given, budget)
    shortest = point.seq_len
    if not args.no_verify and not args.json:
        notice = verification_notice(point, budget, args.multiple, args.time_limit, shortest)
        print(notice, file=sys.stderr)
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
            shortest=shortest,
            budget_text=text,
            unit=unit,
        )
    except KeyboardInterrupt:  # maxlen keeps no files: say what there is instead
        hint = "" if args.no_verify else " (add --no-verify for the prediction alone, at once)"
        raise Interrupted(f"interrupted: maxlen saves nothing, no answer was found{hint}") from None
    print(json.dumps(result.as_dict(), indent=2) if args.json else report(result))
    return 0
