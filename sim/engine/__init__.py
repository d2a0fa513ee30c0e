"""The serving-engine simulation (DESIGN §7, §9): a SimPy model of continuous batching,
chunked prefill, a paged KV pool and a checkpoint pool, driving a backend (shadow,
reference tensors, GPU, or any implementation) and checking lockstep.

Entry point: :func:`run_simulation` with a :class:`SimConfig` and a workload's requests;
it returns a :class:`SimResult` (``to_json()``). See ``docs/SIMULATION.md``.
"""

from sim.engine.config import Faults, SimConfig
from sim.engine.lockstep import RULES, LockstepChecker, Violation
from sim.engine.result import SimResult
from sim.engine.run import run_simulation

__all__ = [
    "RULES",
    "Faults",
    "LockstepChecker",
    "SimConfig",
    "SimResult",
    "Violation",
    "run_simulation",
]
