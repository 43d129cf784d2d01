"""Planning a run before launching it: how much memory one training iteration needs, and which settings fit.

    trainer/planning/
      memory.py   estimate_memory(...) -> MemoryEstimate: the public entry, argument checks, block extrapolation
      layouts.py  each strategy's layout: the module prepared by the strategies' own code, on fake tensors
      trace.py    one training iteration under PyTorch's memory trackers (fake tensors: an estimate; real: a measurement)
      models.py   where the model comes from (module, factory, config directory), its repeated blocks, batch and loss
      budget.py   plan_memory(...): the configurations that fit a memory budget, and why the others do not
      measure.py  the measured counterpart: one real iteration, set up by the real strategy, under the same trackers
"""

from trainer.planning.memory import MemoryEstimate, estimate_memory

__all__ = ["MemoryEstimate", "estimate_memory"]
