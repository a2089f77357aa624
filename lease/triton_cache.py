"""Triton's on-disk cache of the fused kernels: compiles on stand-in arguments, and the cache
as files (prune, pack, check, install, harvest). The device side of ``warm_cache.py``, beside it.

Needs only the standard library at import, Triton in the functions that compile or read
Triton's facts, and never torch: it runs in the device's Python with the device's Triton
(``warm_cache.DEVICE``) where no torch is installed, and on the lease before anything else.
A job (``warm_cache.compile_jobs``) is one launch: the kernel's module and name, its
arguments (a tensor as ``{"tensor": dtype, "aligned": bool}``, the rest as values) and its
keyword arguments with the config's. Its compile goes through the JIT's own binder
(``fn.warmup``) under a stand-in driver that names the arch, so the specialization is the one
a real launch gets (tests/lease/test_warm_cache.py checks the stand-ins against torch
tensors).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = "/tmp/attnbench-triton-cache"  # the same on both sides: group files hold paths
KEEP = ("__grp__", ".json", ".cubin")  # what a launch reads of a kernel's cache entry
HARVEST_LIMIT = 15 * 2**20  # $OUT takes 16 MiB a file
MANIFEST = "manifest.json"
ARCHIVE = "cache.tar.gz"
HARVEST = "harvest.tar.gz"  # a past lease's --harvest, copied into DIR


class _Dtype:
    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"  # Triton canonicalizes dtypes by this text


_DTYPES: dict[str, _Dtype] = {}  # one object per dtype, kept alive, as torch's dtypes are:
# with a fresh object per argument, Triton 3.6's binder typed some int32 table pointers as
# bf16 (compile errors that depended on the order of the jobs): it appears to cache a dtype's
# type by the object's id, which a freed object's successor may reuse


class _Arg:
    """A tensor argument as Triton's binder sees one: a dtype and an address's alignment."""

    def __init__(self, dtype: str, aligned: bool):
        self.dtype = _DTYPES.setdefault(dtype, _Dtype(dtype))
        self._ptr = 0 if aligned else 8

    def data_ptr(self) -> int:
        return self._ptr


def _import_kernels():
    """Import the kernel modules; where torch is absent, behind a stand-in that their import
    needs (``autotune`` reads torch only inside functions the compiles do not call)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        import types

        stub = types.ModuleType("torch")
        stub.Tensor = type("Tensor", (), {})
        sys.modules["torch"] = stub
        from implementations.triton_kernels import import_jit_modules

        import_jit_modules()
        del sys.modules["torch"]  # Triton's own optional imports must not find the stand-in


def run_job(job: dict, arch: int) -> dict:
    """Compile one job for ``arch`` into ``$TRITON_CACHE_DIR``: its name and seconds, or its
    error."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Target:  # the stand-in driver of aot_check._Target, without torch
        target = GPUTarget("cuda", arch, 32)

        def get_current_device(self):
            return arch

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return self.target

        def is_active(self):
            return True

    kernel = getattr(importlib.import_module(job["module"]), job["kernel"])
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    args = [_Arg(a["tensor"], a["aligned"]) if isinstance(a, dict) else a for a in job["args"]]
    start = time.monotonic()
    saved = getattr(driver, "_active", None)
    driver.set_active(Target())
    try:
        fn.warmup(*args, grid=(1,), **job["kwargs"])
        error = None
    except Exception as exc:  # one failing compile is its line; the others go on
        error = f"{type(exc).__name__}: {_last_line(exc)}"
    finally:
        driver._active = saved
    return {"step": job.get("step"), "kernel": job["kernel"], "config": job["config"],
            "head_dim": job["head_dim"], "seconds": round(time.monotonic() - start, 2),
            "error": error}


def _last_line(exc: Exception) -> str:
    """The line of a compile error that names the cause (Triton's ends with it, after the
    source excerpt), and its cause's."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    cause = exc.__cause__ or exc.__context__
    tail = f" ({type(cause).__name__}: {str(cause).strip()[-200:]})" if cause else ""
    return (lines[-1][:200] if lines else "") + tail


def compile_all(jobs: list[dict], arch: int, workers: int) -> dict:
    """Compile every job over ``workers`` processes (fork: the kernels imported once):
    ``{"rows": one per job, "facts": device_facts(arch)}``."""
    import multiprocessing

    sys.path.insert(0, str(ROOT))
    _import_kernels()
    with multiprocessing.get_context("fork").Pool(max(workers, 1)) as pool:
        rows = pool.starmap(run_job, [(job, arch) for job in jobs])
    return {"rows": rows, "facts": device_facts(arch)}


def device_facts(arch: int) -> dict:
    """What Triton's cache key holds of this Python and Triton: version, key hash, ptxas."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.nvidia.compiler import get_ptxas, get_ptxas_version
    from triton.runtime.cache import triton_key

    return {"triton": triton.__version__,
            "triton_key": hashlib.sha256(triton_key().encode()).hexdigest(),
            "ptxas": get_ptxas_version(arch), "ptxas_path": get_ptxas(arch).path,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "arch": f"sm_{arch}", "env": get_cache_invalidating_env_vars()}


# -- the cache as files ---------------------------------------------------------------------

def kept(name: str) -> bool:
    """Whether a cache file is one a launch reads (group, metadata, cubin)."""
    return name.startswith(KEEP[0]) or name.endswith(KEEP[1:])


def prune(cache: Path) -> tuple[int, int]:
    """Delete every file of ``cache`` but :func:`kept` ones; (kept, deleted)."""
    counts = [0, 0]
    for path in cache.rglob("*"):
        if path.is_file():
            keep = kept(path.name)
            counts[not keep] += 1
            if not keep:
                path.unlink()
    return counts[0], counts[1]


def pack(cache: Path, archive: Path) -> int:
    """Pack ``cache``'s files, by relative path, into a .tar.gz; the number of files."""
    files = sorted(p for p in cache.rglob("*") if p.is_file())
    with tarfile.open(archive, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(cache)))
    return len(files)


def mismatch(manifest: dict, facts: dict) -> str | None:
    """Why a manifest's cache cannot hit here (None: it can)."""
    for field in ("triton", "python", "ptxas", "triton_key", "arch", "env"):
        want, have = manifest.get(field), facts.get(field)
        if field == "arch" and have is None:
            continue  # no GPU visible: the arch is not checked
        if want != have:
            show = lambda v: " ".join(str(v).split())[:80]
            return (f"compiling: cache is for {field} {show(want)}, this machine has "
                    f"{show(have)}; not installed")
    return None


def install(folder: Path, target: Path, facts: dict) -> list[str]:
    """Install ``folder``'s cache (and a harvest beside it) into ``target`` when its manifest
    matches ``facts``, else nothing; one line per archive that says which."""
    said = []
    for archive in (ARCHIVE, HARVEST):
        path = folder / archive
        if not path.exists():
            continue
        try:
            with tarfile.open(path) as tar:
                if archive == HARVEST:
                    manifest = json.load(tar.extractfile(MANIFEST))
                else:
                    manifest = json.loads((folder / MANIFEST).read_text())
                why = mismatch(manifest, facts)
                if why:
                    said.append(f"{why} ({archive})")
                    continue
                count = _extract(tar, target)
                said.append(f"triton cache: {count} files of {archive} installed in {target}")
        except (OSError, KeyError, ValueError, TypeError, tarfile.TarError) as exc:
            said.append(f"compiling: cache is for nothing readable ({archive}: {exc})")
    return said or [f"compiling: cache is for nothing ({folder} holds no {ARCHIVE})"]


def _extract(tar: tarfile.TarFile, target: Path) -> int:
    """Extract a cache archive: Triton's files into ``target``, a harvest's ``inductor/`` into
    Inductor's cache folder."""
    inductor = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                    or f"/tmp/torchinductor_{os.environ.get('USER', 'root')}")
    count = 0
    for member in tar.getmembers():
        if not member.isfile() or member.name == MANIFEST:
            continue
        top, _, rest = member.name.partition("/")
        where, member.name = ((inductor, rest) if top == "inductor" else
                              (target, rest) if top == "triton" else (target, member.name))
        tar.extract(member, where, filter="data")
        count += 1
    return count


def harvest(archive: Path, cache: Path, facts: dict) -> str:
    """Pack what this lease built for the next one (see the module docstring)."""
    inductor = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                    or f"/tmp/torchinductor_{os.environ.get('USER', 'root')}")
    files = [(p, f"triton/{p.relative_to(cache)}") for p in sorted(cache.rglob("*"))
             if p.is_file() and (kept(p.name) or p.suffix == ".so")]
    files += [(p, f"inductor/{p.relative_to(inductor)}") for p in sorted(inductor.rglob("*"))
              if p.is_file()] if inductor.is_dir() else []
    total, packed = 0, 0
    with tarfile.open(archive, "w:gz") as tar:
        data = json.dumps(facts, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path, name in files:  # Triton's first: the kernels and launchers beat Inductor's
            size = path.stat().st_size
            if total + size > HARVEST_LIMIT:
                continue
            total += size
            packed += 1
            tar.add(path, arcname=name)
    return (f"harvest: {packed} of {len(files)} files ({total / 2**20:.1f} MiB before "
            f"compression) in {archive}")


def running_facts() -> dict:
    """:func:`device_facts` of this process, for GPU 0's arch when torch sees a GPU."""
    arch = 90
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            arch = major * 10 + minor
            return device_facts(arch)
    except ImportError:
        pass
    facts = device_facts(arch)
    facts["arch"] = None  # no GPU visible: the arch is not checked
    return facts
