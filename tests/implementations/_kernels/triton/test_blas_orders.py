"""The interpreted kernels' agreement tests under a second OpenBLAS kernel.

Triton's interpreter computes ``tl.dot`` with NumPy, so an interpreted kernel's rounding is that
of NumPy's OpenBLAS kernel, which OpenBLAS picks per CPU or takes from ``OPENBLAS_CORETYPE``:
machines of this kind run Haswell's (AMD, where the variable is set) or SkylakeX's (Intel with
AVX-512). Their dot products sum in different orders; an agreement rule that held under one
and not the other once failed the README's test command on one kind of machine only. The main
run covers this machine's kernel; this test runs the numerically sharpest agreement tests
again under the other one, in one pytest process: SkylakeX where the CPU has AVX-512 and
Haswell is the default, else Haswell, or Sandybridge where the CPU lacks AVX-512 (SkylakeX's
kernels stop there with an illegal instruction, so no machine without AVX-512 can run them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("threadpoolctl")

ROOT = Path(__file__).resolve().parents[4]
HERE = "tests/implementations/_kernels/triton"
SHARPEST = ("test_feature_attention.py", "test_nystrom_path.py")
SHARPEST_K = "(matches_the_float64 and float32) or stabiliser"
"""The files and ``-k`` expression of the agreement tests whose products carry the most
rounding (FAVOR+'s exponentiated logits, Nyström's pseudo-inverse), in fp32: a bf16 output's
rounding (8 bits) is far coarser than the order of an fp32 sum, so the bf16 cases' outcome does
not depend on the BLAS kernel; the stabiliser tests are fp32. The masked kernels' agreement
tests (softmax of logits that no exponential amplifies past fp32's rounding) are left to the
main run: with them this test took 4 min 11 s of CPU time, a third of it theirs."""

PROBE = ("from threadpoolctl import threadpool_info; import json, numpy; print(json.dumps("
         "[i['architecture'] for i in threadpool_info() if i['internal_api'] == 'openblas']))")


def blas_kernel(coretype: str | None) -> str:
    """The OpenBLAS kernel NumPy runs with ``OPENBLAS_CORETYPE=coretype`` (None: as set)."""
    env = dict(os.environ)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)[0]


def other_coretype(default: str, avx512: bool) -> str:
    """The kernel to run beside ``default``: the other of Haswell and SkylakeX where the CPU
    can run both; Sandybridge (another summation order) where it cannot run SkylakeX."""
    if default == "SkylakeX":
        return "Haswell"
    return "SkylakeX" if avx512 else "Sandybridge"


def has_avx512() -> bool:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return " avx512f" in text


def test_other_coretype_choice():
    assert other_coretype("SkylakeX", True) == "Haswell"
    assert other_coretype("Haswell", True) == "SkylakeX"
    assert other_coretype("Haswell", False) == "Sandybridge"
    assert other_coretype("Zen", False) == "Sandybridge"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS core types: x86 Linux")
def test_agreement_holds_under_the_other_blas_kernel():
    default = blas_kernel(None)
    other = other_coretype(default, has_avx512())
    assert blas_kernel(other) != default, f"OPENBLAS_CORETYPE={other} did not change the kernel"
    env = dict(os.environ, OPENBLAS_CORETYPE=other)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rp", "-p", "no:xdist", "-p", "no:cacheprovider",
         *(f"{HERE}/{name}" for name in SHARPEST), "-k", SHARPEST_K],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
    assert done.returncode == 0, f"under OpenBLAS {other} (default {default}):\n{tail}"
    passed = re.findall(r"^PASSED (\S+)", done.stdout, re.MULTILINE)
    for name in SHARPEST:  # the selection still finds each file's fp32 agreement tests
        assert any(t.startswith(f"{HERE}/{name}::") and "float32" in t for t in passed), tail
