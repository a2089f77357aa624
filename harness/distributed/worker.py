"""The worker side of a launcher: run one shard in this process, and carry a shard's files to
and from a worker that shares no filesystem with the driver (a Ray task)."""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from harness.distributed.shard import ShardSpec, run_here
from harness.distributed.shard_setup import ShardJob
from harness.errors import CliError
from harness.execute.session import RunOptions, configure
from harness.results import ENV_FILE, ROWS_FILE, load_env, write_env
from harness.sweep.suite import load_suite


class ShardFailed(RuntimeError):
    """A shard's run ended with a non-zero exit status (a refusal such as a foreign run
    directory); the message is ``exit <status>: <its last line>``."""


def run_shard(job: ShardJob) -> None:
    """Run (or resume) one shard in this process; its messages also go to stderr (the
    worker's or job's log). Raise ShardFailed with the run's last message on a refusal."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = _exit_status(job)
    sys.stderr.write(err.getvalue())  # kept in the worker's / job's log as well
    if code != 0:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise ShardFailed(f"exit {code}: {lines[-1] if lines else 'no message'}")


def _exit_status(job: ShardJob) -> int:
    """0 when the shard ran; a refusal is printed as ``attnbench: <message>``, as at the CLI."""
    try:
        suite = load_suite(job.suite_path)
        run_here(suite, configure(suite, job.options), job.options, job.spec)
    except CliError as exc:
        print(f"attnbench: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


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
    options: RunOptions,
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
            run_shard(ShardJob(suite_path, spec, replace(options, out=run_dir)))
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
