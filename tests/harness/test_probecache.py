"""Probe outcomes remembered per environment: read back in another process, never in another
environment, and a cache that cannot be written is no cache rather than an error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import probecache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(probecache.CACHE_ENV, str(tmp_path))
    return tmp_path


def test_an_outcome_is_recalled_in_the_same_environment_only(cache, monkeypatch):
    assert probecache.recall("x", "cuda") == (False, None)
    probecache.remember("x", "cuda", "probe on cuda: RuntimeError: no kernel image")
    probecache.remember("y", "cuda", None)
    assert probecache.recall("x", "cuda") == (True, "probe on cuda: RuntimeError: no kernel image")
    assert probecache.recall("y", "cuda") == (True, None)
    assert probecache.recall("y", "cpu") == (False, None)
    other = {**probecache.environment(), "torch": "9.9.9"}
    monkeypatch.setattr(probecache, "environment", lambda: other)
    assert probecache.recall("x", "cuda") == (False, None)  # another install: another file


def test_another_process_of_the_same_environment_reads_it(cache):
    probecache.remember("z", "cuda", None)
    code = "from harness import probecache; print(probecache.recall('z', 'cuda'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "(True, None)"


def _fake_distribution(folder, name: str) -> str:
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    return str(folder)


def test_what_a_process_imported_does_not_change_its_environment(tmp_path, monkeypatch):
    """Folders that imports add to sys.path (ray's thirdparty_files, setuptools' _vendor), and
    a folder there twice, leave the environment as another process reads it; a distribution
    on PYTHONPATH, which every process of that environment sees, changes it."""
    once = probecache.environment.__wrapped__()
    monkeypatch.syspath_prepend(_fake_distribution(tmp_path / "vendored", "vendored-copy"))
    for entry in [p for p in sys.path if p]:  # every folder on sys.path, a second time
        monkeypatch.syspath_prepend(entry)
    assert probecache.environment.__wrapped__() == once
    monkeypatch.setenv("PYTHONPATH", _fake_distribution(tmp_path / "plugins", "a-plugin"))
    assert probecache.environment.__wrapped__()["distributions"] != once["distributions"]


def test_the_fingerprint_follows_what_decides_a_probe():
    env = probecache.environment()
    assert {"torch", "torch_cuda", "distributions", "python"} <= set(env)
    assert probecache.fingerprint(env) != probecache.fingerprint({**env, "driver": "580.1"})


def test_an_unwritable_or_corrupt_cache_is_no_cache(cache, monkeypatch):
    path = cache / "probes" / f"{probecache.fingerprint()}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert probecache.recall("x", "cpu") == (False, None)
    probecache.remember("x", "cpu", None)  # replaces the corrupt file
    assert probecache.recall("x", "cpu") == (True, None)
    monkeypatch.setenv(probecache.CACHE_ENV, str(cache / "file"))
    (cache / "file").write_text("a file where the cache folder should be")
    probecache.remember("x", "cpu", None)  # no error
    assert probecache.recall("x", "cpu") == (False, None)
