"""The cost model: the simulator that times a Plan on a Topology, the compute model, lower
bounds, and a model of NCCL's own tuner for the library collectives.

The simulator itself is ``treeattn.cost.simulate.simulate``: a package attribute of that name
would be the module once anything imports it."""

from treeattn.lazy import lazy_exports

__all__ = ["Bounds", "ComputeModel", "OpTiming", "SimResult", "lower_bounds"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "bounds": ("Bounds", "lower_bounds"),
    "compute": ("ComputeModel",),
    "simulate": ("OpTiming", "SimResult"),
})
