"""Triton's NumPy interpreter (``TRITON_INTERPRET=1``: the CPU tests, the kernel sweep's
smoke run) without two costs that compute nothing.

Profiled on a masked forward and backward (Triton 3.9), 57 % of the interpreted time went to:

- each call of a ``@triton.jit`` helper (:mod:`.primitives`) from a kernel patching
  ``triton.language`` again (``inspect.getmembers`` of tl, tl.tensor and tl.math: ~0.7 ms a
  call, thousands of calls a launch), though the launch's grid patched it before its first
  program and restores it after its last;
- each integer ``+``, ``-`` and ``*`` building its int64 overflow check, which
  ``device_assert`` drops unless the interpreter runs with ``debug`` (on a GPU, likewise).

Of the rest, a fifth (measured on a masked forward and backward at load 2: 0.69 CPU-s a call
instead of 0.83-0.94) went to two answers recomputed for every operation of every program:

- the NumPy dtype of a Triton type (``_get_np_dtype``: a dict of 20 types built per call);
- a block type's checks and name (``tl.block_type``: its shape unwrapped and checked for
  powers of two, its name formatted), the same for each (element type, shape).

:func:`lighten` skips each where it would compute nothing: a helper's patch when its grid has
already patched every language module the helper sees, the overflow check when ``debug`` is
off; it remembers the two answers per type and shape. Every value a kernel computes stays the
same. Without the interpreter, or with a Triton whose interpreter lacks these names, it
changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect

import triton.language as tl

_LANGS = (tl, tl.core)
_GRID_LANGS: list[set] = []  # the language modules patched while each running grid runs
TRITONS_OWN: dict = {}  # what :func:`lighten` replaced (the test puts it back to compare)


@functools.cache
def _langs(fn) -> frozenset:
    """The modules ``_patch_lang`` patches for ``fn``: tl and tl.core, where ``fn`` sees them
    (a module's globals, read once: kernels import the language at their module's top)."""
    return frozenset(id(v) for v in fn.__globals__.values()
                     if inspect.ismodule(v) and any(v is lang for lang in _LANGS))


def lighten() -> bool:
    """Skip the interpreter's idle work (above); True when it applies (once per process)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor, function = interpreter.GridExecutor, interpreter.InterpretedFunction
    if getattr(executor, "_attnbench_light", False):
        return True
    builder = getattr(interpreter, "interpreter_builder", None)
    if not (hasattr(builder, "options") and hasattr(function, "rewrite")
            and hasattr(interpreter, "_patch_lang") and hasattr(interpreter, "InterpreterError")):
        return False  # another interpreter than the one measured: left as it is
    run_grid, call_helper = executor.__call__, function.__call__

    def grid(self, *args, **kwargs):
        _GRID_LANGS.append(set(_langs(self.fn)))
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            _GRID_LANGS.pop()

    def helper(self, *args, **kwargs):
        langs = _langs(self.fn)
        if not _GRID_LANGS or not langs <= _GRID_LANGS[-1]:
            # Triton's own call: it patches what the grid has not (a reduction's combine
            # function sees tl.core) and leaves it patched, as later calls then find it
            if _GRID_LANGS:
                _GRID_LANGS[-1] |= langs
            return call_helper(self, *args, **kwargs)
        fn = self.rewrite()  # Triton's call, less the patch its grid has made
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    options = builder.options
    TRITONS_OWN.update(grid=run_grid, helper=call_helper, options=options)
    executor.__call__, function.__call__ = grid, helper
    executor._attnbench_light = True
    if not options.debug and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    if hasattr(interpreter, "_get_np_dtype"):
        TRITONS_OWN["np_dtype"] = interpreter._get_np_dtype
        interpreter._get_np_dtype = _np_dtype(interpreter._get_np_dtype)
    TRITONS_OWN["block_type"] = tl.block_type.__init__
    tl.block_type.__init__ = _block_type(tl.block_type.__init__)
    return True


def _np_dtype(tritons):
    """Triton's ``_get_np_dtype`` remembered per scalar type: a block's is its element's
    (what Triton's returns for it), a pointer's (unhashable) asked each time."""
    known: dict = {}

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        try:
            return known[tt_dtype]
        except KeyError:
            known[tt_dtype] = found = tritons(tt_dtype)
            return found
        except TypeError:  # a pointer type: Triton's answers without its table
            return tritons(tt_dtype)

    return np_dtype


def _block_type(tritons):
    """``tl.block_type.__init__`` with its shape, element count and name remembered per
    (element type, shape); the element type is always the one given. A shape Triton refuses
    is refused each time (nothing is remembered for it)."""
    known: dict = {}

    def init(self, element_ty, shape):
        try:
            key = (element_ty, tuple(shape))
            self.shape, self.numel, self.name = known[key]
            self.element_ty = element_ty
            return
        except (KeyError, TypeError):  # not seen yet, or unhashable: Triton's own
            pass
        tritons(self, element_ty, shape)
        with contextlib.suppress(TypeError):
            known[(element_ty, tuple(shape))] = (self.shape, self.numel, self.name)

    return init
