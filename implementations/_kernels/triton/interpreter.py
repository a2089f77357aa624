"""Triton's NumPy interpreter (``TRITON_INTERPRET=1``: the CPU tests, the kernel sweep's
smoke run) without costs that compute nothing.

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

Profiled again (py-spy, masked and FAVOR+ chunk kernels), the frontend's bookkeeping per
operation still led: each ``tl.tensor`` building its shape as a tuple of constexprs, each
binary operation promoting two operands of one type to that type and walking Triton's tuples
to broadcast two equal shapes, each builtin called through a lambda that copies its keyword
arguments and then through ``builtin``'s wrapper (and a method's), block types of pointers
never remembered (a pointer type is unhashable).

:func:`lighten` skips each where it would compute nothing: a helper's patch when its grid has
already patched every language module the helper sees, the overflow check when ``debug`` is
off, the promotion of two operands of one (non-pointer) type, the broadcast walk of two
scalars or two blocks of one rank, the forwarding wrappers; it remembers the two answers per
type and shape (a block type by its element type's text) and a tensor's shape per block type.
Every value a kernel computes stays the same (tests/.../test_interpreter.py compares the bits
with Triton's own interpreter). Without the interpreter, or with a Triton whose interpreter
lacks these names, it changes nothing.
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
    TRITONS_OWN["tensor"] = tl.tensor.__init__
    tl.tensor.__init__ = _tensor(tl.tensor.__init__)
    semantic = interpreter.interpreter_semantic
    if hasattr(semantic, "broadcast_impl_value"):
        TRITONS_OWN["broadcast"] = semantic.broadcast_impl_value
        semantic.broadcast_impl_value = _broadcast(semantic, semantic.broadcast_impl_value)
    if hasattr(semantic, "binary_op_type_checking_impl"):
        TRITONS_OWN["binary_checks"] = semantic.binary_op_type_checking_impl
        semantic.binary_op_type_checking_impl = _binary_checks(
            semantic, semantic.binary_op_type_checking_impl)
    TRITONS_OWN["patch_attr"] = interpreter._patch_attr
    interpreter._patch_attr = _patch_attr(semantic)
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
    (element type's text, shape, the shape's container): the name is ``<shape, element
    type>``, the shape and count the shape's, so a pointer type (unhashable) is remembered
    too. The element type is always the one given. A shape Triton refuses is refused each time
    (nothing is remembered for it)."""
    known: dict = {}

    def init(self, element_ty, shape):
        try:
            kind = shape.__class__  # Triton takes a list or its own tuple, not Python's
            key = (str(element_ty), kind, tuple(shape.values if kind is tl.tuple else shape))
            self.shape, self.numel, self.name = known[key]
            self.element_ty = element_ty
            return
        except (KeyError, TypeError):  # not seen yet, or unhashable: Triton's own
            pass
        tritons(self, element_ty, shape)
        with contextlib.suppress(TypeError):
            known[key] = (self.shape, self.numel, self.name)

    return init


def _tensor(tritons):
    """``tl.tensor.__init__`` with the tensor's shape (a tuple of constexprs) and element count
    remembered per block type (by its name: element type and shape) and once for every scalar
    type (shape (), one element); its handle, type and scalar type are always the ones given.
    Tensors of one type share these constexprs, as values of one block type share its shape."""
    known: dict = {}

    def init(self, handle, type):  # Triton's parameter names
        if type.__class__ is tl.block_type:
            key = type.name
        elif not type.is_block():
            key = None  # a scalar type: shape (), one element
        else:  # another block type: Triton's own
            tritons(self, handle, type)
            return
        try:
            self.shape, self.numel = known[key]
        except KeyError:
            tritons(self, handle, type)
            known[key] = (self.shape, self.numel)
            return
        self.handle, self.type, self.dtype = handle, type, type.scalar

    return init


def _broadcast(semantic, tritons):
    """The semantic's ``broadcast_impl_value`` without its walk over Triton's tuples for two
    scalars or two blocks of one rank: the same result shape (a dimension of 1 takes the
    other's), the same broadcasts of the side whose shape differs from it. A block beside a
    scalar, ranks that differ and shapes that clash (Triton's error) go to Triton's."""
    block_type, make_tensor, builder = tl.block_type, semantic.make_tensor, semantic.builder

    def broadcast(lhs, rhs):
        lhs_ty, rhs_ty = lhs.type, rhs.type
        if lhs_ty.__class__ is block_type and rhs_ty.__class__ is block_type:
            lhs_shape, rhs_shape = lhs_ty.shape.values, rhs_ty.shape.values
            if lhs_shape == rhs_shape:
                return lhs, rhs
            if len(lhs_shape) != len(rhs_shape):
                return tritons(lhs, rhs)
            ret_shape = []
            for left, right in zip(lhs_shape, rhs_shape, strict=True):
                if left == 1:
                    ret_shape.append(right)
                elif right == 1 or right == left:
                    ret_shape.append(left)
                else:
                    return tritons(lhs, rhs)  # its error
            if lhs_shape != ret_shape:
                lhs = make_tensor(builder.create_broadcast(lhs.handle, ret_shape),
                                  block_type(lhs_ty.scalar, ret_shape))
            if rhs_shape != ret_shape:
                rhs = make_tensor(builder.create_broadcast(rhs.handle, ret_shape),
                                  block_type(rhs_ty.scalar, ret_shape))
            return lhs, rhs
        if not lhs_ty.is_block() and not rhs_ty.is_block():
            return lhs, rhs
        return tritons(lhs, rhs)

    return broadcast


def _binary_checks(semantic, tritons):
    """The semantic's ``binary_op_type_checking_impl`` without its promotion for two tensors of
    one scalar type that is not a pointer: the promoted type is that type (Triton's rules for
    equal types; a division or modulo of floats is left to Triton's, which may promote), so
    each cast returns its tensor as it is and only the broadcast remains. Any other pair
    (numbers, pointers, mixed types) goes to Triton's."""
    tensor, broadcast = tl.tensor, semantic.broadcast_impl_value

    def checks(lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
               div_or_mod=False):
        if (lhs.__class__ is tensor and rhs.__class__ is tensor and lhs.dtype is rhs.dtype
                and not lhs.dtype.is_ptr() and not (arithmetic_check and div_or_mod)):
            return broadcast(lhs, rhs)
        return tritons(lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    return checks


def _forwarders() -> frozenset:
    """The code of the wrappers that only pass their arguments on to the function they close
    over (``fn``): ``builtin``'s (its one check, that a semantic is given, holds for every
    call the interpreter patches) and ``_tensor_member_fn``'s (a free function as a method)."""
    codes = {tl.core.builtin(lambda _semantic=None: None).__code__}
    codes.update(m.__code__ for m in vars(tl.tensor).values()
                 if getattr(getattr(m, "__code__", None), "co_qualname", "")
                 == "_tensor_member_fn.<locals>.wrapper")
    return frozenset(c for c in codes if c.co_freevars == ("fn",))


def _patch_attr(semantic):
    """The interpreter's ``_patch_attr`` (run for each builtin at each launch): the patched
    member calls the builtin's own function with the interpreter's semantic, as Triton's lambda
    does through the forwarding wrappers (:func:`_forwarders`), without building a filtered
    copy of its keyword arguments and the wrappers' calls."""
    forwarders = _forwarders()

    def patch_attr(obj, name, member, builder, scope):
        fn = member
        while getattr(fn, "__code__", None) in forwarders:
            fn = fn.__closure__[0].cell_contents

        def patched(*args, **kwargs):
            kwargs["_semantic"] = semantic
            return fn(*args, **kwargs)

        scope.set_attr(obj, name, patched)

    return patch_attr
