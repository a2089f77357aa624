"""Committed baselines: ``results/baselines/<device-fingerprint-slug>/<suite>/`` holding a copy of
a run's ``rows.jsonl`` and ``env.json``, and the lookup of the baseline for a machine and suite.

``attnbench baseline save RUN_DIR`` writes one; ``attnbench baseline find RUN_DIR`` prints the
baseline directory that matches a run's device fingerprint and suite (falling back to the
closest one on the same device kind, with a warning); ``attnbench baseline list`` lists them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import CliError
from harness.results import ENV_FILE, ROWS_FILE, ResultsError, iter_rows, load_env, rows_path

DEFAULT_ROOT = Path("results/baselines")
_SLUG_MAX = 80


def fingerprint(env: dict) -> str:
    """The device fingerprint of a run: ``env["fingerprint"]`` when present, else derived from
    device kind, device name, thread count and torch version."""
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
    suites = {str(r["suite"]) for r in iter_rows(rows_path(run_dir)) if r.get("suite")}
    if len(suites) != 1:
        raise ResultsError(f"{run_dir}: cannot tell the suite (found {sorted(suites) or 'none'})")
    return suites.pop()


def baseline_dir(root: Path, env: dict, suite: str) -> Path:
    """Where the baseline for ``env``'s machine and ``suite`` lives under ``root``."""
    return Path(root) / slug(fingerprint(env)) / slug(suite)


def save_baseline(
    run_dir: Path | str, root: Path | str = DEFAULT_ROOT, force: bool = False
) -> Path:
    """Copy a run's rows (complete JSON lines only) and env.json to its baseline directory."""
    run_dir = Path(run_dir)
    env = load_env(run_dir)
    rows = list(iter_rows(rows_path(run_dir)))
    if not rows:
        raise ResultsError(f"{run_dir}: no rows to save as a baseline")
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
    """A stored baseline: where it is, its fingerprint, suite and environment."""

    path: Path
    fingerprint: str
    suite: str
    env: dict


def list_baselines(root: Path | str = DEFAULT_ROOT) -> list[BaselineInfo]:
    """Every ``<root>/<fingerprint>/<suite>/`` directory holding rows and env.json."""
    out = []
    for env_path in sorted(Path(root).glob(f"*/*/{ENV_FILE}")):
        path = env_path.parent
        if not (path / ROWS_FILE).is_file():
            continue
        try:
            env = load_env(path)
        except ResultsError:
            continue
        out.append(BaselineInfo(path, fingerprint(env), str(env.get("suite") or path.name), env))
    return out


def _similarity(a: dict, b: dict) -> tuple[int, ...]:
    """How alike two environments are, most important first (for a fallback baseline)."""
    same = [a.get(key) == b.get(key) for key in ("device_name", "threads", "torch")]
    return tuple(int(s) for s in same)


def find_baseline(env: dict, suite: str, root: Path | str = DEFAULT_ROOT) -> tuple[Path, bool]:
    """The baseline for this machine and suite: ``(path, exact)``; ``exact`` is False when no
    fingerprint matches and the closest baseline on the same device kind is returned."""
    candidates = [b for b in list_baselines(root) if b.suite == suite]
    want = fingerprint(env)
    for info in candidates:
        if info.fingerprint == want:
            return info.path, True
    same_kind = [b for b in candidates if b.env.get("device") == env.get("device")]
    if not same_kind:
        known = ", ".join(str(b.path) for b in candidates) or "none"
        raise ResultsError(
            f"no baseline for suite {suite!r} on {want!r} under {root} (for this suite: {known})"
        )
    best = max(same_kind, key=lambda b: _similarity(b.env, env))
    return best.path, False


def _cmd_save(args: argparse.Namespace) -> int:
    try:
        path = save_baseline(args.run_dir, args.root, force=args.force)
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    print(path)
    return 0


def _cmd_find(args: argparse.Namespace) -> int:
    try:
        env = load_env(args.run_dir)
        suite = args.suite or run_suite(Path(args.run_dir), env)
        path, exact = find_baseline(env, suite, args.root)
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    if not exact:
        if args.exact:
            raise CliError(f"no baseline with fingerprint {fingerprint(env)!r} for suite {suite!r}")
        print(
            f"attnbench: warning: no baseline for fingerprint {fingerprint(env)!r}; "
            f"using the closest, {path}",
            file=sys.stderr,
        )
    print(path)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    for info in list_baselines(args.root):
        print(f"{info.path}\t{info.suite}\t{info.fingerprint}")
    return 0


def add_baseline_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``baseline save|find|list``; each sets ``func(args) -> exit code``."""
    parser = subparsers.add_parser("baseline", help="save or find committed baselines")
    sub = parser.add_subparsers(dest="baseline_command", required=True)
    save = sub.add_parser("save", help="copy a run to results/baselines/<fingerprint>/<suite>/")
    save.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    save.add_argument("--force", action="store_true", help="replace an existing baseline")
    find = sub.add_parser("find", help="print the baseline directory matching a run")
    find.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    find.add_argument("--suite", help="suite name (default: the run's)")
    find.add_argument("--exact", action="store_true", help="fail unless the fingerprint matches")
    listing = sub.add_parser("list", help="list stored baselines")
    for p in (save, find, listing):
        p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="default: %(default)s")
    save.set_defaults(func=_cmd_save)
    find.set_defaults(func=_cmd_find)
    listing.set_defaults(func=_cmd_list)
