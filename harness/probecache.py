"""What availability probes found, remembered per environment, so ``attnbench list`` can say it
on a GPU without running them: plain values (an implementation's name, a device type, the
reason its probe gave or None) that the registry records (:func:`remember`) and asks for
(:func:`recall`). This module runs no probe and holds no registry object.

A probe (:func:`harness.registry.register`'s ``probe``) is one tiny real call, which the
registry runs once per process and device type; on a GPU that may compile kernels
(flash-linear-attention's Triton kernels take seconds each on a cold cache).
Each outcome a probe gives is written to ``<cache>/probes/<fingerprint>.json``, keyed by the
implementation and device type. The fingerprint (:func:`environment`) holds what decides
whether a backend runs: Python, torch and its CUDA, every installed distribution and its
version (a reinstalled wheel changes it; :func:`install_paths`), the driver and the GPU models.
Another environment reads another file, so an outcome is never carried to a machine or install
it was not found on.

``<cache>`` is ``$ATTNBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnbench``, else
``~/.cache/attnbench``. The files are JSON data, never executed; a cache that cannot be read
or written is no cache (never an error).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import site
import tempfile
from pathlib import Path

import torch

CACHE_ENV = "ATTNBENCH_CACHE_DIR"


def cache_dir() -> Path:
    """Where probe outcomes are kept (module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnbench"


def install_paths() -> list[str]:
    """Where the installed distributions are: PYTHONPATH and the interpreter's site folders.
    Not ``sys.path``, where imported packages add folders at run time (``import ray`` adds
    its ``thirdparty_files``, setuptools its ``_vendor``): the fingerprint would then depend on
    what a process happened to import, and another process would miss the cache."""
    paths = [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    return [p for p in dict.fromkeys(paths) if p and os.path.isdir(p)]


@functools.cache
def environment() -> dict:
    """What a probe's outcome depends on, read once per process (no kernel is launched; on a
    GPU machine the device names initialize CUDA)."""
    installed = sorted({  # a set: a folder twice on the path lists its distributions twice
        f"{d.metadata['Name']}=={d.version}"
        for d in importlib.metadata.distributions(path=install_paths())
    })
    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "distributions": hashlib.sha256("\n".join(installed).encode()).hexdigest()[:16],
        "cuda_available": torch.cuda.is_available(),
    }
    if env["cuda_available"]:
        try:
            count = torch.cuda.device_count()
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
        except Exception as exc:  # no usable driver: that too is part of the environment
            env["gpus"] = f"unreadable: {type(exc).__name__}"
        env["driver"] = _driver()
    return env


def _driver() -> str | None:
    """The NVIDIA driver's version (NVML; else torch's CUDA build's own reading; else None)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # no NVML here: ask the CUDA runtime through torch, if it can
        try:
            return str(torch._C._cuda_getDriverVersion())
        except Exception:
            return None


def fingerprint(env: dict | None = None) -> str:
    """A short hash of :func:`environment`: the name of its cache file."""
    blob = json.dumps(env if env is not None else environment(), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _path() -> Path:
    return cache_dir() / "probes" / f"{fingerprint()}.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    outcomes = data.get("outcomes") if isinstance(data, dict) else None
    return outcomes if isinstance(outcomes, dict) else {}


def recall(name: str, device_type: str) -> tuple[bool, str | None]:
    """(known, reason): whether a probe of ``name`` on ``device_type`` ran in this environment,
    and the reason it gave (None: it passed)."""
    outcomes = _read(_path())
    key = f"{name}/{device_type}"
    if key not in outcomes or not isinstance(outcomes[key], str | None):
        return False, None
    return True, outcomes[key]


def remember(name: str, device_type: str, reason: str | None) -> None:
    """Record a probe's outcome for this environment (atomically: a reader sees the old file
    or the new one; two writers at once may lose one entry, which the next probe restores).
    A reason that is this process's fault (:func:`process_fault`) is not the environment's:
    it is not recorded."""
    if process_fault(reason):
        return
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        outcomes = _read(path)
        outcomes[f"{name}/{device_type}"] = reason
        text = json.dumps({"environment": environment(), "outcomes": outcomes}, indent=1)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as fh:
            fh.write(text)
        os.replace(fh.name, path)
    except OSError:
        pass  # a read-only home: listing on a GPU says "not probed", as before any probe


def process_fault(reason: str | None) -> bool:
    """A probe that failed on a CUDA error says more about this process's CUDA context (a
    fault earlier in it poisons every later call) than about the backend: :func:`remember`
    keeps no such reason."""
    return reason is not None and ("CUDA error" in reason or "AcceleratorError" in reason)
