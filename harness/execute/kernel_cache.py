"""A warmed Triton cache for a CUDA session (``attnbench verdicts --device cuda``): installed
before any kernel compiles when one is given (``ATTNBENCH_TRITON_CACHE=DIR``) or carried in
the checkout (``.triton-cache/``, made by ``lease/warm_cache.py``), and every compile
of the session counted (hits and misses), as docs/lease.md describes for a lease.

The cache tools live in the checkout's ``lease/`` (``triton_cache.py``, and
``triton_listen/triton_misses.py``: the compile listener, standard library only); they are read
from there by path, so an installation without the checkout says so and compiles as kernels
launch. On a CPU nothing here runs.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

from harness import PROJECT_DIR

CACHE_ENV = "ATTNBENCH_TRITON_CACHE"  # a warmed cache folder (cache.tar.gz + manifest.json)
CARRIED = PROJECT_DIR / ".triton-cache"
TOOLS = PROJECT_DIR / "lease"
COMPILES_FILE = "triton-compiles.jsonl"  # one line per compile of the session (under --out)


def _load(path: Path, name: str) -> ModuleType | None:
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install(out: Path) -> list[str]:
    """Install the warmed cache (if one is given or carried and matches this machine) into
    ``TRITON_CACHE_DIR`` and start counting compiles into ``out/triton-compiles.jsonl``; the
    lines say what happened."""
    tools = _load(TOOLS / "triton_cache.py", "_attnbench_triton_cache")
    misses = _load(TOOLS / "triton_listen" / "triton_misses.py", "_attnbench_triton_misses")
    if tools is None or misses is None:
        return [
            f"triton cache: {TOOLS} is not here (an installed package): kernels compile "
            "as they launch, not counted"
        ]
    os.environ.setdefault("TRITON_CACHE_DIR", tools.CACHE_DIR)
    folder = Path(os.environ.get(CACHE_ENV) or CARRIED)
    said = (
        tools.install(folder, Path(os.environ["TRITON_CACHE_DIR"]), tools.running_facts())
        if folder.is_dir()
        else [
            f"triton cache: none given ({CACHE_ENV}) or carried "
            f"({CARRIED}): kernels compile as they launch"
        ]
    )
    os.environ[misses.ENV] = str(out / COMPILES_FILE)
    try:
        import triton.knobs as knobs  # the listener Triton calls on every compile
    except ImportError:
        return [*said, "triton is not installed: no kernel compiles to count"]
    previous = getattr(knobs.compilation, "listener", None)

    def listener(**kwargs):
        misses.record(**kwargs)
        if previous is not None:
            previous(**kwargs)

    knobs.compilation.listener = listener
    return said


def summary(out: Path) -> str | None:
    """``triton: 12 compiles, 12 hits, 0 misses`` of the session (None when none counted)."""
    misses = _load(TOOLS / "triton_listen" / "triton_misses.py", "_attnbench_triton_misses")
    path = out / COMPILES_FILE
    if misses is None or not path.is_file():
        return None
    c = misses.count(path)
    kernels = ", ".join(f"{k} x{n}" for k, n in sorted(c["kernels"].items()))
    return f"triton: {c['compiles']} compiles, {c['hits']} cache hits, {c['misses']} misses" + (
        f" ({c['miss_s']:.0f} s compiling: {kernels})" if c["misses"] else ""
    )
