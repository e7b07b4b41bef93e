"""Validate the planner and the cost model on emulated clusters (``treeattn validate``).

``default_cases`` scales the workloads to the emulated links, ``case_plans`` picks what each
case measures (every candidate family's best plan and the pick), ``validate`` brings each
topology up, calibrates inside it, measures everything with the executor beside the
simulator's prediction and writes a results folder for ``treeattn.report``.
Needs root and iproute2 (``treeattn.emulate``); imports torch only through ``treeattn.exec``,
when it measures.
"""

from treeattn.validate.calibration import Calibration, CalibrationSettings, calibrate_in_cluster
from treeattn.validate.cases import EMU_HEADS, CaseSpec, HeadShape, default_cases
from treeattn.validate.methods import CasePlans, MethodPlan, case_plans
from treeattn.validate.run import TopologyRun, TopologyTarget, ValidateOptions, validate, validate_topology

__all__ = [
    "EMU_HEADS",
    "Calibration",
    "CalibrationSettings",
    "CasePlans",
    "CaseSpec",
    "HeadShape",
    "MethodPlan",
    "TopologyRun",
    "TopologyTarget",
    "ValidateOptions",
    "calibrate_in_cluster",
    "case_plans",
    "default_cases",
    "validate",
    "validate_topology",
]
