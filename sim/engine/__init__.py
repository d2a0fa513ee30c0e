"""The serving-engine simulation (DESIGN §7, §9): a SimPy model of continuous batching,
chunked prefill, a paged KV pool and a checkpoint pool, driving a backend (shadow,
reference tensors, GPU, or any implementation) and checking lockstep.

Entry point: :func:`run_simulation` with a :class:`SimConfig` and a workload's requests;
it returns a :class:`SimResult` (``to_json()``). See ``docs/SIMULATION.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.engine.config import Faults, SimConfig
from sim.engine.lockstep import RULES, LockstepChecker, Violation
from sim.engine.result import SimResult

if TYPE_CHECKING:
    from sim.engine.run import run_simulation


def __getattr__(name: str) -> Any:
    # run_simulation pulls in the backends and with them torch: imported on first use,
    # so that validating a scenario (``hyckpt check``) never waits for torch.
    if name == "run_simulation":
        from sim.engine.run import run_simulation

        return run_simulation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RULES",
    "Faults",
    "LockstepChecker",
    "SimConfig",
    "SimResult",
    "Violation",
    "run_simulation",
]
