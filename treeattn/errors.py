"""One exception hierarchy. The library raises; only the CLI prints and exits.

Every ``TreeattnError`` is rendered by the CLI as one line on stderr. ``exit_code`` says
which status it ends with: 2 for bad input (a wrong file, field, flag or rank count),
1 for a failure of the work itself (a wrong result, a rank that died).
"""

from __future__ import annotations

__all__ = [
    "TreeattnError",
    "InputError",
    "TopologyError",
    "WorkloadError",
    "PlanFormatError",
    "PlanInvalidError",
    "InfeasiblePlanError",
    "ProbeError",
    "ExecutionError",
    "EmulationError",
]


class TreeattnError(Exception):
    """Base of every error treeattn raises on purpose."""

    exit_code = 2
    exit_now = False
    """True where the process must end as soon as the error is printed: a launcher's rank whose
    process group still has operations pending, which tearing it down at exit would wait for
    (up to the set-up deadline)."""


class InputError(TreeattnError):
    """A flag, value or file given by the user is wrong."""


class TopologyError(InputError):
    """A topology file or object is malformed, inconsistent or not routable."""


class WorkloadError(InputError):
    """A decode shape or payload is malformed."""


class KVCacheTooLargeError(WorkloadError):
    """A rank's KV cache past any device's memory (``treeattn.units.MAX_BYTES``)."""


class PlanFormatError(InputError):
    """A plan file cannot be parsed: syntax, field, type or version."""


class PlanInvalidError(InputError):
    """A plan parses but the validator found a violation (missing, double counted,
    unmatched or deadlocked)."""


class InfeasiblePlanError(InputError):
    """An algorithm cannot be built for these ranks/parameters."""


class ProbeError(InputError):
    """A probe input (tool output, sysfs, XML, log) cannot be understood."""


class ExecutionError(TreeattnError):
    """A run failed: a rank died, timed out, or produced a wrong result, or what it measured
    cannot be fitted (calibration)."""

    exit_code = 1


class EmulationError(TreeattnError):
    """The emulated cluster cannot be set up or torn down (no root, no iproute2, ...)."""
