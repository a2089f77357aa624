"""Started by Python in every process whose PYTHONPATH holds this folder (tests/conftest.py
``calibrated_children_env``): the processes a test's run starts on its own (an isolated run's
forkserver and children, a Ray worker, a submitit job), which no ``-c`` prelude reaches.

With ``ATTNBENCH_TEST_CALIBRATION`` set (the JSON of the CPU calibration the test process
measured), :func:`harness.measure.calibrate.calibrate` returns that one for the CPU instead of
measuring it again (2 s of each such process at load 2); other devices and dtypes still measure
theirs. Nothing is imported here up front: the patch goes in when the calibrate module is first
imported, so a process that never imports the harness (Ray's own helpers) pays nothing."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys

TARGET = "harness.measure.calibrate"


def _install(module) -> None:
    given = json.loads(os.environ["ATTNBENCH_TEST_CALIBRATION"])
    real = module.calibrate

    def calibrate(device="cpu", dtypes=None):
        if dtypes or module._device_of(device)[0] != "cpu":
            return real(device, dtypes)
        module._THIS_RUN["cpu"] = dict(given)
        return dict(given)

    module.calibrate = calibrate


class _OnImport(importlib.abc.MetaPathFinder):
    """Finds the calibrate module as the other finders do, and patches it once it ran."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once; and find_spec below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _install(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("ATTNBENCH_TEST_CALIBRATION"):
    sys.meta_path.insert(0, _OnImport())
