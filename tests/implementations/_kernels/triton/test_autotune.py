"""The autotune lists and the defaults: each sm_90 default of the band kernels is the one a GPU
measurement chose, recorded with its rows (``autotune.MEASURED``, checked against
``SHAPES``' first entries and against the committed H100 sweep); no warp-specialized config is
listed; the listed TMA config is taken only where a descriptor addresses the rows, and a
launch whose rows it cannot address tunes apart (its own ``MASK_KEY``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from harness.masks import MaskSpec
from implementations._kernels.triton import autotune as tune
from implementations._kernels.triton import kernel_launch, masked_attention
from tests.conftest import make_qkv

ROOT = Path(__file__).resolve().parents[4]
CLASSES = {"sm90-d64": (64, (9, 0)), "sm90-d128": (128, (9, 0)), "sm80-d64": (64, (8, 0)),
           "sm80-d128": (128, (8, 0))}
BAND = ("band_fwd", "band_dq", "band_dkdv")


def _rows(source: str) -> list[dict]:
    with (ROOT / source).open() as fh:
        return list(csv.DictReader(fh))


def test_each_measured_default_is_its_class_first_config():
    """Changing a measured default without changing its record (or the record alone) fails
    here; every sm_90 class of the band kernels has a record, no sm_80 class has one."""
    for (kernel, where), record in tune.MEASURED.items():
        d, capability = CLASSES[where]
        assert tune.config_label(tune.class_configs(kernel, d, capability)[0]) == record.config
    assert set(tune.MEASURED) == {(k, w) for k in BAND for w in ("sm90-d64", "sm90-d128")}


@pytest.mark.parametrize("key", list(tune.MEASURED), ids="-".join)
def test_each_measured_default_is_the_fastest_listed_config_of_its_rows(key):
    """In the committed sweep rows the record names: on each of its cases the default is the
    fastest of the configs that were listed then (candidates were not eligible), and right."""
    record = tune.MEASURED[key]
    rows = [r for r in _rows(record.source) if r["kernel"] == key[0] and r["candidate"] == "False"]
    for case in record.cases:
        mine = [r for r in rows if r["case"] == case and r["status"] == "ok"]
        assert mine, case
        fastest = min(mine, key=lambda r: float(r["ms"]))
        assert fastest["config"] == record.config, (case, fastest["config"], fastest["ms"])


def test_the_listed_tma_config_gave_the_defaults_output_on_the_h100():
    """128x64 / 8 warps / 3 stages through descriptors: listed at sm90-d64 only, right on
    every shape it ran, and the fastest of all on the dense D64 forward."""
    listed = [(k, w) for k in tune.SHAPES for w, (d, cap) in CLASSES.items()
              for c in tune.class_configs(k, d, cap) if c.kwargs.get("TMA")]
    assert listed == [("band_fwd", "sm90-d64")]
    label = next(tune.config_label(c) for c in tune.class_configs("band_fwd", 64, (9, 0))
                 if c.kwargs.get("TMA"))
    rows = [r for r in _rows(tune.SWEEP_H100) if r["kernel"] == "band_fwd"]
    mine = [r for r in rows if r["config"] == label]
    assert {r["case"] for r in mine} >= {"d64", "w256-16k", "w256-64k"}
    assert all(r["status"] == "ok" for r in mine)
    dense = [r for r in rows if r["case"] == "d64" and r["status"] == "ok"]
    assert min(dense, key=lambda r: float(r["ms"]))["config"] == label


def test_no_listed_config_is_warp_specialized(monkeypatch):
    """The warp-specialized candidates stay candidates (two gave wrong outputs on the H100):
    no list, class, prune or pin can select one."""
    monkeypatch.setattr(tune, "interpreted", lambda: False)
    for table in (tune.SHAPES, tune.GATHERED_SHAPES):
        assert not [s for shapes in table.values() for s in shapes if len(s) > 5 and "WS" in s[5]]
    for kernel in tune.SHAPES:
        assert not any(c.kwargs.get("WS") for c in tune.configs(kernel))
    candidates = {tune.config_label(c) for c in tune.candidate_configs("band_fwd", 64, (9, 0))
                  + tune.candidate_configs("band_fwd", 128, (9, 0))}
    assert candidates >= tune.WRONG_ON_H100  # still swept, as candidates
    wrong = [r for r in _rows(tune.SWEEP_H100) if r["config"] in tune.WRONG_ON_H100]
    assert wrong and all(r["status"].startswith("mismatch") for r in wrong)


def test_every_candidate_is_a_hopper_path_and_the_backward_lists_none():
    """Candidates are sm_90 configs with a Hopper flag (sm_80 keeps today's path), and no
    listed dQ or dK/dV config sets one: the backward's launches do not key a TMA pick apart
    (``tma_key``), so a listed one would first need that."""
    assert {"band_fwd", "band_dq", "band_dkdv"} <= set(tune.CANDIDATES)
    for kernel, rows in tune.CANDIDATES.items():
        for row in rows:
            assert row[4] and row[4] <= tune.SM90 and row[5].get("TMA"), (kernel, row)
    for table in (tune.SHAPES, tune.GATHERED_SHAPES):
        for kernel in ("band_dq", "band_dkdv"):
            assert not [s for s in table.get(kernel, ()) if len(s) > 5 and s[5]], kernel


def _prune_d64(flags: dict | None = None, **tensors: torch.Tensor) -> list[str]:
    """The labels the forward's prune keeps at D 64 on sm_90 (a CPU tensor: that class) for
    Q, K, V, Out of (1, 2, 64, 64) bf16, some replaced by ``tensors``."""
    q = torch.empty(1, 2, 64, 64, dtype=torch.bfloat16)
    named = {**dict(Q=q, K=q, V=q, Out=q), **tensors}
    kept = tune.prune("band_fwd")(tune.configs("band_fwd"), named, BLOCK_D=64, **(flags or {}))
    return [tune.config_label(c) for c in kept]


def test_the_prune_takes_the_tma_config_only_where_a_descriptor_addresses_the_rows(monkeypatch):
    monkeypatch.setattr(tune, "interpreted", lambda: False)
    plain = [tune.config_label(c) for c in tune.class_configs("band_fwd", 64, (9, 0))]
    assert _prune_d64() == plain and "128x64 w8 s3 tma" in plain
    odd = torch.empty(1, 2, 64, 59, dtype=torch.bfloat16)  # rows of 118 bytes
    assert _prune_d64(V=odd) == [c for c in plain if "tma" not in c.split()]
    assert _prune_d64(flags={"GLOBAL": True}) == [c for c in plain if "tma" not in c.split()]


def test_a_launch_a_descriptor_cannot_address_tunes_apart():
    """D 59 and D 64 share every autotuning key argument but MASK_KEY: the D 59 launch adds
    ``UNADDRESSABLE``, so it never reuses a TMA pick of the D 64 one."""
    mask = MaskSpec(causal=True, window=(40, 0))
    modes = {}
    for d in (64, 59):
        launched: list[kernel_launch.Launch] = []
        q, k, v = make_qkv(1, 2, 97, 97, d, dtype=torch.bfloat16, seed=71)
        with kernel_launch.watching(launched.append, execute=False):
            masked_attention.triton_attention(q, k, v, mask)
        fwd = next(r for r in launched if r.name == "band_fwd")
        modes[d] = dict(zip(fwd.kernel.arg_names, fwd.args, strict=False))["MASK_KEY"]
    assert modes[59] == modes[64] + tune.UNADDRESSABLE
