"""pccl-sim: the alpha-beta-gamma cost model of every pccl algorithm, machine profiles, and a fit of the
model to pccl-bench measurements, to extrapolate to thousands of GPUs (DESIGN.md, layer 7).

    from pccl_torch import sim
    frontier = sim.load("frontier")                          # configs/machines/frontier.yaml
    sim.predict("all_gather", "hier:ring", 64 << 20, 256, 8, frontier)   # seconds
    sim.best("reduce_scatter", 64 << 20, 256, 8, frontier)               # (name, seconds)
"""

from pccl_torch.sim.costs import Terms, algorithms, best, hierarchical_phases, predict, terms
from pccl_torch.sim.fit import FitReport, fit, format_report
from pccl_torch.sim.machine import PARAMS, MachineProfile, available, load

__all__ = [
    "FitReport",
    "MachineProfile",
    "PARAMS",
    "Terms",
    "algorithms",
    "available",
    "best",
    "fit",
    "format_report",
    "hierarchical_phases",
    "load",
    "predict",
    "terms",
]
