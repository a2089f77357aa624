"""Plug-ins from single files: ``attnbench run --plugin path/to/file.py`` and the
``ATTNBENCH_PLUGINS`` environment variable (paths separated by ``os.pathsep``, ``:`` on Linux).

A plug-in file is a Python file that calls :func:`harness.registry.register` at import, like a
module of the ``implementations`` package; no package or entry point is needed (installed
packages still register through the ``attnbench.implementations`` entry-point group). Each file
is imported once per process under a private module name; its implementations behave like the
built-in ones (``attnbench list`` shows them, suites name them).

Every mistake is one line naming the file (:class:`PluginError`, exit status 2): a missing
file, a syntax error (with its line), an exception at import, a file that registers nothing,
and a name registered twice (both files named). The reference contract of an approximation
(:func:`reference_contract`) is checked when its file is loaded, once, not at every point.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from harness.errors import CliError, first_line

PLUGINS_ENV = "ATTNBENCH_PLUGINS"
_LOADED: dict[Path, list[str]] = {}  # resolved file -> names it registered
_DIGESTS: dict[Path, str] = {}  # resolved file -> sha256 of the bytes it was imported from


class PluginError(CliError):
    """A plug-in file that cannot be used (exit status 2): the message names the file."""


class ContractError(ValueError):
    """A registration that breaks the registry's contract (a name taken, a ``reference=``
    that cannot be called as the oracle calls it): raised by ``register`` at import."""


def env_files(environ: dict[str, str] | None = None) -> list[Path]:
    """The files ``ATTNBENCH_PLUGINS`` names (empty entries ignored)."""
    text = (os.environ if environ is None else environ).get(PLUGINS_ENV, "")
    return [Path(part) for part in text.split(os.pathsep) if part.strip()]


def load_file(path: Path, registered: Callable[[], set[str]]) -> list[str]:
    """Import the plug-in file ``path``; the names it registered (``registered()``: the
    registry's names now). A file already loaded in this process is not imported again."""
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "no such file"
        raise PluginError(f"plug-in {path}: {why}")
    resolved = path.resolve()
    if resolved in _LOADED:
        return _LOADED[resolved]
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    name = f"attnbench_plugin_{path.stem.replace('-', '_')}_{digest}"
    content_digest = file_digest(resolved)
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise PluginError(f"plug-in {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    before = registered()
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise PluginError(f"plug-in {path}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except ContractError as exc:
        sys.modules.pop(name, None)
        raise PluginError(f"plug-in {path}: {str(exc).strip().splitlines()[0]}") from None
    except Exception as exc:  # whatever the file raised at import: one line, never a traceback
        sys.modules.pop(name, None)
        raise PluginError(f"plug-in {path}: {first_line(exc, 300)}") from None
    added = sorted(registered() - before)
    if not added:
        raise PluginError(f"plug-in {path}: registers no implementation (decorate its function "
                          "with @harness.registry.register(...))")
    _LOADED[resolved] = added
    _DIGESTS[resolved] = content_digest
    return added


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (hex): what ``env.json`` records of each plug-in file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def loaded_records() -> list[dict]:
    """The plug-in files this process imported, as ``env.json`` records them: ``path``
    (resolved), ``sha256`` of the bytes imported and the ``implementations`` each registered.
    A verb that reads rows later loads a recorded file again only while its bytes are the
    same (:func:`harness.cli.plugin_use.use_plugins`)."""
    return [{"path": str(path), "sha256": _DIGESTS.get(path), "implementations": names}
            for path, names in _LOADED.items()]


def load_files(paths: Iterable[Path], registered: Callable[[], set[str]]) -> list[str]:
    """:func:`load_file` on each path (duplicates once); every name they registered."""
    names: list[str] = []
    seen: set[Path] = set()
    for path in paths:
        key = path.resolve() if path.exists() else path
        if key not in seen:
            seen.add(key)
            names += load_file(path, registered)
    return names


def remember_for_children(paths: Iterable[Path]) -> None:
    """Add ``paths`` to ``ATTNBENCH_PLUGINS`` so child processes (``--isolate``, a compare's
    rerun in another process) load the same plug-ins."""
    have = [str(p) for p in env_files()]
    new = [str(Path(p).resolve()) for p in paths]
    merged = have + [p for p in new if p not in have]
    if merged:
        os.environ[PLUGINS_ENV] = os.pathsep.join(merged)


def origin(fn: Callable) -> str:
    """Where ``fn`` was defined, for messages: its file, else its module."""
    try:
        return inspect.getsourcefile(fn) or fn.__module__
    except TypeError:
        return getattr(fn, "__module__", "?")


def reference_signature_problem(reference: Callable) -> str | None:
    """Why ``reference`` cannot be called as ``reference(q, k, v, mask, rows=rows,
    **params)``; None when it can."""
    try:
        params = inspect.signature(reference).parameters.values()
    except (TypeError, ValueError):
        return None  # a builtin or C callable: the probe-time check decides
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_KEYWORD in kinds or any(p.name == "rows" for p in params):
        return None
    return ("reference= must accept rows= (None, or a 1-D long tensor of query rows; return "
            "only those rows): add `rows=None` to its signature")


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """``--plugin FILE`` (repeatable) on a subcommand."""
    parser.add_argument(
        "--plugin",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help=f"a Python file that registers implementations (repeatable; also {PLUGINS_ENV}, "
        "paths separated by ':')",
    )
