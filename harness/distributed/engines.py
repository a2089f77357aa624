"""The engines a launcher hands shards to: Ray (one task per shard, the shard's files carried
to and from the worker) and Slurm through submitit (one array task per shard, reading and
writing the run directory on the cluster's shared filesystem). Each returns the shards that
failed after their retries, with a one-line reason."""

from __future__ import annotations

import shutil

from harness.distributed.shard import ShardSpec
from harness.distributed.shard_setup import ShardSetup
from harness.distributed.worker import pack_shard, run_packed_shard, run_shard, unpack_shard
from harness.errors import CliError


def _one_line(exc: BaseException) -> str:
    """The readable cause of a failed task: our ShardFailed line, else the last line."""
    cause = getattr(exc, "cause", None) or exc
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    mine = [ln for ln in lines if "ShardFailed" in ln or ln.startswith("exit ")]
    text = (mine or lines or [type(exc).__name__])[-1]
    return text.split("ShardFailed: ", 1)[-1][:300]


def run_on_ray(setup: ShardSetup, todo: list[ShardSpec],
               address: str | None) -> dict[ShardSpec, str]:
    """One Ray task per shard (``num_cpus``/``num_gpus`` from the setup; Ray retries a failed
    task ``max_retries`` times); shards are written as they finish. Returns the failures."""
    try:
        import ray
    except ImportError:
        raise CliError("--launcher ray needs Ray: pip install 'attnbench[dist]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        _check_feasible(ray.cluster_resources(), setup)
        task = ray.remote(run_packed_shard).options(
            num_cpus=setup.cpus,
            num_gpus=setup.gpus,
            max_retries=setup.max_retries,
            retry_exceptions=True,
            name="attnbench-shard",
        )
        suite_bytes = setup.suite_path.read_bytes()
        pending = {
            task.remote(
                setup.suite_path.name,
                suite_bytes,
                spec,
                pack_shard(setup.shard_dir(spec)),
                setup.options,
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
            unpack_shard(setup.shard_dir(spec), files, setup.suite_path)
            print(f"attnbench: shard {spec} finished -> {setup.shard_dir(spec)}")
        return failures
    finally:
        if started:
            ray.shutdown()


def _check_feasible(resources: dict, setup: ShardSetup) -> None:
    """Refuse a request no node of the cluster can meet (Ray would wait for it forever)."""
    for name, want in (("CPU", setup.cpus), ("GPU", setup.gpus)):
        if want and resources.get(name, 0) < want:
            raise CliError(
                f"each shard asks for {want} {name}(s) but the Ray cluster has "
                f"{resources.get(name, 0):g}; use --{name.lower()}s-per-shard"
            )


def run_on_slurm(
    setup: ShardSetup, todo: list[ShardSpec], partition: str | None, timeout_min: int, local: bool
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
        folder=setup.out / "submitit", cluster="local" if local else "slurm"
    )
    executor.update_parameters(
        name=f"attnbench-{setup.suite_name}",
        timeout_min=timeout_min,
        cpus_per_task=setup.cpus,
        gpus_per_node=setup.gpus,
        slurm_partition=partition,
        slurm_array_parallelism=max(len(todo), 1),
    )
    failures: dict[ShardSpec, str] = {}
    for _attempt in range(setup.max_retries + 1):
        if not todo:
            break
        jobs = executor.map_array(run_shard, [setup.job(s) for s in todo])
        by_job = {job.job_id: spec for job, spec in zip(jobs, todo, strict=True)}
        print(f"attnbench: submitted {len(jobs)} shard job(s): {', '.join(by_job)}")
        failures = {}
        # a local job's state is its process's: cheap to poll often
        for job in submitit.helpers.as_completed(jobs, poll_frequency=0.2 if local else 15):
            spec = by_job[job.job_id]
            error = job.exception()
            if error is None:
                print(f"attnbench: shard {spec} finished -> {setup.shard_dir(spec)}")
            else:
                failures[spec] = _one_line(error)
        todo = sorted(failures, key=lambda s: s.k)
    return failures
