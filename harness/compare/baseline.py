"""Committed baselines: ``results/baselines/<device-fingerprint-slug>/<suite>/`` holding a copy of
a run's ``rows.jsonl`` and ``env.json``, and the lookup of the baseline for a machine and suite.

A baseline is filed under its machine key (:func:`machine_key`: env.json's device fingerprint,
or one derived from the environment) and found by it, falling back to the closest baseline on
the same device kind. ``attnbench baseline save|find|list`` (:mod:`harness.cli.baseline`) are
the commands.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness import fmt
from harness.results import (
    ENV_FILE,
    ROWS_FILE,
    ResultsError,
    load_env,
    read_run,
    warn_problems,
)

DEFAULT_ROOT = Path("results/baselines")
_SLUG_MAX = 80


def machine_key(env: dict) -> str:
    """The machine a run's baseline is filed under: its device fingerprint,
    ``env["fingerprint"]``, when present, else one derived from device kind, device name,
    thread count and torch version."""
    if env.get("fingerprint"):
        return str(env["fingerprint"])
    parts = [
        str(env.get("device") or "unknown"),
        str(env.get("device_name") or "unknown"),
        f"{env['threads']}threads" if env.get("threads") is not None else "",
        f"torch{env['torch']}" if env.get("torch") else "",
    ]
    return " ".join(p for p in parts if p)


def slug(text: str) -> str:
    """A directory-safe name: lowercase ``[a-z0-9.-]``; long names end in a short hash."""
    out = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "unknown"
    if len(out) > _SLUG_MAX:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        out = f"{out[: _SLUG_MAX - 9].rstrip('-.')}-{digest}"
    return out


def run_suite(run_dir: Path, env: dict) -> str:
    """The run's suite name: env.json's ``suite``, else the rows' single ``suite`` value."""
    if env.get("suite"):
        return str(env["suite"])
    suites = {str(r["suite"]) for r in read_run(run_dir).rows if r.get("suite")}
    if len(suites) != 1:
        raise ResultsError(f"{run_dir}: cannot tell the suite (found {sorted(suites) or 'none'})")
    return suites.pop()


def baseline_dir(root: Path, env: dict, suite: str) -> Path:
    """Where the baseline for ``env``'s machine and ``suite`` lives under ``root``."""
    return Path(root) / slug(machine_key(env)) / slug(suite)


def save_baseline(
    run_dir: Path | str, root: Path | str = DEFAULT_ROOT, force: bool = False
) -> Path:
    """Copy a run's usable rows (as the loader reads them) and env.json to its baseline
    directory; an interrupted run (partial rows) is refused."""
    run_dir = Path(run_dir)
    env = load_env(run_dir)
    run = read_run(run_dir)
    if run.partial:
        partial = fmt.plural(run.partial, "partial point")
        raise ResultsError(f"{run_dir}: an interrupted run ({partial}) cannot be a baseline; "
                           "finish it with `attnbench run --resume`")
    warn_problems(run)
    rows = list(run.rows)
    target = baseline_dir(Path(root), env, run_suite(run_dir, env))
    if (target / ROWS_FILE).exists() and not force:
        raise ResultsError(f"{target}: a baseline exists already (pass --force to replace it)")
    target.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows)
    (target / ROWS_FILE).write_text(text, encoding="utf-8")
    (target / ENV_FILE).write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")
    return target


@dataclass(frozen=True)
class BaselineInfo:
    """A stored baseline: where it is, its machine key (:func:`machine_key`), suite and
    environment."""

    path: Path
    machine: str
    suite: str
    env: dict


def list_baselines(root: Path | str = DEFAULT_ROOT) -> list[BaselineInfo]:
    """Every ``<root>/<machine>/<suite>/`` directory holding rows and env.json."""
    out = []
    for env_path in sorted(Path(root).glob(f"*/*/{ENV_FILE}")):
        path = env_path.parent
        if not (path / ROWS_FILE).is_file():
            continue
        try:
            env = load_env(path)
        except ResultsError:
            continue
        out.append(BaselineInfo(path, machine_key(env), str(env.get("suite") or path.name), env))
    return out


def _similarity(a: dict, b: dict) -> tuple[int, ...]:
    """How alike two environments are, most important first (for a fallback baseline)."""
    same = [a.get(key) == b.get(key) for key in ("device_name", "threads", "torch")]
    return tuple(int(s) for s in same)


def find_baseline(env: dict, suite: str, root: Path | str = DEFAULT_ROOT) -> tuple[Path, bool]:
    """The baseline for this machine and suite: ``(path, exact)``; ``exact`` is False when no
    machine key matches and the closest baseline on the same device kind is returned."""
    candidates = [b for b in list_baselines(root) if b.suite == suite]
    want = machine_key(env)
    for info in candidates:
        if info.machine == want:
            return info.path, True
    same_kind = [b for b in candidates if b.env.get("device") == env.get("device")]
    if not same_kind:
        known = ", ".join(str(b.path) for b in candidates) or "none"
        raise ResultsError(
            f"no baseline for suite {suite!r} on {want!r} under {root} (for this suite: {known})"
        )
    best = max(same_kind, key=lambda b: _similarity(b.env, env))
    return best.path, False
