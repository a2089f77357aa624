"""``attnbench run SUITE --launcher ray|slurm --shards N --out DIR``: hand the shards of a
sweep to an existing engine, then merge them. No scheduling of our own: Ray places one task per
shard with the resources it asks for (and retries failed tasks); Slurm runs one array task per
shard through submitit (:mod:`harness.distributed.engines`). Each shard runs as
``attnbench run SUITE --shard K/N --resume`` would (:func:`harness.distributed.worker.run_shard`)
into ``DIR/shards/shard-K-of-N``; when every shard has finished, ``DIR`` becomes the merged run.

Both resume: a shard whose every point has a row is not submitted again, and a partly done
shard continues where it stopped. Ray tasks carry the suite file and the shard's rows to and
from the worker (no shared filesystem needed); Slurm jobs read and write ``DIR`` directly
(the usual shared filesystem of a Slurm cluster)."""

from __future__ import annotations

from pathlib import Path

from harness.distributed.engines import run_on_ray, run_on_slurm
from harness.distributed.merge import merge_runs, print_report
from harness.distributed.shard import ShardSpec, shard_done
from harness.distributed.shard_setup import SHARDS_DIR, LaunchOptions, shard_setup
from harness.execute.session import RunOptions
from harness.measure.env import new_run_id
from harness.sweep.suite import Suite


def launch(suite: Suite, options: RunOptions, launcher: LaunchOptions) -> int:
    """Run every unfinished shard of ``suite`` on the chosen engine, then merge them into
    ``options.out``; returns the exit status (1: a shard failed or the merge is incomplete)."""
    out = options.out or Path("runs") / f"{suite.name}-{new_run_id()}"
    setup = shard_setup(suite, options, launcher, out)
    todo = [s for s in setup.specs if not shard_done(setup.shard_dir(s), suite.sha256)]
    done = setup.n - len(todo)
    print(
        f"attnbench: suite {suite.name!r} in {setup.n} shards via {launcher.launcher}"
        + (f" ({done} already done)" if done else "")
        + f" -> {out}"
    )
    if not todo:
        failures: dict[ShardSpec, str] = {}
    elif launcher.launcher == "ray":
        failures = run_on_ray(setup, todo, address=launcher.ray_address)
    else:
        failures = run_on_slurm(
            setup,
            todo,
            partition=launcher.slurm_partition,
            timeout_min=launcher.slurm_timeout_min,
            local=launcher.slurm_local,
        )
    for spec, reason in sorted(failures.items(), key=lambda item: item[0].k):
        print(f"attnbench: shard {spec} failed after {setup.max_retries} retries: {reason}")
    if failures:
        print(
            f"attnbench: {len(failures)} of {setup.n} shards failed; the others are kept in "
            f"{out / SHARDS_DIR}. Rerun the same command to retry only what is missing."
        )
        return 1
    report = merge_runs([setup.shard_dir(s) for s in setup.specs], out, overwrite=True)
    print_report(report)
    return 0 if report.complete else 1
