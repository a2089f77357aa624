"""The implementation registry: built-ins from the ``implementations`` package plus plug-ins
from the ``attnbench.implementations`` entry-point group.

A plug-in registers data plus one function::

    @register("local", family="local", caps=Capabilities(...), cost=Cost(1, 1))
    def local_attention(q, k, v, mask, scale=None): ...   # q: (B, H, n_q, D) -> (B, H, n_q, D)

An entry point names a module (registration happens at import) or a zero-argument callable.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from harness.masks import MaskSpec
from harness.spec import AttnFn, Capabilities, Cost, Problem

ENTRY_POINT_GROUP = "attnbench.implementations"
BUILTIN_PACKAGE = "implementations"

CoreFn = Callable[..., Tensor]  # (q, k, v, mask, scale=None) -> out


class UnknownImplementation(KeyError):
    """Raised by :func:`get` for a name nobody registered."""

    def __str__(self) -> str:
        return str(self.args[0])


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

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: MaskSpec | None = None,
        scale: float | None = None,
    ) -> Tensor:
        """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D); scale 1/sqrt(D) default."""
        return self.fn(q, k, v, mask if mask is not None else MaskSpec(), scale=scale)

    def unavailable_reason(self) -> str | None:
        """Why this implementation cannot run on this machine at all (None = it can)."""
        try:
            return self.availability()
        except Exception as exc:  # an optional backend's import can fail in many ways
            return f"{type(exc).__name__}: {exc}"

    def not_supported(self, problem: Problem) -> list[str]:
        """Readable reasons why ``problem`` cannot run here; empty when it can."""
        reason = self.unavailable_reason()
        if reason:
            return [f"unavailable: {reason}"]
        out = self.caps.reasons(problem)
        if not out and self.extra_reasons is not None:
            out = list(self.extra_reasons(problem))
        return out

    def prepare(self, problem: Problem) -> AttnFn:
        """Set-up outside the timed call (block masks, layouts, compilation handles)."""
        if self.prepare_fn is not None:
            return self.prepare_fn(problem)
        mask, fn = problem.mask, self.fn
        return lambda q, k, v: fn(q, k, v, mask)


_REGISTRY: dict[str, Implementation] = {}
_LOAD_ERRORS: dict[str, str] = {}
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
) -> Callable[[CoreFn], CoreFn]:
    """Decorator that registers ``fn`` under ``name``; returns ``fn`` unchanged."""

    def decorate(fn: CoreFn) -> CoreFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"implementation {name!r} registered twice")
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
