"""Calibration: measure a machine (or read saved benchmark logs) and fit the cost model.

* ``live``: ``treeattn calibrate`` on real ranks. It runs the Plans of ``plans`` (ping-pong
  per route class, concurrent flows, fan-in, compute, small attention trees, library
  all-reduces) through ``treeattn.exec`` and times the executor's kernels (``compute``);
  these two modules import torch, through ``exec``.
* ``pingpong`` fits per-class alpha/beta and the per-message overhead; ``fit_host`` fits the
  host CPU terms of ranks that are processes on one machine through the simulator;
  ``apply_fit`` writes fitted figures into a copy of a Topology.
* ``nccl_tests`` parses nccl-tests / rccl-tests logs (``nccl_tests_json`` the JSON file of
  nccl-tests' ``-J``) and fits each (``fit``: alpha-beta, plain and per collective);
  ``from_nccl_tests`` maps those fits onto a topology's route classes.

Importing this package (or any module but ``live``, ``compute`` and ``plot``) does not
import torch.
"""

from treeattn.calibrate.apply_fit import ClassParams, FittedParams, apply_fit
from treeattn.calibrate.fit import CollectiveFit, Fit, fit_alpha_beta, fit_collective
from treeattn.calibrate.nccl_tests import NcclTestsLog, calibrate_from_log, parse_nccl_tests, read_nccl_tests

__all__ = [
    "ClassParams",
    "FittedParams",
    "apply_fit",
    "Fit",
    "CollectiveFit",
    "fit_alpha_beta",
    "fit_collective",
    "NcclTestsLog",
    "parse_nccl_tests",
    "read_nccl_tests",
    "calibrate_from_log",
]
