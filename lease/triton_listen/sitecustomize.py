"""Counts Triton's compiles in every Python process of the GPU proof (cache hits and misses).

The proof puts this folder first on ``PYTHONPATH`` and sets ``ATTNBENCH_TRITON_MISSES=FILE``;
Python imports this module at start-up. When the variable is set, a hook waits for
``triton.knobs`` to be imported (nothing imports Triton on its behalf: a process that never
uses it, or a Python without it, is untouched) and then sets Triton's compilation listener to
:func:`triton_misses.record`, which appends one JSON line per compile. A listener already set
by someone else is kept and called after ours. Then the next ``sitecustomize`` on
``sys.path`` (a virtual environment's, a distribution's) runs, as it would without this one.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"_attnbench_{name}",
                                                  os.path.join(_HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_listener(knobs) -> None:
    """Set ``knobs.compilation.listener`` to the recorder, chained to a listener already set."""
    misses = _load_sibling("triton_misses")
    previous = getattr(knobs.compilation, "listener", None)
    if previous is None or getattr(previous, "_attnbench", False):
        listener = misses.record
    else:
        def listener(**kwargs):
            misses.record(**kwargs)
            previous(**kwargs)
    listener._attnbench = True
    knobs.compilation.listener = listener


class _AfterKnobs(importlib.abc.MetaPathFinder):
    """Finds ``triton.knobs`` as the other finders do and installs the listener once it ran."""

    def find_spec(self, name, path=None, target=None):
        if name != "triton.knobs":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                install_listener(module)
            except Exception as exc:  # counting must never break Triton
                print(f"triton_listen: listener not installed ({exc})", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (the one this one shadows), if any."""
    others = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # as if it had been found first
    spec.loader.exec_module(module)


if os.environ.get("ATTNBENCH_TRITON_MISSES"):
    if "triton.knobs" in sys.modules:
        install_listener(sys.modules["triton.knobs"])
    else:
        sys.meta_path.insert(0, _AfterKnobs())
_chain()
