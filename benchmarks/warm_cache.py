"""Triton's on-disk cache for sm_90, compiled on a CPU and carried to a GPU lease.

    python benchmarks/warm_cache.py --arch sm_90 --out DIR    # here: warm, prune, write DIR
    python benchmarks/warm_cache.py --install DIR             # on the lease, before the proof
    python benchmarks/warm_cache.py --harvest FILE.tar.gz     # on the lease, at its end

Warming: every launch of the fused kernels that the GPU proof's suites make (``SUITES``: each
CUDA point of a fused implementation, recorded from the real launch code on meta tensors by
``aot_check.record`` with the point's batch, heads, lengths, head dim, dtype and mask), with
every config the autotuner may time for the arch (the class list the prune keeps; the pinned
default is its first), is compiled through the JIT's own binder (``fn.warmup`` under a
stand-in driver) into ``CACHE_DIR``, the path the lease uses too (Triton's group files hold
absolute paths). The compiles run in ``--python`` (default ``.venv312/bin/python`` when it
exists): Triton's key hashes ``libtriton.so``, which differs per CPython minor, so that Python
must be the device's (``DEVICE``) with the device's Triton; it needs no torch (the arguments
are stand-ins with ``data_ptr`` and ``dtype``). The cache is pruned to ``__grp__*.json``,
``*.json`` and ``*.cubin`` and packed as ``DIR/cache.tar.gz`` beside ``DIR/manifest.json``
(the Triton key's sha256, ``ptxas --version``, Python, arch, the cache-invalidating variables
that were set, the kernels).

Installing checks the manifest against the running Triton (key, ptxas, Python minor, arch of
GPU 0 when torch sees one, those variables) and unpacks into ``$TRITON_CACHE_DIR`` (which must
be ``CACHE_DIR``), or prints one line ``compiling: cache is for ...`` and installs nothing;
exit 0 either way. ``DIR/harvest.tar.gz`` (a past lease's ``--harvest``) is installed the
same way, by its own manifest. Harvesting packs what a lease built that a CPU cannot: the
launcher ``.so`` files, the autotuner's json (``TRITON_CACHE_AUTOTUNING=1``), the kernels the
lease compiled, and Inductor's cache, under ``HARVEST_LIMIT`` bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # triton_cache, beside this file

import triton_cache as tc

ROOT = tc.ROOT
DEVICE = {"python": "3.12", "triton": "3.6.0"}  # the leases' (docs/gpu.md, FACTS.md)
ARCHES = {"sm_90": 90, "sm_80": 80}
SUITES = ("gpu-smoke", "gpu-smoke-decode", "claims-gpu", "claims-linear-gpu", "claims-gpu-local",
          "claims-gpu-decode", "claims-linear-gpu-decode", "claims-gpu-heads", "claims-gpu-block")
BAND = {"local", "dilated", "longformer", "bigbird", "flash-tiled"}  # triton_attention
FEATURE = {"linear": False, "performer": True}  # feature_attention: FAVOR+ or not


# -- which compiles (the project's Python: torch, the harness) --------------------------------

def suite_shapes(suites: tuple[str, ...] = SUITES) -> list[tuple]:
    """The fused calls of the suites' CUDA points, once each: (batch, head dim, dtype, shape)
    with shape as ``aot_check.record`` takes it. A decode point calls its core once per step
    at positions seq_len .. seq_len + gen_tokens - 1 (the timed step is the first); a
    ``state`` cache steps its recurrence (no fused call)."""
    from harness.scenarios.decode.caches import CACHES
    from harness.spec import torch_dtype
    from harness.sweep.suite import load_suite

    calls: dict[tuple, tuple] = {}
    for name in suites:
        for point in load_suite(ROOT / "suites" / f"{name}.toml").points:
            if point.device != "cuda" or point.impl not in BAND | set(FEATURE):
                continue
            if point.scenario == "decode":
                cache = CACHES[point.settings.cache]
                if cache.__name__ == "StateCache":
                    continue
                problems = [point.attention_call(*cache.step_call(pos, point.mask))
                            for pos in range(point.seq_len,
                                             point.seq_len + point.settings.gen_tokens)]
            else:
                problems = [point.problem()]
            for p in problems:
                shape = _fused_shape(point.impl, p)
                if shape is not None:
                    dtype = torch_dtype(p.dtype)
                    calls.setdefault((p.batch, p.head_dim, str(dtype), repr(shape)),
                                     (p.batch, p.head_dim, dtype, shape))
    return list(calls.values())


def _fused_shape(impl: str, p) -> tuple | None:
    """``p``'s workload as ``aot_check.record`` takes it, or None when ``impl`` runs it
    without the fused kernels."""
    from harness.spec import torch_dtype
    from implementations.triton_kernels import feature_attention, fused_path, masked_attention

    if (impl in BAND and fused_path.covers(torch_dtype(p.dtype), p.head_dim)
            and not masked_attention.masked_reasons(p)):
        return (p.mask, p.n_q, p.n_k, p.heads, p.n_kv_heads, p.backward)
    if impl in FEATURE and feature_attention.runs_fused(p):
        m = int(p.param("features", 256)) if FEATURE[impl] else 0
        return (m, p.n_k, p.heads, p.n_kv_heads, p.n_q)
    return None


def _encode(value):
    import torch

    if isinstance(value, torch.Tensor):
        # a meta tensor's data_ptr is its storage offset in bytes (from 0): a view the launch
        # code makes at an offset is unaligned here as on the GPU, a fresh tensor aligned
        return {"tensor": str(value.dtype).removeprefix("torch."),
                "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot carry a {type(value).__name__} argument to the compile")


def compile_jobs(arch: str, suites: tuple[str, ...] = SUITES) -> list[dict]:
    """One job per distinct (kernel, config, constexprs, specialization) the suites launch:
    the specialization as Triton's key takes it (``launch_modes.specialization`` for the
    scalars; a tensor's dtype and alignment)."""
    from implementations.triton_kernels import aot_check, autotune, launch_modes

    modules = {name: module.__name__ for module, name in aot_check.KERNELS}
    jobs, seen = [], set()
    for batch, d, dtype, shape in suite_shapes(suites):
        for launch in aot_check.record(f"suite-D{d}", d, batch, shape, dtype):
            args = [_encode(a) for a in launch.args]
            spec = tuple(tuple(a.values()) if isinstance(a, dict)
                         else launch_modes.specialization(a) for a in args)
            for cfg in aot_check.listed(launch, arch) or aot_check.configs(launch, arch):
                extra = cfg.all_kwargs() if hasattr(launch.kernel, "configs") else {}
                label = autotune.config_label(cfg)
                key = (launch.name, label, tuple(sorted(launch.kwargs.items())), spec)
                if key not in seen:
                    seen.add(key)
                    jobs.append({"module": modules[launch.name], "kernel": launch.name,
                                 "config": label, "head_dim": d, "args": args,
                                 "kwargs": {**launch.kwargs, **extra}})
    return jobs


def warm(arch: str, out: Path, python: str, workers: int) -> int:
    """Compile every job into ``CACHE_DIR`` with ``python``, prune, pack into ``out``."""
    start = time.perf_counter()
    jobs = compile_jobs(arch)
    cache = Path(tc.CACHE_DIR)
    shutil.rmtree(cache, ignore_errors=True)  # only what these jobs compile goes into DIR
    out.mkdir(parents=True, exist_ok=True)
    jobs_file = out / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = {**os.environ, "TRITON_CACHE_DIR": tc.CACHE_DIR, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    print(f"warm_cache: {len(jobs)} compiles for {arch} in {python} on {workers} workers",
          file=sys.stderr)
    done = subprocess.run([python, __file__, "--compile-jobs", str(jobs_file), "--arch", arch,
                           "--workers", str(workers)], env=env, capture_output=True, text=True)
    jobs_file.unlink()
    if done.returncode:
        print(f"warm_cache: the compiles failed: {done.stderr.strip()[-400:]}", file=sys.stderr)
        return 1
    result = json.loads(done.stdout.strip().splitlines()[-1])
    facts, rows = result["facts"], result["rows"]
    differs = {k: facts[k] for k in DEVICE if facts[k] != DEVICE[k]}
    if differs:
        print(f"warm_cache: compiled with {differs}, the device's last-known are {DEVICE}: "
              "this cache will not hit there", file=sys.stderr)
    kept_files, deleted = tc.prune(cache)
    tc.pack(cache, out / tc.ARCHIVE)
    failed = [r for r in rows if r["error"]]
    manifest = {**facts, "cache_dir": tc.CACHE_DIR, "suites": list(SUITES),
                "kernels": len(rows) - len(failed), "failed": failed,
                "seconds": round(time.perf_counter() - start, 1),
                "compiles": rows}
    (out / tc.MANIFEST).write_text(json.dumps(manifest, indent=1))
    size = (out / tc.ARCHIVE).stat().st_size
    print(f"warm_cache: {len(rows) - len(failed)} of {len(rows)} compiled, {kept_files} files "
          f"kept ({deleted} pruned), {out / tc.ARCHIVE}: {size / 2**20:.2f} MiB, "
          f"{manifest['seconds']:.0f} s")
    for row in failed:
        print(f"warm_cache: {row['kernel']} {row['config']} D={row['head_dim']}: {row['error']}",
              file=sys.stderr)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verb = parser.add_mutually_exclusive_group(required=True)
    verb.add_argument("--out", type=Path, help="warm, prune and pack the cache into DIR")
    verb.add_argument("--install", type=Path, metavar="DIR", help="install DIR's cache")
    verb.add_argument("--harvest", type=Path, metavar="FILE.tar.gz")
    verb.add_argument("--compile-jobs", help=argparse.SUPPRESS)  # the compile side of --out
    parser.add_argument("--arch", default="sm_90", choices=sorted(ARCHES))
    parser.add_argument("--python", default=None,
                        help="the device's Python with the device's Triton (default: "
                             ".venv312/bin/python when it exists, else this one)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    arch = ARCHES[args.arch]
    if args.compile_jobs:
        jobs = json.loads(Path(args.compile_jobs).read_text())
        print(json.dumps(tc.compile_all(jobs, arch, args.workers)))
        return 0
    try:
        if args.out:
            if os.environ.get("TRITON_INTERPRET") == "1":  # as aot_kernels.py refuses it
                print("warm_cache: unset TRITON_INTERPRET (the launches would be recorded with "
                      "the interpreter's configs)", file=sys.stderr)
                return 2
            sys.path.insert(0, str(ROOT))
            default = ROOT / ".venv312" / "bin" / "python"
            python = args.python or (str(default) if default.exists() else sys.executable)
            return warm(args.arch, args.out, python, args.workers)
        cache = Path(os.environ.get("TRITON_CACHE_DIR", tc.CACHE_DIR))
        if args.harvest and not args.harvest.parent.is_dir():
            print(f"warm_cache: {args.harvest.parent} is not a folder", file=sys.stderr)
            return 2
        if args.install and str(cache) != tc.CACHE_DIR:
            print(f"compiling: cache is for TRITON_CACHE_DIR={tc.CACHE_DIR}, this process has "
                  f"{cache}; not installed")
            return 0
        facts = tc.running_facts()  # imports torch and hashes libtriton.so: seconds
        if args.install:
            for said in tc.install(args.install, cache, facts):
                print(said)
            if not os.environ.get("TRITON_PTXAS_PATH"):  # Inductor would point it at torch's
                print(f"triton cache: export TRITON_PTXAS_PATH={facts['ptxas_path']} (unset, "
                      "Inductor sets it to torch's ptxas: another key)")
            return 0
        print(tc.harvest(args.harvest, cache, facts))
        return 0
    except ImportError as exc:  # no Triton (or no NVIDIA backend) in this Python
        if args.install:  # the proof goes on: nothing to install into
            print(f"compiling: cache is for Triton's NVIDIA backend, this Python has none ({exc})")
            return 0
        print(f"warm_cache: needs Triton with its NVIDIA backend ({exc})", file=sys.stderr)
        return 2
    except OSError as exc:  # an unwritable --out or --harvest, an unreadable folder
        print(f"warm_cache: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 0 if args.install else 2


if __name__ == "__main__":
    sys.exit(main())
