"""What a launcher needs to run the shards of a sweep: the launcher options, the setup (the
suite, where each shard goes, resources and retries per shard) and the job one shard is."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.distributed.shard import ShardSpec
from harness.errors import CliError
from harness.execute.session import RunOptions
from harness.results import ROWS_FILE
from harness.sweep.suite import Suite

SHARDS_DIR = "shards"


@dataclass(frozen=True)
class LaunchOptions:
    """The launcher options of ``attnbench run`` (docs/distributed.md)."""

    launcher: str  # ray | slurm
    shards: int | None  # number of shards N
    max_retries: int = 1  # retries of a failed shard
    gpus_per_shard: int | None = None  # None: 1 for a suite with cuda points, else 0
    cpus_per_shard: int | None = None  # None: the suite's [measure] threads, else 1
    ray_address: str | None = None  # Ray cluster to join; None: start a local one
    slurm_partition: str | None = None
    slurm_timeout_min: int = 240  # time limit of one shard's job, minutes
    slurm_local: bool = False  # submitit's LocalExecutor instead of Slurm


@dataclass(frozen=True)
class ShardJob:
    """One shard to run, or resume, into ``options.out``: what a worker is handed."""

    suite_path: Path
    spec: ShardSpec
    options: RunOptions


@dataclass(frozen=True)
class ShardSetup:
    """What every shard task needs: the suite, where shards go, and resources per shard."""

    suite_path: Path
    suite_name: str
    out: Path
    n: int
    options: RunOptions  # every shard runs with these (``out``: its own directory)
    gpus: int
    cpus: int
    max_retries: int

    def shard_dir(self, spec: ShardSpec) -> Path:
        return self.out / SHARDS_DIR / spec.dirname

    @property
    def specs(self) -> list[ShardSpec]:
        return [ShardSpec(k, self.n) for k in range(1, self.n + 1)]

    def job(self, spec: ShardSpec) -> ShardJob:
        """Shard ``spec``, run into its directory under ``out``."""
        return ShardJob(self.suite_path, spec, replace(self.options, out=self.shard_dir(spec)))


def shard_setup(suite: Suite, options: RunOptions, launch: LaunchOptions, out: Path) -> ShardSetup:
    """Validate the launcher options against ``suite``; every shard resumes what it holds."""
    if not launch.shards or launch.shards < 1:
        raise CliError(f"--launcher {launch.launcher} needs --shards N (N >= 1)")
    if launch.max_retries < 0:
        raise CliError("--max-retries must be >= 0")
    if (out / ROWS_FILE).exists() and not (out / SHARDS_DIR).is_dir():
        raise CliError(f"--out {out} holds a run that is not a sharded sweep; choose another")
    on_gpu = any(p.device.startswith("cuda") for p in suite.points)
    gpus = launch.gpus_per_shard if launch.gpus_per_shard is not None else int(on_gpu)
    return ShardSetup(
        suite_path=Path(suite.path).resolve(),
        suite_name=suite.name,
        out=out.resolve(),
        n=launch.shards,
        options=replace(options, out=None, resume=True, progress=False),
        gpus=gpus,
        cpus=launch.cpus_per_shard or suite.measure.threads or 1,
        max_retries=launch.max_retries,
    )
