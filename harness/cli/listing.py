"""``attnbench list``: every implementation, available or not, and why, with its method
parameters at their defaults (suites set and sweep them by name); plug-ins whose entry
point failed to load are listed with the error. The table fits the terminal's width and is never
cut in a file or a pipe.

Listing launches nothing on a GPU: an optional backend's availability there comes from a probe
(one real call, which may compile kernels for seconds), so ``list`` shows the outcome a probe
gave in this environment before (any run or ``list --probe`` records one:
:mod:`harness.probecache`), or says it has not been probed. ``--probe`` runs the missing ones.
Probes on the CPU are tiny eager calls and run as before."""

from __future__ import annotations

import json

from rich.table import Table

from harness import registry
from harness.terminal import console


def add_cli(sub) -> None:
    """Add ``list``."""
    p = sub.add_parser("list", help="every implementation, available or not, and why")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--probe", action="store_true",
                   help="run every availability probe now, on the GPU too (may compile kernels)")
    p.set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    impls = registry.all_implementations()
    probe = args.probe
    if args.json:
        print(json.dumps([_describe(i, probe) for i in impls], indent=2))
        return 0
    table = Table(title="attnbench implementations", show_lines=False)
    for col in ("name", "family", "status", "devices", "dtypes", "mask features",
                "time~n^", "mem~n^", "params"):
        table.add_column(col, overflow="fold")  # wrap in a narrow terminal, never cut
    for impl in impls:
        d = _describe(impl, probe)
        table.add_row(d["name"], d["family"], d["status"], ", ".join(d["devices"]),
                      ", ".join(d["dtypes"]), ", ".join(d["mask_features"]),
                      f"{d['time_exponent']:g}", f"{d['memory_exponent']:g}",
                      _params_text(d["params"]))
    out = console()
    out.print(table)
    out.print("block-scenario mixers (baselines, not attention cores): lstm, conv")
    for name, reason in registry.load_errors().items():
        out.print(f"plug-in {name}: {reason}", markup=False)
    return 0


def _describe(impl, probe: bool = False) -> dict:
    """One implementation as ``list`` shows it; ``probe``: run GPU probes too."""
    found = impl.availability_here(run_probe=lambda device: probe or device == "cpu")
    if not found.known:
        status = (f"not probed on {found.device_type} here yet (a real call, which may compile "
                  "kernels; any run records it, or: attnbench list --probe)")
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
