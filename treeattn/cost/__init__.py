"""The cost model: the simulator that times a Plan on a Topology, the compute model, lower
bounds, and a model of NCCL's own tuner for the library collectives."""

from treeattn.cost.bounds import Bounds, lower_bounds
from treeattn.cost.compute import ComputeModel
from treeattn.cost.simulate import OpTiming, SimResult, simulate

__all__ = ["Bounds", "ComputeModel", "OpTiming", "SimResult", "lower_bounds", "simulate"]
