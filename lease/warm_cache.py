"""Triton's on-disk cache for sm_90, compiled on a CPU and carried to a GPU lease.

    python lease/warm_cache.py --arch sm_90 --out DIR   # here: warm, prune, pack DIR
        [--steps suites kernel-sweep]                              # (default: both)
    python lease/warm_cache.py --install DIR            # on the lease, before the proof
    python lease/warm_cache.py --harvest FILE.tar.gz    # on the lease, at its end

Warming compiles every launch of the fused kernels that the proof's steps make (``STEPS``:
the GPU claims suites' points, the smokes and the paged decode at the GPU serving suite's
shapes (:func:`paged_launches`), ``suites``; the kernel sweep's configs,
``kernel-sweep``), each distinct (kernel, config, constexprs, specialization) once, in the
device's Python and Triton (``--python``, ``DEVICE``), into ``CACHE_DIR``; the cache is pruned
and packed beside its manifest. Installing checks the manifest against the running Triton and
installs nothing (one line, exit 0) when it cannot hit; harvesting packs what only a lease
builds. How, and what was measured: docs/lease.md ("Kernels that arrive compiled").
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # triton_cache, beside this file
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # kernel_sweep

import triton_cache as tc

ROOT = tc.ROOT
DEVICE = {"python": "3.12", "triton": "3.6.0"}  # the leases' (docs/gpu.md, FACTS.md)
ARCHES = {"sm_90": 90, "sm_80": 80}
SMOKES = ("gpu-smoke", "gpu-smoke-decode")  # a lease's first checks, beside the proof
JOBS = "jobs.json"  # DIR's list of the compiles, as --compile-jobs reads it
STEPS = ("suites", "kernel-sweep")  # the proof's steps whose launches are warmed
BAND = {"local", "dilated", "longformer", "bigbird", "flash-tiled"}  # triton_attention
FEATURE = {"linear": False, "performer": True}  # feature_attention: FAVOR+ or not


# -- which compiles (the project's Python: torch, the harness) --------------------------------

def proof_suites() -> tuple[str, ...]:
    """The smokes (:data:`SMOKES`) and every claims suite for a CUDA device: the suites
    ``attnbench verdicts --device cuda`` (the proof's verdicts step) measures."""
    from harness.sweep.suite import load_suite

    gpu = [p.stem for p in sorted((ROOT / "suites").glob("claims-*.toml"))
           if load_suite(p).points[0].device == "cuda"]
    return tuple(dict.fromkeys((*SMOKES, *gpu)))


def suite_shapes(suites: tuple[str, ...] | None = None) -> list[tuple]:
    """The fused calls of the suites' CUDA points, once each: (batch, head dim, dtype, shape,
    workload name) with shape and name as ``aot_check.record`` takes them. A decode point
    calls its core once per step at positions seq_len .. seq_len + gen_tokens - 1 (the timed
    step is the first); a ``state`` cache steps its recurrence (no fused call)."""
    from harness.scenarios.decode.caches import CACHES
    from harness.spec import torch_dtype
    from harness.sweep.suite import load_suite

    calls: dict[tuple, tuple] = {}
    for name in suites or proof_suites():
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
                    # a causal feature-map call runs the chunk kernel (aot_check's "-causal")
                    name = f"suite-D{p.head_dim}" + ("-causal" if len(shape) == 5
                                                     and p.mask.causal else "")
                    calls.setdefault((p.batch, name, str(dtype), repr(shape)),
                                     (p.batch, p.head_dim, dtype, shape, name))
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
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, torch.Tensor):
        # a meta tensor's data_ptr is its storage offset in bytes (from 0), and a fake tensor
        # (lease_device) has none: its offset is taken. A view the launch code makes at an
        # offset is unaligned here as on the GPU, a fresh tensor aligned
        fake = isinstance(value, FakeTensor)
        address = value.storage_offset() * value.element_size() if fake else value.data_ptr()
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": address % 16 == 0}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot carry a {type(value).__name__} argument to the compile")


def compile_jobs(arch: str, suites: tuple[str, ...] | None = None,
                 steps: tuple[str, ...] = ("suites",)) -> list[dict]:
    """One job per distinct (kernel, config, constexprs, specialization) that ``steps`` of the
    proof launch (:data:`STEPS`; by default the suites' only), in the order of ``steps``, a
    launch two steps share kept once (under the first): the specialization as Triton's key
    takes it (``kernel_launch.specialization`` for the scalars; a tensor's dtype and
    alignment). Each job names its ``step``."""
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        raise ValueError(f"not steps of the proof: {unknown} (one of {list(STEPS)})")
    makers = {"suites": lambda: suite_launches(arch, suites),
              "kernel-sweep": lambda: sweep_launches(arch)}
    jobs, seen = [], set()
    for step in steps:
        for name, kernel, args, kwargs, configs, d in makers[step]():
            for job in _jobs(step, name, kernel, args, kwargs, configs, d):
                key = compile_key(kernel, job["kernel"], job["config"], job["args"],
                                  job["kwargs"])
                if key not in seen:
                    seen.add(key)
                    jobs.append(job)
    return jobs


Recorded = tuple  # (kernel name, kernel object, args, kwargs, configs, head dim)


def _jobs(step: str, name: str, kernel, args: tuple, kwargs: dict, configs: list,
          d: int) -> list[dict]:
    """The compile jobs of one recorded launch, one per config (an autotuned kernel's config
    adds its keyword arguments; another kernel's config only names its own options)."""
    from implementations.triton_kernels import aot_check, autotune

    modules = {kernel_name: module.__name__ for module, kernel_name in aot_check.KERNELS}
    if name not in modules:
        raise ValueError(f"{name}: a kernel aot_check.KERNELS does not list (its module is "
                         "needed to compile it)")
    encoded = [_encode(a) for a in args]
    tuned = hasattr(kernel, "configs")
    return [{"step": step, "module": modules[name], "kernel": name,
             "config": autotune.config_label(cfg), "head_dim": d, "args": encoded,
             "kwargs": {**kwargs, **(cfg.all_kwargs() if tuned else {})}} for cfg in configs]


def compile_key(kernel, name: str, label: str, args: list, kwargs: dict) -> tuple:
    """What Triton's cache key sees of a job (``args`` encoded, ``kwargs`` with the config's):
    the kernel, the config, the keyword arguments with every default the kernel's signature
    fills (a constexpr left at its default is the compile of one passed with it: the chunk
    path's key pass leaves ``COMBINE`` out) and the arguments' specialization
    (``kernel_launch.specialization`` for the scalars; a tensor's dtype and alignment)."""
    from implementations.triton_kernels import kernel_launch

    python_fn = (kernel.fn if hasattr(kernel, "configs") else kernel).fn
    defaults = {k: p.default for k, p in inspect.signature(python_fn).parameters.items()
                if p.default is not inspect.Parameter.empty}
    spec = tuple(tuple(a.values()) if isinstance(a, dict) else kernel_launch.specialization(a)
                 for a in args)
    return name, label, json.dumps({**defaults, **kwargs}, sort_keys=True, default=str), spec


def suite_launches(arch: str, suites: tuple[str, ...] | None = None) -> list[Recorded]:
    """The suites' fused calls (:func:`suite_shapes`), each launch with every config its
    autotuner may time on ``arch`` (the class list after the prune) or its own options; for
    the proof's own list (``suites`` None) the paged decode's too (:func:`paged_launches`)."""
    from implementations.triton_kernels import aot_check

    out = []
    for batch, d, dtype, shape, name in suite_shapes(suites):
        for launch in aot_check.record(name, d, batch, shape, dtype):
            configs = aot_check.listed(launch, arch) or aot_check.configs(launch, arch)
            out.append((launch.name, launch.kernel, launch.args, launch.kwargs, configs, d))
    return out + (paged_launches(arch) if suites is None else [])


def paged_launches(arch: str) -> list[Recorded]:
    """The paged decode at the GPU serving suite's shapes (``aot_check.PAGED_SHAPE``: Llama-3-8B
    attention, D 128, bf16, one query a step, pages of 16 and 64 tokens), each launch with
    every config its autotuner may time on ``arch``: part of the proof's suites until that
    suite's points are read here. Its batch and lengths change no compile (the kernels do
    not specialize on them)."""
    from implementations.triton_kernels import aot_check

    return [(launch.name, launch.kernel, launch.args, launch.kwargs,
             aot_check.listed(launch, arch) or aot_check.configs(launch, arch), 128)
            for workload in aot_check.PAGED_CI for launch in aot_check.record(workload, 128)]


def sweep_launches(arch: str) -> list[Recorded]:
    """What ``kernel_sweep.py`` (as the proof runs it: every group, case and config) compiles
    and launches on a GPU of ``arch``: each case's recorded launches (``Prepared``: the
    forward, and the backward of the dense cases) with their own configs, every config of
    ``sweep_configs`` (the class's list and ``autotune.CANDIDATES``) on the group's kernel,
    the Hopper backward peers' candidates, and the decode cases recorded again at each
    ``SPLIT_WAVES`` target (another split count: other arguments). Recorded from the script's
    own code on a stand-in device (:func:`lease_device`)."""
    import kernel_sweep as ks

    capability = divmod(ARCHES[arch], 10)
    out: list[Recorded] = []

    def add(launch, configs) -> None:
        d = launch.kwargs.get("D", 0)
        out.append((launch.name, launch.kernel, launch.args, launch.kwargs, configs, d))

    with lease_device(arch), _tuning_off():
        for kernel, names, _, _ in ks.GROUPS.values():
            for name in names:
                case = ks.CASES[name]
                p = _prepared(ks, name, case)
                for launch in p.launches:
                    add(launch, [_own_config(launch)])
                add(p.by_name[kernel], [c for c, _, _ in ks.sweep_configs(kernel, case,
                                                                           capability)])
                if kernel == "band_fwd_split":  # the rows ``waves=W``: other split counts
                    for waves in ks.SPLIT_WAVES:
                        with ks.split_waves(waves):
                            for launch in _prepared(ks, name, case).launches:
                                add(launch, [_own_config(launch)])
        for _, name, _, peers in ks.peer_items(list(ks.GROUPS)):
            for peer in (x for x in peers if x in ks.HOPPER_BACKWARD):
                picked = ks.hopper_backward(ks.CASES[name], ks.HOPPER_BACKWARD[peer],
                                            capability)
                p = _prepared(ks, name, ks.CASES[name])
                for kernel, config in picked.items():
                    add(p.by_name[kernel], [config])
    return out


def _prepared(ks, name: str, case):
    """``kernel_sweep.Prepared`` of a case on stand-in CUDA tensors (no memory)."""
    import torch

    shape_q = (case.batch, case.heads, case.n_q, case.head_dim)
    shape_kv = (case.batch, case.kv_heads, case.n_k, case.head_dim)
    make = lambda s: torch.empty(s, device="cuda", dtype=torch.bfloat16)
    inputs = (make(shape_q), make(shape_kv), make(shape_kv),
              make(shape_q) if case.backward else None)
    return ks.Prepared(name, case, "cpu", inputs)  # "cpu": its unused generator's device


def _own_config(launch):
    """The config a recorded launch runs with when replayed as recorded (pinned, or its own
    options for a kernel that is not autotuned)."""
    import triton

    if launch.config is not None:
        return launch.config
    return triton.Config({}, num_warps=launch.kwargs.get("num_warps", 4),
                         num_stages=launch.kwargs.get("num_stages", 3))


@contextlib.contextmanager
def _tuning_off():
    """``ATTNBENCH_AUTOTUNE=off`` for the duration, as kernel_sweep.py sets it: the recorded
    launches carry their class defaults (pinned)."""
    from implementations.triton_kernels import autotune

    saved = os.environ.get(autotune.TUNING_ENV)
    os.environ[autotune.TUNING_ENV] = "off"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(autotune.TUNING_ENV, None)
        else:
            os.environ[autotune.TUNING_ENV] = saved


@contextlib.contextmanager
def lease_device(arch: str):
    """For the duration, a tensor made on ``"cuda"`` is a fake tensor (torch's FakeTensorMode:
    shapes, strides, dtypes and a device, no memory; a real tensor mixed in is allowed), and
    ``torch.cuda`` answers as a GPU of ``arch`` with ``plan_tables.DEFAULT_SMS`` SMs (an
    H100's and H200's 132) would: its capability, properties, device 0, a device context that
    does nothing and a stream whose handle no real stream has (a cache keyed by it is never
    read by a real call). So the scripts' own code runs as on the lease, down to each
    launch's arguments, without a GPU. After it, every ``functools`` cache of ``harness`` and
    ``implementations`` that computed something meanwhile is cleared (it may hold a fake
    tensor), and so is every entry of their module-level dicts that holds a fake tensor (the
    fused linear path's counters, say): nothing made on the stand-in outlives it."""
    from types import SimpleNamespace

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from implementations.triton_kernels import plan_tables

    capability = divmod(ARCHES[arch], 10)
    props = SimpleNamespace(name=f"stand-in sm_{ARCHES[arch]}", major=capability[0],
                            minor=capability[1], multi_processor_count=plan_tables.DEFAULT_SMS)
    stream = SimpleNamespace(cuda_stream=-1)
    stand_ins = {"get_device_capability": lambda *a, **k: capability,
                 "get_device_properties": lambda *a, **k: props,
                 "current_device": lambda: 0, "current_stream": lambda *a, **k: stream,
                 "device": lambda *a, **k: contextlib.nullcontext()}
    saved = {name: getattr(torch.cuda, name) for name in stand_ins}
    caches = _caches()
    misses = {id(f): f.cache_info().misses for f in caches}
    try:
        for name, fn in stand_ins.items():
            setattr(torch.cuda, name, fn)
        with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
            # autotune.tma_allowed reads a tensor's data_ptr: a fake one's is 0 (aligned), as
            # a fresh CUDA allocation's (the scripts' inputs are fresh)
            warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor")
            yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
        for f in _caches():
            if f.cache_info().misses != misses.get(id(f), 0):
                f.cache_clear()
        for table, key in fake_entries():
            del table[key]


def fake_entries() -> list[tuple[dict, object]]:
    """(dict, key) of every entry of a module-level dict of the loaded ``harness``,
    ``implementations`` and ``benchmarks`` modules whose value is a fake tensor (torch's
    FakeTensor): what a stand-in device left behind."""
    from torch._subclasses.fake_tensor import FakeTensor

    found = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in ("harness", "implementations", "benchmarks") or not module:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, dict):
                found += [(value, k) for k, x in list(value.items()) if isinstance(x, FakeTensor)]
    return found


def _caches() -> list:
    """The ``functools`` caches (lru_cache) of the loaded ``harness`` and ``implementations``
    modules."""
    found = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in ("harness", "implementations") or module is None:
            continue
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_info", None)) and callable(
                    getattr(value, "cache_clear", None)):
                found[id(value)] = value
    return list(found.values())


def warm(arch: str, out: Path, python: str, workers: int,
         steps: tuple[str, ...] = STEPS) -> int:
    """Compile every job of ``steps`` into ``CACHE_DIR`` with ``python``, prune, pack into
    ``out``."""
    start = time.monotonic()
    try:
        jobs = compile_jobs(arch, steps=steps)
    except ValueError as exc:  # a launch the recording cannot carry: one line
        print(f"warm_cache: {exc}", file=sys.stderr)
        return 1
    recorded = time.monotonic() - start
    cache = Path(tc.CACHE_DIR)
    shutil.rmtree(cache, ignore_errors=True)  # only what these jobs compile goes into DIR
    out.mkdir(parents=True, exist_ok=True)
    jobs_file = out / JOBS  # kept: the same compiles again are the hit check (docs)
    jobs_file.write_text(json.dumps(jobs))
    env = {**os.environ, "TRITON_CACHE_DIR": tc.CACHE_DIR, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    per_step = {step: sum(job["step"] == step for job in jobs) for step in steps}
    print(f"warm_cache: {len(jobs)} compiles for {arch} ("
          + ", ".join(f"{step} {count}" for step, count in per_step.items())
          + f"; recorded in {recorded:.0f} s) in {python} on {workers} workers",
          file=sys.stderr)
    done = subprocess.run([python, __file__, "--compile-jobs", str(jobs_file), "--arch", arch,
                           "--workers", str(workers)], env=env, capture_output=True, text=True)
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
    manifest = {**facts, "cache_dir": tc.CACHE_DIR, "steps": per_step,
                "suites": list(proof_suites()) if "suites" in steps else [],
                "kernels": len(rows) - len(failed), "failed": failed,
                "seconds": round(time.monotonic() - start, 1),
                "record_seconds": round(recorded, 1),
                "compile_seconds": round(sum(r["seconds"] for r in rows), 1),
                "compiles": rows}
    (out / tc.MANIFEST).write_text(json.dumps(manifest, indent=1))
    size = (out / tc.ARCHIVE).stat().st_size
    print(f"warm_cache: {len(rows) - len(failed)} of {len(rows)} compiled, {kept_files} files "
          f"kept ({deleted} pruned), {out / tc.ARCHIVE}: {size / 2**20:.2f} MiB, "
          f"{manifest['seconds']:.0f} s")
    for row in failed:
        print(f"warm_cache: {row.get('step')} {row['kernel']} {row['config']} "
              f"D={row['head_dim']}: {row['error']}", file=sys.stderr)
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
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                        help="the proof's steps whose launches --out compiles (default: all)")
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
            steps = tuple(dict.fromkeys(args.steps))
            if args.arch != "sm_90" and "kernel-sweep" in steps:
                # launches.forward_blocks reads autotune.current_capability(): (9, 0) without
                # a GPU, so another arch's backward and decode tiles would be recorded wrong
                print(f"warm_cache: kernel-sweep left out for {args.arch}: its launches are "
                      "recorded for sm_90 only", file=sys.stderr)
                steps = tuple(step for step in steps if step != "kernel-sweep")
            return warm(args.arch, args.out, python, args.workers, steps)
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
