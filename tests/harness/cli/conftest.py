"""Fixtures of the CLI tests."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.measure import calibrate


@pytest.fixture(scope="module")
def calibrated_once():
    """``attnbench run`` measures the device calibration for each new run (a 2048² GEMM and a
    256 MiB copy, up to 7 repeats each: 2 s at load 2, 5 s at load 5). The modules that use
    this fixture test the command, not the calibration: the first run of a device, dtypes and
    thread count in the module measures it for real, later runs get a copy of that one (as
    ``attnbench verdicts`` hands its suites one calibration). ``tests/harness/measure`` and
    ``test_env.py`` test the calibration itself."""
    real = calibrate.calibrate
    made: dict[tuple, dict] = {}

    def once(device="cpu", dtypes=None) -> dict:
        name = calibrate._device_of(device)[0]
        key = (name, dtypes, torch.get_num_threads())
        if key not in made:
            made[key] = real(device, dtypes)
        calibrate._THIS_RUN[torch.device(name).type] = made[key]  # as the real one leaves it
        return copy.deepcopy(made[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibrate, "calibrate", once)
        yield
