"""``attnbench run SUITE --launcher ray|slurm --shards N --out DIR``: hand the shards of a
sweep to an existing engine, then merge them. No scheduling of our own: Ray places one task per
shard with the resources it asks for (and retries failed tasks); Slurm runs one array task per
shard through submitit. Each shard is ``attnbench run SUITE --shard K/N --resume`` into
``DIR/shards/shard-K-of-N``; when every shard has finished, ``DIR`` becomes the merged run.

Both resume: a shard whose every point has a row is not submitted again, and a partly done
shard continues where it stopped. Ray tasks carry the suite file and the shard's rows to and
from the worker (no shared filesystem needed); Slurm jobs read and write ``DIR`` directly
(the usual shared filesystem of a Slurm cluster).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.distributed.shard import ShardSpec, parse_shard, shard_done
from harness.errors import CliError
from harness.results import ENV_FILE, ROWS_FILE, load_env, write_env
from harness.sweep.suite import Suite

SHARDS_DIR = "shards"
# ``run`` options handed on to every shard: (attribute, flag); flags take no value.
_VALUE_OPTIONS = (
    ("check", "--check"),
    ("budget_s", "--budget-s"),
    ("mem_budget", "--mem-budget"),
    ("point_timeout", "--point-timeout"),
)
_FLAG_OPTIONS = (("isolate", "--isolate"), ("force", "--force"))


class ShardFailed(RuntimeError):
    """A shard's ``attnbench run`` ended with a non-zero exit status."""


def add_run_options(p) -> None:
    """The sharding and launcher options of ``attnbench run`` (docs/distributed.md)."""
    g = p.add_argument_group("sharding and launchers (docs/distributed.md)")
    g.add_argument("--shard", type=parse_shard, metavar="K/N", help="run only shard K of N")
    engines = ["local", "ray", "slurm"]
    g.add_argument("--launcher", choices=engines, default="local", help="engine for --shards N")
    g.add_argument("--shards", type=int, metavar="N", help="number of shards for --launcher")
    g.add_argument("--max-retries", type=int, default=1, help="retries of a failed shard")
    g.add_argument("--gpus-per-shard", type=int, help="default: 1 for cuda suites, else 0")
    g.add_argument("--cpus-per-shard", type=int, help="default: [measure] threads, else 1")
    g.add_argument("--ray-address", help="Ray cluster to join (default: start a local one)")
    g.add_argument("--slurm-partition", help="Slurm partition for the shard jobs")
    g.add_argument("--slurm-timeout-min", type=int, default=240, help="time limit per shard")
    g.add_argument("--slurm-local", action="store_true", help="submitit's LocalExecutor")


@dataclass(frozen=True)
class Plan:
    """What every shard task needs: the suite, where shards go, and resources per shard."""

    suite_path: Path
    suite_name: str
    out: Path
    n: int
    extra_argv: tuple[str, ...]
    gpus: int
    cpus: int
    max_retries: int

    def shard_dir(self, spec: ShardSpec) -> Path:
        return self.out / SHARDS_DIR / spec.dirname

    @property
    def specs(self) -> list[ShardSpec]:
        return [ShardSpec(k, self.n) for k in range(1, self.n + 1)]


def make_plan(suite: Suite, args, out: Path) -> Plan:
    """Validate the launcher options of ``args`` against ``suite``."""
    if args.shard is not None:
        raise CliError("--shard K/N runs one shard here; --launcher runs them all (use one)")
    if not args.shards or args.shards < 1:
        raise CliError(f"--launcher {args.launcher} needs --shards N (N >= 1)")
    if args.max_retries < 0:
        raise CliError("--max-retries must be >= 0")
    if (out / ROWS_FILE).exists() and not (out / SHARDS_DIR).is_dir():
        raise CliError(f"--out {out} holds a run that is not a sharded sweep; choose another")
    extra: list[str] = []
    for attr, flag in _VALUE_OPTIONS:
        if getattr(args, attr, None) is not None:
            extra += [flag, str(getattr(args, attr))]
    extra += [flag for attr, flag in _FLAG_OPTIONS if getattr(args, attr, False)]
    on_gpu = any(p.device.startswith("cuda") for p in suite.points)
    gpus = args.gpus_per_shard if args.gpus_per_shard is not None else int(on_gpu)
    return Plan(
        suite_path=Path(suite.path).resolve(),
        suite_name=suite.name,
        out=out.resolve(),
        n=args.shards,
        extra_argv=tuple(extra),
        gpus=gpus,
        cpus=args.cpus_per_shard or suite.measure.threads or 1,
        max_retries=args.max_retries,
    )


def shard_argv(
    suite_path: Path, spec: ShardSpec, run_dir: Path, extra_argv: tuple[str, ...]
) -> list[str]:
    """The ``attnbench`` arguments that run (or resume) one shard."""
    where = [str(suite_path), "--shard", str(spec), "--out", str(run_dir)]
    return ["run", *where, "--resume", "--no-progress", "--no-table", *extra_argv]


def run_shard(argv: list[str]) -> None:
    """Run ``attnbench argv`` in this process; raise ShardFailed (with its message) on failure."""
    from harness.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    sys.stderr.write(err.getvalue())  # kept in the worker's / job's log as well
    if code != 0:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise ShardFailed(f"exit {code}: {lines[-1] if lines else 'no message'}")


def launch(suite: Suite, args) -> int:
    """Run every unfinished shard on the chosen engine, then merge; exit status for the CLI."""
    from harness.measure.env import new_run_id

    out = args.out or Path("runs") / f"{suite.name}-{new_run_id()}"
    plan = make_plan(suite, args, out)
    todo = [s for s in plan.specs if not shard_done(plan.shard_dir(s), suite.fingerprint)]
    done = plan.n - len(todo)
    print(
        f"attnbench: suite {suite.name!r} in {plan.n} shards via {args.launcher}"
        + (f" ({done} already done)" if done else "")
        + f" -> {out}"
    )
    if not todo:
        failures: dict[ShardSpec, str] = {}
    elif args.launcher == "ray":
        failures = run_on_ray(plan, todo, address=args.ray_address)
    else:
        failures = run_on_slurm(
            plan,
            todo,
            partition=args.slurm_partition,
            timeout_min=args.slurm_timeout_min,
            local=args.slurm_local,
        )
    for spec, reason in sorted(failures.items(), key=lambda item: item[0].k):
        print(f"attnbench: shard {spec} failed after {plan.max_retries} retries: {reason}")
    if failures:
        print(
            f"attnbench: {len(failures)} of {plan.n} shards failed; the others are kept in "
            f"{out / SHARDS_DIR}. Rerun the same command to retry only what is missing."
        )
        return 1
    from harness.distributed.merge import merge_runs, print_report

    report = merge_runs([plan.shard_dir(s) for s in plan.specs], out, overwrite=True)
    print_report(report)
    return 0 if report.complete else 1


# --- moving a shard's files to and from a worker without a shared filesystem ---------------


def pack_shard(run_dir: Path) -> dict[str, bytes]:
    """The files of a (partly) done shard directory, to resume it elsewhere."""
    return {
        name: (run_dir / name).read_bytes()
        for name in (ENV_FILE, ROWS_FILE)
        if (run_dir / name).is_file()
    }


def run_packed_shard(
    suite_file: str,
    suite_bytes: bytes,
    spec: ShardSpec,
    files: dict[str, bytes],
    extra_argv: tuple[str, ...],
) -> dict[str, bytes]:
    """Worker side: run one shard in a scratch directory seeded with ``files`` (its earlier
    rows); return the shard's files. The suite travels as bytes, so its fingerprint matches."""
    with tempfile.TemporaryDirectory(prefix="attnbench-shard-") as tmp:
        suite_path = Path(tmp) / Path(suite_file).name
        suite_path.write_bytes(suite_bytes)
        run_dir = Path(tmp) / spec.dirname
        run_dir.mkdir()
        for name, blob in files.items():
            (run_dir / name).write_bytes(blob)
        try:
            run_shard(shard_argv(suite_path, spec, run_dir, extra_argv))
        except ShardFailed as exc:  # name the shard, not this worker's scratch directory
            raise ShardFailed(str(exc).replace(str(run_dir), f"shard {spec}")) from None
        return pack_shard(run_dir)


def unpack_shard(run_dir: Path, files: dict[str, bytes], suite_path: Path) -> None:
    """Driver side: write a finished shard's files into ``run_dir`` (rows replaced at once)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if ROWS_FILE in files:
        tmp = run_dir / (ROWS_FILE + ".tmp")
        tmp.write_bytes(files[ROWS_FILE])
        tmp.replace(run_dir / ROWS_FILE)
    (run_dir / ENV_FILE).write_bytes(files[ENV_FILE])
    env = load_env(run_dir)
    write_env(run_dir, {**env, "suite_path": str(suite_path)})  # not the worker's scratch copy


# --- engines ---------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    """The readable cause of a failed task: our ShardFailed line, else the last line."""
    cause = getattr(exc, "cause", None) or exc
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    mine = [ln for ln in lines if "ShardFailed" in ln or ln.startswith("exit ")]
    text = (mine or lines or [type(exc).__name__])[-1]
    return text.split("ShardFailed: ", 1)[-1][:300]


def run_on_ray(plan: Plan, todo: list[ShardSpec], address: str | None) -> dict[ShardSpec, str]:
    """One Ray task per shard (``num_cpus``/``num_gpus`` from the plan; Ray retries a failed
    task ``max_retries`` times); shards are written as they finish. Returns the failures."""
    try:
        import ray
    except ImportError:
        raise CliError("--launcher ray needs Ray: pip install 'attnbench[dist]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        _check_feasible(ray.cluster_resources(), plan)
        task = ray.remote(run_packed_shard).options(
            num_cpus=plan.cpus,
            num_gpus=plan.gpus,
            max_retries=plan.max_retries,
            retry_exceptions=True,
            name="attnbench-shard",
        )
        suite_bytes = plan.suite_path.read_bytes()
        pending = {
            task.remote(
                plan.suite_path.name,
                suite_bytes,
                spec,
                pack_shard(plan.shard_dir(spec)),
                plan.extra_argv,
            ): spec
            for spec in todo
        }
        failures: dict[ShardSpec, str] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(ready[0])
            try:
                files = ray.get(ready[0])
            except Exception as exc:  # a task error or a lost worker: report, keep the others
                failures[spec] = _one_line(exc)
                continue
            unpack_shard(plan.shard_dir(spec), files, plan.suite_path)
            print(f"attnbench: shard {spec} finished -> {plan.shard_dir(spec)}")
        return failures
    finally:
        if started:
            ray.shutdown()


def _check_feasible(resources: dict, plan: Plan) -> None:
    """Refuse a request no node of the cluster can meet (Ray would wait for it forever)."""
    for name, want in (("CPU", plan.cpus), ("GPU", plan.gpus)):
        if want and resources.get(name, 0) < want:
            raise CliError(
                f"each shard asks for {want} {name}(s) but the Ray cluster has "
                f"{resources.get(name, 0):g}; use --{name.lower()}s-per-shard"
            )


def run_on_slurm(
    plan: Plan, todo: list[ShardSpec], partition: str | None, timeout_min: int, local: bool
) -> dict[ShardSpec, str]:
    """One Slurm array task per shard via submitit (``local``: submitit's LocalExecutor, one
    process per shard). Failed shards are resubmitted up to ``max_retries`` times."""
    try:
        import submitit
    except ImportError:
        raise CliError("--launcher slurm needs submitit: pip install 'attnbench[dist]'") from None
    if not local and shutil.which("sbatch") is None:
        raise CliError(
            "no Slurm here (sbatch not found); --slurm-local runs the shards as "
            "local processes through submitit"
        )
    executor = submitit.AutoExecutor(
        folder=plan.out / "submitit", cluster="local" if local else "slurm"
    )
    executor.update_parameters(
        name=f"attnbench-{plan.suite_name}",
        timeout_min=timeout_min,
        cpus_per_task=plan.cpus,
        gpus_per_node=plan.gpus,
        slurm_partition=partition,
        slurm_array_parallelism=max(len(todo), 1),
    )
    failures: dict[ShardSpec, str] = {}
    for _attempt in range(plan.max_retries + 1):
        if not todo:
            break
        argvs = [shard_argv(plan.suite_path, s, plan.shard_dir(s), plan.extra_argv) for s in todo]
        jobs = executor.map_array(run_shard, argvs)
        by_job = {job.job_id: spec for job, spec in zip(jobs, todo, strict=True)}
        print(f"attnbench: submitted {len(jobs)} shard job(s): {', '.join(by_job)}")
        failures = {}
        for job in submitit.helpers.as_completed(jobs, poll_frequency=1 if local else 15):
            spec = by_job[job.job_id]
            error = job.exception()
            if error is None:
                print(f"attnbench: shard {spec} finished -> {plan.shard_dir(spec)}")
            else:
                failures[spec] = _one_line(error)
        todo = sorted(failures, key=lambda s: s.k)
    return failures
