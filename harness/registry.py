"""The implementation registry: built-ins from the ``implementations`` package plus plug-ins
from the ``attnbench.implementations`` entry-point group.

A plug-in registers data plus one function::

    @register("local", family="local", caps=Capabilities(...), cost=Cost(1, 1))
    def local_attention(q, k, v, mask, scale=None): ...   # q: (B, H, n_q, D) -> (B, H, n_q, D)

An approximation of softmax attention (Performer, Linformer, ...) also declares its method
parameters (``params={"features": Param(256, "random features m", minimum=1)}``: the function
takes them as keyword arguments) and ``reference``: a float64 evaluation of its own definition
with the same signature (same random features or projections), which the agreement check
holds it to; its distance from exact softmax attention is measured, not gated. A causal
attention with a fixed-size recurrent state (linear attention) also declares ``recurrence``
(:class:`harness.spec.Recurrence`): ``impl.new_state(problem)`` makes that state, whose
``advance(q, k, v)`` decodes without a KV cache.

An entry point names a module (registration happens at import) or a zero-argument callable.
A single file needs neither: ``attnbench run --plugin FILE.py`` or ``ATTNBENCH_PLUGINS``
(:mod:`harness.plugins`, :func:`load_plugins`).

The ``reference=`` contract (what the oracle calls, :mod:`harness.oracle.definition`):
``reference(q, k, v, mask, rows=None, **params)`` with q (B, H, n_q, D), k/v (B, H_kv, n_k, D),
``rows`` None or a 1-D long tensor of query rows, returning (B, H, len(rows) or n_q, D) **in the
dtype of its inputs** -- no cast to float64 inside: the harness calls it with float64 inputs for
the oracle and with the call's dtype for the naive error that scales the tolerance
(``k x naive + eps``, :mod:`harness.oracle.agreement`); a reference that always computes in
float64 makes that naive error zero, and every point fails. ``register`` refuses a reference
without ``rows=``; :func:`reference_contract` checks the dtype and rows on tiny inputs, once,
when a plug-in file is loaded and at probe time (an implementation that breaks it is
unavailable, with the reason).

Calling an :class:`Implementation` directly checks the same capabilities the runner checks and
raises :class:`NotSupportedError` instead of silently computing another mask. Optional backends
register a ``probe``: one tiny real call per device type, run once per process; availability
comes from that call, not from whether a module imports. What a probe found is also remembered
per environment (:mod:`harness.probecache`), so a caller that must not launch kernels (``attnbench
list`` on a GPU, where a probe may compile for seconds) can still say it:
:meth:`Implementation.availability_here` with ``run_probe`` false.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from harness import plugins, probecache
from harness.errors import first_line
from harness.masks import MaskSpec, check_rows, reduced
from harness.spec import (
    AttnFn,
    Capabilities,
    Cost,
    Paged,
    Param,
    ParamValue,
    Problem,
    Recurrence,
    RecurrentState,
)

ENTRY_POINT_GROUP = "attnbench.implementations"
BUILTIN_PACKAGE = "implementations"

CoreFn = Callable[..., Tensor]  # (q, k, v, mask, scale=None, **params) -> out
ProbeFn = Callable[[str], object]  # device type -> anything; raises when the backend cannot run


class UnknownImplementation(KeyError):
    """Raised by :func:`get` for a name nobody registered."""

    def __str__(self) -> str:
        return str(self.args[0])


class NotSupportedError(ValueError):
    """A direct call that is outside the implementation's declared capabilities."""


def machine_device_types() -> list[str]:
    """Device types this process can run on, preferred first (``cuda`` when visible)."""
    return ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]


def problem_of(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, params: tuple = ()
) -> Problem:
    """The :class:`Problem` of a direct call. q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D);
    ``params``: (name, value) method parameters, sorted by name."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (B, H, N, D), got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return Problem(
        batch=q.shape[0], heads=q.shape[1], n_q=q.shape[-2], n_k=k.shape[-2],
        head_dim=q.shape[-1], dtype=q.dtype, device=q.device.type, mask=mask, backward=grad,
        kv_heads=None if k.shape[1] == q.shape[1] else k.shape[1], params=params,
    )


def tiny_qkv(device_type: str, dtype: torch.dtype, head_dim: int = 64) -> tuple[Tensor, ...]:
    """Small seeded (1, 2, 16, head_dim) q, k, v for availability probes."""
    gen = torch.Generator().manual_seed(0)
    return tuple(
        torch.randn(1, 2, 16, head_dim, generator=gen).to(device_type, dtype) for _ in range(3)
    )


@dataclass(frozen=True)
class TinyCall:
    """A probe that is one tiny real call of the implementation itself: :func:`tiny_qkv`
    under a causal mask, in ``dtype`` on CUDA (the fused kernels want half precision) and
    ``cpu_dtype`` on a CPU. A backend that imports but cannot run here (an operator that does
    not load, no kernel for this GPU) fails it."""

    dtype: torch.dtype = torch.float16
    cpu_dtype: torch.dtype = torch.float32

    def probe(self, fn: CoreFn) -> ProbeFn:
        """The probe of ``fn``: device type -> its output on the tiny inputs."""

        def call(device_type: str) -> Tensor:
            dtype = self.dtype if device_type == "cuda" else self.cpu_dtype
            return fn(*tiny_qkv(device_type, dtype), MaskSpec(causal=True))

        return call


@dataclass(frozen=True)
class Availability:
    """Whether an implementation runs here: ``reason`` why not (None: it does), on
    ``device_type``; ``known`` False when only its probe could tell and that was not run."""

    reason: str | None
    device_type: str | None = None
    known: bool = True

    @property
    def available(self) -> bool | None:
        """True / False, or None when not known."""
        return (self.reason is None) if self.known else None


_REASON_CACHE_MAX = 1024


@dataclass(frozen=True)
class Implementation:
    """A registered attention core. Call it as ``impl(q, k, v, mask)``; see :func:`register`."""

    name: str
    family: str
    fn: CoreFn
    caps: Capabilities
    cost: Cost
    description: str = ""
    availability: Callable[[], str | None] = field(default=lambda: None, repr=False)
    extra_reasons: Callable[[Problem], list[str]] | None = field(default=None, repr=False)
    prepare_fn: Callable[[Problem], AttnFn] | None = field(default=None, repr=False)
    probe: ProbeFn | None = field(default=None, repr=False)
    params: dict[str, Param] = field(default_factory=dict)
    reference: CoreFn | None = field(default=None, repr=False)
    recurrence: Recurrence | None = field(default=None, repr=False)
    paged: Paged | None = field(default=None, repr=False)

    @property
    def approximate(self) -> bool:
        """Whether this is an approximation of softmax attention, judged against its own
        float64 definition (``reference``) rather than the exact reference."""
        return self.reference is not None

    def new_state(self, problem: Problem) -> RecurrentState:
        """An empty recurrent state for ``problem`` (its params over the declared defaults);
        raises :class:`NotSupportedError` for an implementation without a recurrent form."""
        if self.recurrence is None:
            raise NotSupportedError(f"{self.name} has no recurrent state (no `recurrence`)")
        return self.recurrence.new_state(problem, **self.param_values(dict(problem.params)))

    def define(
        self, q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None,
        **params: ParamValue,
    ) -> Tensor:
        """The implementation's own definition (its ``reference``) at ``params`` over the
        declared defaults, in the inputs' dtype: q (B, H, n_q, D), k/v (B, H_kv, n_k, D) ->
        (B, H, len(rows) or n_q, D). The reference is always called with every declared
        parameter, so it reads them from ``**params`` without defaults of its own."""
        if self.reference is None:
            raise NotSupportedError(f"{self.name} is exact softmax attention: no `reference`")
        return self.reference(q, k, v, mask, rows=rows, **self.param_values(params))

    def param_values(self, given: dict[str, ParamValue] | None = None) -> dict[str, ParamValue]:
        """Every declared parameter's value: ``given`` over the declared defaults."""
        return {name: (given or {}).get(name, p.default) for name, p in self.params.items()}

    def __post_init__(self) -> None:
        # direct calls repeat the same shapes: their support check is looked up, not redone
        object.__setattr__(self, "_reasons_cache", {})

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: MaskSpec | None = None,
        scale: float | None = None,
        **params: ParamValue,
    ) -> Tensor:
        """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D); scale 1/sqrt(D) default;
        ``params``: the declared method parameters (defaults for the rest).

        Raises :class:`NotSupportedError` when the call is outside the declared capabilities
        (the same check the runner makes before a point runs). The function is handed the
        mask :func:`harness.masks.reduced` at these lengths (same pairs, simplest form).
        """
        mask = mask if mask is not None else MaskSpec()
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        given = tuple(sorted(params.items()))
        # a plain tuple key: building and hashing a Problem on every call costs more than this
        key = (q.shape, k.shape, v.shape, q.dtype, q.device.type, mask, grad, given)
        cache: dict = self._reasons_cache  # type: ignore[attr-defined]
        reasons = cache.get(key)
        if reasons is None:
            # a contradictory mask gets the one MaskError of every path, before any refusal
            check_rows(mask, q.shape[-2], k.shape[-2])
            if len(cache) >= _REASON_CACHE_MAX:
                cache.clear()
            problem = problem_of(q, k, v, mask, given)
            reasons = cache[key] = self.not_supported(problem)
        if reasons:
            raise NotSupportedError(f"{self.name} cannot run this call: {'; '.join(reasons)}")
        mask = reduced(mask, q.shape[-2], k.shape[-2])
        return self.fn(q, k, v, mask, scale=scale, **self.param_values(params))

    def unavailable_reason(self, device_type: str | None = None) -> str | None:
        """Why this implementation cannot run here at all (None = it can).

        ``device_type`` (``cpu``/``cuda``): probe that device; None: this machine's preferred
        device among the declared ones, or a reason when it has none of them.
        """
        return self.availability_here(device_type).reason

    def availability_here(
        self, device_type: str | None = None, run_probe: Callable[[str], bool] = lambda d: True
    ) -> Availability:
        """:meth:`unavailable_reason` as an :class:`Availability`. Where the answer needs the
        probe and ``run_probe(device_type)`` is false, the probe does not run: the outcome it
        gave in this process or environment, or ``known=False``."""
        try:
            reason = self.availability()
        except Exception as exc:  # an optional backend's import can fail in many ways
            return Availability(first_line(exc, 300), device_type)
        if reason:
            return Availability(reason, device_type)
        if device_type is None:
            usable = [d for d in machine_device_types() if d in self.caps.devices]
            if not usable:
                return Availability(f"runs on {', '.join(sorted(self.caps.devices))} only; "
                                    f"this machine has {' and '.join(machine_device_types())}")
            device_type = usable[0]
        if self.reference is not None and (broken := _contract_reason(self)):
            return Availability(broken, device_type)
        if self.probe is None or device_type not in self.caps.devices:
            return Availability(None, device_type)  # an undeclared device: a capability reason
        known, reason = _probe_outcome(self, device_type, run_probe(device_type))
        return Availability(reason, device_type, known)

    def not_supported(self, problem: Problem) -> list[str]:
        """Readable reasons why ``problem`` cannot run here; empty when it can."""
        return self.not_supported_each([problem])[0]

    def not_supported_each(self, problems: Sequence[Problem]) -> list[list[str]]:
        """:meth:`not_supported` of each of ``problems`` (the calls one point makes): what the
        declarations say of each first, the same on every machine; then whether the
        implementation runs here, asked once per device type, which wins over every other
        reason; ``extra_reasons`` only of a problem the declarations accept."""
        declared = [self.declared_reasons(p) for p in problems]
        devices = dict.fromkeys(p.device_type for p in problems)
        unavailable = {d: self.unavailable_reason(d) for d in devices}
        out = []
        for problem, found in zip(problems, declared, strict=True):
            if unavailable[problem.device_type]:
                found = [f"unavailable: {unavailable[problem.device_type]}"]
            elif not found and self.extra_reasons is not None:
                found = list(self.extra_reasons(problem))
            out.append(found)
        return out

    def declared_reasons(self, problem: Problem) -> list[str]:
        """Reasons from the declarations alone (capabilities, method parameters): the same on
        every machine, nothing probed."""
        return self.caps.reasons(problem) + self.param_reasons(problem)

    def param_reasons(self, problem: Problem) -> list[str]:
        """Why the problem's method parameters do not fit this implementation (empty = they
        do): names it does not declare, values out of their declared range."""
        out = []
        for name, value in problem.params:
            declared = self.params.get(name)
            if declared is None:
                known = ", ".join(sorted(self.params)) or "none"
                out.append(f"no parameter {name!r} (declared: {known})")
            else:
                out += declared.reasons(name, value)
        return out

    def prepare(self, problem: Problem) -> AttnFn:
        """Set-up outside the timed call (block masks, layouts, compilation handles), for the
        problem's mask :func:`harness.masks.reduced` (the same pairs in their simplest form: a
        causal call of one query is a plain one), so every path takes its fast path for it."""
        problem = replace(problem, mask=reduced(problem.mask, problem.n_q, problem.n_k))
        if self.prepare_fn is not None:
            return self.prepare_fn(problem)
        mask, fn, params = problem.mask, self.fn, self.param_values(dict(problem.params))
        return lambda q, k, v: fn(q, k, v, mask, **params)


_REGISTRY: dict[str, Implementation] = {}
_LOAD_ERRORS: dict[str, str] = {}
_ORIGINS: dict[str, str] = {}  # name -> the file that registered it (for the twice message)
_CONTRACT: dict[tuple[str, CoreFn], str | None] = {}  # (name, reference) -> breach, once
# (name, probe, device type) -> the probe's reason, once per process (holding the probe itself
# keeps a key from being reused by another registration of the name)
_PROBED: dict[tuple[str, ProbeFn, str], str | None] = {}
_loaded = False


def register(
    name: str,
    *,
    family: str,
    caps: Capabilities,
    cost: Cost,
    description: str = "",
    availability: Callable[[], str | None] | None = None,
    extra_reasons: Callable[[Problem], list[str]] | None = None,
    prepare: Callable[[Problem], AttnFn] | None = None,
    probe: ProbeFn | TinyCall | None = None,
    params: dict[str, Param] | None = None,
    reference: CoreFn | None = None,
    recurrence: Recurrence | None = None,
    paged: Paged | None = None,
) -> Callable[[CoreFn], CoreFn]:
    """Decorator that registers ``fn`` under ``name``; returns ``fn`` unchanged.

    ``probe(device_type)`` makes one tiny real call (see :func:`tiny_qkv`) and raises when the
    backend cannot run there; it is run once per process and device type. ``TinyCall()``: that
    call is ``fn`` itself on tiny inputs. ``params``: method
    parameters ``fn`` takes as keyword arguments; ``reference``: for an approximation, the
    float64 evaluation of its own definition (see the module docstring); ``recurrence``: for a
    causal attention with a fixed-size recurrent state, how to make and size that state;
    ``paged``: its decode step over a paged KV cache (:class:`harness.spec.Paged`).
    """

    def decorate(fn: CoreFn) -> CoreFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise plugins.ContractError(
                f"implementation {name!r} registered twice: by {_ORIGINS.get(name, '?')} and "
                f"by {plugins.origin(fn)}")
        if reference is not None and (problem := plugins.reference_signature_problem(reference)):
            raise plugins.ContractError(f"{name}: {problem}")
        _ORIGINS[name] = plugins.origin(fn)
        doc = description or (fn.__doc__ or "").strip().splitlines()[0:1]
        _REGISTRY[name] = Implementation(
            name=name,
            family=family,
            fn=fn,
            caps=caps,
            cost=cost,
            description=doc if isinstance(doc, str) else "".join(doc),
            availability=availability or (lambda: None),
            extra_reasons=extra_reasons,
            prepare_fn=prepare,
            probe=probe.probe(fn) if isinstance(probe, TinyCall) else probe,
            params=dict(params or {}),
            reference=reference,
            recurrence=recurrence,
            paged=paged,
        )
        return fn

    return decorate


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    package = importlib.import_module(BUILTIN_PACKAGE)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{BUILTIN_PACKAGE}.{info.name}")
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
            if callable(target) and not isinstance(target, type(importlib)):
                target()
        except Exception as exc:  # a broken third-party plug-in must not break the harness
            _LOAD_ERRORS[ep.name] = f"entry point {ep.value} failed to load: {exc}"
    files = plugins.env_files()
    if files:  # a bad file is one line and exit 2 (PluginError), whichever command loads it
        _check_contracts(plugins.load_files(files, lambda: set(_REGISTRY)), files)


def load_plugins(paths: list) -> list[str]:
    """Load plug-in files (``--plugin``): the names they registered. Raises
    :class:`harness.plugins.PluginError` (one line, exit 2) for a file that cannot be used or
    an implementation that breaks the ``reference=`` contract. The files are also put in
    ``ATTNBENCH_PLUGINS`` so child processes load them."""
    _load()
    names = plugins.load_files(paths, lambda: set(_REGISTRY))
    _check_contracts(names, paths)
    plugins.remember_for_children(paths)
    return names


def _check_contracts(names: list[str], files: list) -> None:
    for name in names:
        impl = _REGISTRY[name]
        if impl.reference is not None and (broken := _contract_reason(impl)):
            raise plugins.PluginError(f"plug-in {_ORIGINS.get(name, files)}: {name}: {broken}")


def _contract_reason(impl: Implementation) -> str | None:
    """:func:`reference_contract` of ``impl``, run once per process and reference."""
    key = (impl.name, impl.reference)
    if key not in _CONTRACT:
        _CONTRACT[key] = reference_contract(impl)
    return _CONTRACT[key]


def _probe_outcome(impl: Implementation, device_type: str, run: bool) -> tuple[bool, str | None]:
    """(known, reason) of ``impl``'s probe on ``device_type`` (reason None: it passed).

    This process's outcome when it has one; else, with ``run``, the probe runs now (once per
    process and device type) and its outcome is remembered for this environment
    (:mod:`harness.probecache`); without ``run``, the outcome remembered for this environment,
    or ``known=False``."""
    key = (impl.name, impl.probe, device_type)
    if key in _PROBED:
        return True, _PROBED[key]
    if run:
        reason = _PROBED[key] = probe_reason(impl.probe, device_type)
        probecache.remember(impl.name, device_type, reason)
        return True, reason
    return probecache.recall(impl.name, device_type)


def probe_reason(probe: ProbeFn, device_type: str) -> str | None:
    """Run ``probe`` on ``device_type`` and wait for the device (an asynchronous kernel error
    surfaces): None when it passed, else its exception's first line."""
    try:
        result = probe(device_type)
        if isinstance(result, Tensor):
            result.float().sum().item()
    except Exception as exc:  # a broken backend fails in many ways; the reason says which
        return f"probe on {device_type}: {first_line(exc, 300)}"
    return None


def reference_contract(impl: Implementation) -> str | None:
    """Why ``impl.reference`` breaks the contract (module docstring), or None: called on small
    seeded CPU inputs (1, 2, n, 16), n = 16 or else 128, in float32 and float64, all rows and
    rows (0, 7, n - 1), at the declared parameter defaults and the first mask of none / causal
    that ``impl`` declares it supports at that size."""
    fit = None
    for n in (16, 128):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, n, 16, generator=gen) for _ in range(3))
        for causal in (False, True):
            problem = problem_of(q, k, v, MaskSpec(causal=causal))
            extra = impl.extra_reasons(problem) if impl.extra_reasons else []
            if not (impl.declared_reasons(problem) or extra):
                fit = fit or (q, k, v, problem.mask)
    if fit is None:
        return None  # no small CPU call fits its capabilities: the points themselves will tell
    q, k, v, mask = fit
    n = q.shape[-2]
    rows = torch.tensor([0, 7, n - 1])
    try:
        full = impl.define(q, k, v, mask)
        part = impl.define(q, k, v, mask, rows=rows)
        wide = impl.define(q.double(), k.double(), v.double(), mask)
    except Exception as exc:  # whatever the plug-in raised: its first line says it
        return f"reference= failed on a small call: {first_line(exc, 300)}"
    if not all(isinstance(t, Tensor) for t in (full, part, wide)):
        return "reference= must return a tensor"
    if full.dtype != torch.float32 or wide.dtype != torch.float64:
        return (f"reference= returned {full.dtype} for float32 inputs and {wide.dtype} for "
                "float64 ones: it must compute in its inputs' dtype (no .double() inside; the "
                "harness passes float64 inputs for the oracle, and the same-dtype result sets "
                "the tolerance)")
    if tuple(full.shape) != (1, 2, n, 16) or tuple(part.shape) != (1, 2, 3, 16):
        return (f"reference= returned {tuple(full.shape)} (all rows) and {tuple(part.shape)} "
                f"(rows=[0, 7, {n - 1}]); want (B, H, n_q, D) and (B, H, len(rows), D)")
    if not (torch.isfinite(full).all() and torch.isfinite(part).all()):
        return "reference= returned NaN or inf on a small call"
    if not torch.allclose(part, full[:, :, rows], rtol=1e-3, atol=1e-4):
        return "reference= with rows= does not return those rows of its full output"
    return None


def get(name: str) -> Implementation:
    """The implementation registered as ``name``."""
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        if name in _LOAD_ERRORS:
            raise UnknownImplementation(f"{name}: {_LOAD_ERRORS[name]}") from None
        raise UnknownImplementation(
            f"unknown implementation {name!r}; known: {', '.join(names())}"
        ) from None


def names() -> list[str]:
    """Every registered name, sorted by family then name."""
    _load()
    return [i.name for i in sorted(_REGISTRY.values(), key=lambda i: (i.family, i.name))]


def all_implementations() -> list[Implementation]:
    """Every registered implementation, sorted by family then name."""
    return [_REGISTRY[n] for n in names()]


def load_errors() -> dict[str, str]:
    """Entry points that failed to load, name -> reason."""
    _load()
    return dict(_LOAD_ERRORS)
