"""``attnbench list``: every implementation, available or not, and why, with its method
parameters at their defaults (suites set and sweep them by name); plug-ins whose entry
point failed to load are listed with the error.

The text fits the terminal's width (a file or a pipe: ``$COLUMNS``, else 100 columns) and is
wrapped at word boundaries, never inside a word: a table when its columns fit side by side,
else one short paragraph per implementation. ``--json`` is the machine-readable form.

Listing launches nothing on a GPU: an optional backend's availability there comes from a probe
(one real call, which may compile kernels for seconds), so ``list`` shows the outcome a probe
gave in this environment before (any run or ``list --probe`` records one:
:mod:`harness.probecache`), or says it has not been probed (``available`` null in ``--json``).
``--probe`` runs the missing ones. Probes on the CPU are tiny eager calls and run as before."""

from __future__ import annotations

import json
import textwrap

from harness import registry, scenarios
from harness.cli.plugin_use import add_plugin_option, use_plugins
from harness.terminal import text_width, word_table

HEADER = ("name", "family", "status", "devices", "dtypes", "mask features", "time ~n^",
          "mem ~n^", "params")
ROW_LINES = 2  # a table row taller than this reads worse than a paragraph
INDENT = "    "  # the details of an implementation under its name (paragraph layout)
NOT_PROBED = ("its probe is a real call, which may compile kernels; any run records it, or: "
              "attnbench list --probe")


def add_cli(sub) -> None:
    """Add ``list``."""
    p = sub.add_parser("list", help="every implementation, available or not, and why")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--probe", action="store_true",
                   help="run every availability probe now, on the GPU too (may compile kernels)")
    add_plugin_option(p)
    p.set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    use_plugins(args.plugin)
    impls = [_describe(i, args.probe) for i in registry.all_implementations()]
    if args.json:
        print(json.dumps(impls, indent=2))
        return 0
    print(render(impls, registry.load_errors(), text_width()))
    return 0


def render(impls: list[dict], load_errors: dict[str, str], width: int) -> str:
    """The listing of ``impls`` (:func:`_describe` dicts) in ``width`` columns: the table when
    its columns fit, else a paragraph per implementation; then the reasons an implementation
    is unavailable, the scenarios' baselines and the plug-ins that failed to load, each wrapped."""
    available = sum(d["available"] is True for d in impls)
    lines = [f"attnbench implementations: {len(impls)}, {available} available here", ""]
    rows = [_cells(d) for d in impls]
    table = word_table(HEADER, rows, width, max_lines=ROW_LINES)
    if table is not None:
        lines.append(table)
        notes = [f"{d['name']}: {d['status'].removeprefix('unavailable: ')}"
                 for d in impls if d["available"] is False]
        lines += ["", "unavailable here:"] if notes else []
        lines += [_wrap(n, width, INDENT, 2 * INDENT) for n in notes]
        unknown = [f"{d['name']}: {d['status']}" for d in impls if d["available"] is None]
        lines += ["", "not probed here yet:"] if unknown else []
        lines += [_wrap(n, width, INDENT, 2 * INDENT) for n in unknown]
    else:
        lines += [_paragraph(d, width) for d in impls]
    lines += ["", _wrap(baselines_text(), width)]
    lines += [_wrap(f"plug-in {name}: {reason}", width) for name, reason in load_errors.items()]
    return "\n".join(lines)


def baselines_text() -> str:
    """The scenarios' own baselines (not attention cores), as their folders declare them."""
    named = [f"{impl} ({folder} scenario, {family})"
             for impl, (folder, family) in scenarios.declared_baselines().items()]
    return "scenario baselines (not attention cores): " + ", ".join(named)


def _cells(d: dict) -> list[str]:
    """One implementation's table cells (the status without its reason: listed under the
    table, where it can wrap at full width)."""
    status = {True: "available", False: "unavailable", None: "not probed"}[d["available"]]
    return [d["name"], d["family"], status,
            ", ".join(d["devices"]), ", ".join(d["dtypes"]), ", ".join(d["mask_features"]),
            f"{d['time_exponent']:g}", f"{d['memory_exponent']:g}", _params_text(d["params"])]


def _paragraph(d: dict, width: int) -> str:
    """One implementation as a few wrapped lines: name, family and status (with its reason),
    then cost, params, devices and dtypes, then mask features."""
    params = _params_text(d["params"])
    details = [
        f"time ~n^{d['time_exponent']:g}, memory ~n^{d['memory_exponent']:g}"
        + (f"; params {params}" if params else ""),
        f"devices {', '.join(d['devices'])}; dtypes {', '.join(d['dtypes'])}",
        "mask features: " + (", ".join(d["mask_features"]) or "none"),
    ]
    head = _wrap(f"{d['name']} ({d['family']}): {d['status']}", width, "", INDENT)
    return "\n".join([head, *(_wrap(t, width, INDENT, INDENT) for t in details)])


def _wrap(text: str, width: int, first: str = "", rest: str = INDENT) -> str:
    """``text`` wrapped at spaces to ``width`` (a word longer than a line stays whole)."""
    return "\n".join(textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                                   break_long_words=False, break_on_hyphens=False))


def _describe(impl, probe: bool = False) -> dict:
    """One implementation as ``list`` shows it; ``probe``: run its probe on a GPU too."""
    found = impl.availability_here(run_probe=lambda device: probe or device == "cpu")
    if not found.known:
        status = f"not probed on {found.device_type} here yet ({NOT_PROBED})"
    else:
        status = "available" if found.reason is None else f"unavailable: {found.reason}"
    return {
        "name": impl.name, "family": impl.family,
        "status": status,
        "available": found.available,
        "devices": sorted(impl.caps.devices),
        "dtypes": sorted(str(d).removeprefix("torch.") for d in impl.caps.dtypes),
        "mask_features": sorted(impl.caps.mask_features),
        "time_exponent": impl.cost.time_exponent, "memory_exponent": impl.cost.memory_exponent,
        "description": impl.description,
        "params": {name: {"default": p.default, "doc": p.doc, "minimum": p.minimum,
                          "maximum": p.maximum} for name, p in impl.params.items()},
        "approximate": impl.approximate,
        "recurrent": impl.recurrence is not None,
    }


def _params_text(params: dict) -> str:
    """Method parameters as a suite sets them: ``features=256, chunk_size=64`` (defaults)."""
    return ", ".join(f"{name}={p['default']:g}" for name, p in params.items())
