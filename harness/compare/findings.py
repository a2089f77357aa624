"""What a comparison produces: one :class:`Finding` per point and metric, gathered in a
:class:`Comparison` with the warnings about its inputs. Plain data; the rules that make the
findings are in :mod:`harness.compare.rules`, their presentation in
:mod:`harness.render.findings`.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import CliError

# most severe first: ``fail`` is a regression (exit status 1), ``warn`` and ``info`` are
# reported and never fail, ``ok`` is unchanged
LEVELS = ("fail", "warn", "info", "ok")


class CompareError(CliError):
    """Unusable compare input (exit status 2)."""


@dataclass(frozen=True)
class Finding:
    """One point's verdict on one metric (status, time, mem, numerics or point presence).

    ``baseline``, ``current`` and ``change`` are the values as shown (e.g. ``2.1 ms``,
    ``+12.3% [+8.0%, +16.9%]``), formatted with :mod:`harness.fmt`."""

    point_id: str
    label: str
    metric: str
    level: str
    verdict: str
    baseline: str = ""
    current: str = ""
    change: str = ""


@dataclass(frozen=True)
class Comparison:
    """All findings of one comparison plus warnings about the inputs.

    ``baseline_machine`` / ``current_machine``: each run's device fingerprint as a baseline is
    filed under (:func:`harness.compare.baseline.machine_key`).
    ``time_basis``: the basis the time gate used, ``absolute`` or ``normalized``."""

    baseline: str
    current: str
    baseline_machine: str
    current_machine: str
    findings: tuple[Finding, ...]
    warnings: tuple[str, ...]
    points: int
    time_basis: str = "absolute"

    def count(self, level: str) -> int:
        """How many findings have ``level``."""
        return sum(f.level == level for f in self.findings)

    @property
    def exit_code(self) -> int:
        """1 when any finding failed, else 0."""
        return 1 if self.count("fail") else 0
