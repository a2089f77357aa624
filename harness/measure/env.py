"""The environment a run was measured in (``env.json``) and its device fingerprint."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
import sys
import uuid
from pathlib import Path

import torch

import harness
from harness.measure.device import Device


def tf32_state() -> dict:
    """What fp32 CUDA numbers depend on: whether matmuls and cuDNN may round to TF32 (~10
    mantissa bits instead of 23, several times the fp32 FLOP/s), read through torch's
    ``fp32_precision`` API where the process set it and the legacy flags otherwise.

    Once anything in the process has used the new API, reading a legacy flag raises
    ``RuntimeError`` ("mix of the legacy and new APIs"): each reading falls back to the other
    API and records None rather than failing the run."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return {
        "tf32_cuda_matmul": _tf32(matmul, lambda: matmul.allow_tf32),
        "tf32_cudnn": _tf32(cudnn, lambda: cudnn.allow_tf32),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision)
        or {"tf32": "high", "ieee": "highest"}.get(getattr(matmul, "fp32_precision", "none")),
        "fp32_precision_cuda_matmul": getattr(matmul, "fp32_precision", None),
        "fp32_precision_cudnn": getattr(cudnn, "fp32_precision", None),
    }


def _tf32(backend, legacy) -> bool | None:
    """TF32 allowed for ``backend``: its ``fp32_precision`` when set ("tf32" / "ieee"), else
    the legacy ``allow_tf32`` flag (None when neither can be read)."""
    precision = getattr(backend, "fp32_precision", "none")
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    return _read(legacy)


def _read(getter):
    try:
        return getter()
    except RuntimeError:  # legacy and new TF32 APIs mixed in this process
        return None


def git_state(cwd: Path | None = None) -> dict:
    """Commit sha and dirty flag of the checkout the harness runs from (None if not a repo)."""
    cwd = cwd or harness.PROJECT_DIR
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return {"git_sha": sha, "git_dirty": bool(dirty.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def fingerprint(info: dict) -> str:
    """Filesystem-safe id of the device numbers are comparable on, e.g. ``cpu-amd-epyc-t2``."""
    name = re.sub(r"[^a-z0-9]+", "-", str(info.get("device_name", "unknown")).lower()).strip("-")
    name = re.sub(r"-(processor|cpu|with-radeon-graphics)$", "", name)[:40]
    threads = f"-t{info['threads']}" if info.get("device") == "cpu" else ""
    return f"{info.get('device', 'cpu')}-{name}{threads}"


# environment variables that change what runs: attnbench's own (ATTNBENCH_AUTOTUNE pins the
# fused kernels' configs), Triton's and the visible devices
SETTINGS_ENV_PREFIXES = ("ATTNBENCH_", "TRITON_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


def settings_env() -> dict[str, str]:
    """The set environment variables of :data:`SETTINGS_ENV_PREFIXES`, by name."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(SETTINGS_ENV_PREFIXES)}


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def collect(
    device: Device, suite_name: str, suite_path: str, suite_fingerprint: str, run_id: str
) -> dict:
    """Everything needed to interpret (and refuse to mix) this run's numbers."""
    info = device.info()
    return {
        "run_id": run_id,
        "suite": suite_name,
        "suite_path": suite_path,
        "suite_fingerprint": suite_fingerprint,
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "harness_version": harness.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "mkl": torch.backends.mkl.is_available(),
        **tf32_state(),
        "fingerprint": fingerprint(info),
        # a contended machine explains noisy timings: record the 1/5/15-minute load at the start
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "settings_env": settings_env(),
        **info,
        **git_state(),
    }
