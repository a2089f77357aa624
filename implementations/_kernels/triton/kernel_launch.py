"""How one launch of a fused kernel runs, and who watches it.

A launch of an autotuned kernel runs with one of three configs:

- ``autotuned`` (the default): the autotuner's pick for the launch's tuning key; the first
  launch of a key compiles and times every config of the GPU's class;
- ``pinned`` (``ATTNBENCH_AUTOTUNE=off``, :func:`.autotune.autotuning`): the class
  default, the config ``benchmarks/aot_kernels.py --ci`` compiles (under the interpreter: the
  kernel's one config), launched straight through the jitted function, so nothing is timed
  and one variant compiles per kernel and mask mode;
- ``forced`` (:func:`forced`, for the duration): a given config, however it is listed (the
  kernel sweep times every candidate this way).

Kernels that are not autotuned (delta, split combine) run ``fixed`` with their own options.
:func:`watching` hands every :class:`Launch` to a listener: the tests count the variants a
call compiles on a GPU (:func:`compile_keys`); the sweep records a call's launches and replays
one of them with each config (:meth:`Launch.replay`). Under the interpreter, launches run
without its idle work (:func:`.interpreter.lighten`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
import triton

from implementations._kernels.triton import interpreter
from implementations._kernels.triton.autotune import (
    autotuning,
    class_configs,
    config_label,
    interpreted,
    tma_allowed,
    usable,
    without_tma,
)

Grid = tuple | Callable[[dict], tuple]
_FORCED: dict[str, triton.Config] = {}
_WATCHERS: list[tuple[Callable[[Launch], None], bool]] = []  # (listener, whether launches run)
if interpreted():
    interpreter.lighten()


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel's name, the kernel object (an autotuner, a jitted function
    or a stand-in), its grid (a tuple, or a function of the config's meta-parameters), its
    arguments, the config it ran with (None: the autotuner picked, or none applies) and how it
    was chosen: ``autotuned``, ``pinned``, ``forced`` or ``fixed``."""

    name: str
    kernel: object
    grid: Grid
    args: tuple
    kwargs: dict
    config: triton.Config | None
    how: str

    def replay(self, config: triton.Config | None = None) -> None:
        """Launch again on the same tensors, with ``config`` (through the jitted function, no
        autotuning), or as it ran."""
        _run(self.kernel, self.grid, self.args, self.kwargs, config or self.config)

    def compile(self, config: triton.Config | None = None) -> None:
        """Compile the launch with ``config`` (or its own) without running it; under
        ``triton.AsyncCompileMode`` the compile runs on that mode's executor."""
        config = config or self.config
        if not _tuned(self.kernel):
            self.kernel.warmup(*self.args, grid=self.grid_for(None), **self.kwargs)
        elif config is None:
            raise ValueError(f"{self.name}: an autotuned launch compiles with a given config")
        else:
            self.kernel.fn.warmup(*self.args, grid=self.grid_for(config), **self.kwargs,
                                  **config.all_kwargs())

    def grid_for(self, config: triton.Config | None) -> tuple:
        """The launch grid under ``config``'s tile sizes."""
        if not callable(self.grid):
            return self.grid
        return self.grid({**self.kwargs, **(config.kwargs if config is not None else {})})


@contextlib.contextmanager
def forced(configs: Mapping[str, triton.Config]) -> Iterator[None]:
    """Launches of the named kernels run with these configs for the duration."""
    saved = dict(_FORCED)
    _FORCED.update(configs)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(saved)


@contextlib.contextmanager
def watching(listener: Callable[[Launch], None], execute: bool = True) -> Iterator[None]:
    """Hand each launch to ``listener`` (before it runs) for the duration; ``execute`` False:
    launches are recorded and not run (their outputs stay unwritten until replayed)."""
    entry = (listener, execute)
    _WATCHERS.append(entry)
    try:
        yield
    finally:
        _WATCHERS.remove(entry)


def launch(name: str, kernel, grid: Grid, args: tuple, kwargs: dict) -> Launch:
    """Launch ``kernel`` (``kernel[grid](*args, **kwargs)``) with the config its mode gives;
    ``args[0]`` is a tensor on the launch's device. Returns the launch, its config filled in
    from the autotuner's pick when it autotuned."""
    config, how = _choose(name, kernel, kwargs, args[0].device)
    if config is not None and config.kwargs.get("TMA") and not tma_allowed(
            dict(zip(kernel.arg_names, args, strict=False)), kwargs):
        config = without_tma(config)  # rows a descriptor cannot address: pointer loads
    record = Launch(name, kernel, grid, args, kwargs, config, how)
    for listener, _ in list(_WATCHERS):
        listener(record)
    if not all(execute for _, execute in _WATCHERS):
        return record
    _run(kernel, grid, args, kwargs, config)
    if how == "autotuned":
        record = Launch(name, kernel, grid, args, kwargs, getattr(kernel, "best_config", None),
                        how)
    return record


def _tuned(kernel) -> bool:
    return hasattr(kernel, "configs") and hasattr(kernel, "fn")  # a triton Autotuner


def _choose(name: str, kernel, kwargs: dict, device: torch.device):
    if not _tuned(kernel):
        return None, "fixed"
    if name in _FORCED:
        return _FORCED[name], "forced"
    if autotuning():
        return None, "autotuned"
    if interpreted():
        return kernel.configs[0], "pinned"
    return class_configs(name, kwargs["BLOCK_D"], _capability(device), kwargs)[0], "pinned"


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global scratch for the tensor descriptors a kernel makes on the device (TMA)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (9, 0)


def _run(kernel, grid: Grid, args: tuple, kwargs: dict, config: triton.Config | None) -> None:
    candidates = [config] if config is not None else getattr(kernel, "configs", [])
    if not interpreted() and any(c.kwargs.get("TMA") for c in candidates):
        triton.set_allocator(_scratch)  # the descriptors a TMA config makes need it
    if config is None or not _tuned(kernel):
        kernel[grid](*args, **kwargs)
        return
    shape = grid({**kwargs, **config.kwargs}) if callable(grid) else grid
    kernel.fn[shape](*args, **kwargs, **config.all_kwargs())


def compile_keys(record: Launch, capability: tuple[int, int] = (9, 0)) -> set[tuple]:
    """The kernel variants a GPU of ``capability`` compiles for this launch, each as (kernel,
    config label, compile-time arguments, argument specialization): every config of the class
    when it autotunes, else one. The specialization follows Triton's key (tensor dtypes and
    16-byte alignment, integers equal to 1 or divisible by 16), so a key here is at most one
    compile there. A launch on meta tensors (the AOT check's recording) compiles nothing."""
    if record.args[0].device.type == "meta":
        return set()
    if record.how == "autotuned":  # the prune's: a TMA config only where the launch allows it
        named = dict(zip(getattr(record.kernel, "arg_names", ()), record.args, strict=False))
        configs = usable(class_configs(record.name, record.kwargs["BLOCK_D"], capability,
                                       record.kwargs), named, record.kwargs)
    elif record.how == "pinned":
        configs = class_configs(record.name, record.kwargs["BLOCK_D"], capability,
                                record.kwargs)[:1]
    elif record.how == "forced":
        configs = [record.config]
    else:
        configs = [triton.Config({}, num_warps=record.kwargs.get("num_warps", 4),
                                 num_stages=record.kwargs.get("num_stages", 3))]
    consts = tuple(sorted(record.kwargs.items()))  # the launches pass these by keyword
    spec = tuple(specialization(a) for a in record.args)
    return {(record.name, config_label(c), consts, spec) for c in configs}


def specialization(value) -> object:
    """How Triton's cache key specializes a launch argument: a tensor by dtype and 16-byte
    alignment, an int by 1, a multiple of 16 or its width, a bool as itself."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), value.device.type == "meta" or value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return "1" if value == 1 else "D" if value % 16 == 0 else (
            "i64" if abs(value) >= 2**31 else "i32")
    return type(value).__name__
