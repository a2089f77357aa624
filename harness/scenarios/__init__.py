"""Scenarios: what a sweep point times. One folder per scenario, ``harness/scenarios/<name>/``,
found by looking (as the implementations are): adding a scenario is adding a folder.

A folder holds two things:

- its ``__init__.py`` declares ``COLUMNS``, the row columns the scenario adds (its settings, as
  point columns, then its measurements) with :class:`harness.columns.Column`, and, when the
  scenario runs baselines of its own rather than registry implementations, ``BASELINES``
  (implementation name -> family). It imports nothing heavy: :mod:`harness.schema` reads it,
  the ``table`` verb never imports torch, and ``list`` shows the baselines from it.
- its modules define the behaviour: one of them registers a
  :class:`harness.scenarios.interface.Scenario` subclass with
  :func:`harness.scenarios.interface.register` (its typed settings, ``problem()``, ``cost()``,
  ``support()``, ``build_case()``). :func:`harness.scenarios.interface.get` imports them.

This module is the light half of the discovery: the folders and their declared columns.
"""

from __future__ import annotations

import importlib
import pkgutil

from harness.columns import Column


def folders() -> list[str]:
    """The scenario folders (subpackages of this package), sorted by name."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if info.ispkg)


def modules() -> list[str]:
    """The dotted names of every module in every folder (the behaviour; nothing imported but
    the folders' light ``__init__``)."""
    out = []
    for name in folders():
        package = importlib.import_module(f"{__name__}.{name}")
        out += [f"{package.__name__}.{i.name}" for i in pkgutil.iter_modules(package.__path__)]
    return out


def declared_columns() -> list[Column]:
    """Every folder's ``COLUMNS``, folder by folder in name order."""
    out: list[Column] = []
    for name in folders():
        out.extend(importlib.import_module(f"{__name__}.{name}").COLUMNS)
    return out


def declared_baselines() -> dict[str, tuple[str, str]]:
    """Every folder's ``BASELINES``: implementation name -> (scenario folder, family)."""
    out: dict[str, tuple[str, str]] = {}
    for name in folders():
        declared = getattr(importlib.import_module(f"{__name__}.{name}"), "BASELINES", {})
        out.update({impl: (name, family) for impl, family in declared.items()})
    return out


def declaring(column: str) -> list[str]:
    """The folders whose ``COLUMNS`` declare ``column`` (the scenarios whose rows record it),
    in name order; empty for a column every row has (declared in :mod:`harness.schema`)."""
    return [name for name in folders()
            if any(c.name == column for c in importlib.import_module(f"{__name__}.{name}").COLUMNS)]
