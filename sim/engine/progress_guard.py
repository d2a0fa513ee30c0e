"""What one request needs alone, and the guard that stops a run making no progress.

Two rules keep a timed run from preempting forever on a budget too small for its
requests (docs/SIMULATION.md, "Requests the budget cannot serve"):

- **Arrival.** A request is rejected on arrival when the pool could not hold it even
  alone: the KV blocks of its whole sequence, plus with unified memory the state pages
  one running request holds at once (:func:`state_pages_per_request`). vLLM refuses, at
  start-up, a ``max_model_len`` whose request would not fit this way
  (``vllm/v1/core/kv_cache_planning.py``, ``check_enough_kv_cache_memory``; each Mamba
  layer counts ``2 + num_speculative_blocks + num_prefill_checkpoint_blocks`` pages in
  align mode, ``MambaSpec.max_memory_usage_bytes`` in ``vllm/v1/kv_cache_interface.py``),
  and a prompt longer than ``max_model_len`` is refused as it arrives.
- **No progress.** Some rule mixes still let requests that each fit alone push each other
  out forever (in asynchronous steps, a request's own capture still being written holds
  a slot it cannot evict). The engine counts preemptions since any request last computed
  a token it had never computed before (or finished); past :data:`STALL_PREEMPTIONS` it
  raises :class:`StalledRunError`, naming the requests and the pages, instead of
  running forever.
"""

from __future__ import annotations

from collections.abc import Sequence

from reference.errors import BudgetTooSmallError
from sim.engine.config import SimConfig
from sim.engine.sequence import Seq

#: Preemptions in a row with no request computing a new token before a run is called
#: stalled. A run that moves resets the count at every step that computes anything new,
#: so this is far above what one needs: on tiny budgets vLLM's rules never passed 1, and
#: random mixes of the switches that did not stall never passed 119
#: (docs/SIMULATION.md, "Requests the budget cannot serve").
STALL_PREEMPTIONS = 10_000


class StalledRunError(BudgetTooSmallError):
    """A timed run's requests keep preempting each other (or one itself) and none
    computes anything new: the budget cannot serve them under this configuration.

    Attributes:
        step: the engine step it stopped at.
        preemptions: preemptions since the last progress.
    """

    def __init__(self, message: str, step: int, preemptions: int) -> None:
        # All in args: SimPy raises a process's error again as type(error)(*error.args).
        super().__init__(message, step, preemptions)
        self.step, self.preemptions = step, preemptions

    def __str__(self) -> str:
        return str(self.args[0])


def state_pages_per_request(config: SimConfig) -> int:
    """Pages of the unified budget one running request's states take at once, at most:
    its ``running_states``, with ``state_handover`` the state it leaves when its state
    moves to a new block (held for the step), and with ``required_captures`` under
    ``preemption = "resume"`` a resumed prefill's transient checkpoint (SEMANTICS H9,
    H9a, H9g): vLLM's ``2 + num_prefill_checkpoint_blocks`` Mamba pages. 0 with split
    memory, where states come from the checkpoint pool."""
    if config.memory != "unified" or config.running_states == 0:
        return 0
    states = config.running_states + config.state_handover
    states += config.required_captures and config.preemption == "resume"
    return states * config.unified_slot_pages()


def stall_message(config: SimConfig, seqs: Sequence[Seq], pages: int, block: int) -> str:
    """The :class:`StalledRunError` message: the requests in the engine (running first)
    with what each needs alone, the budget, and what to change."""
    states = state_pages_per_request(config)
    shown = []
    for seq in seqs[:4]:
        kv = -(-(seq.prompt_len + seq.output_tokens - 1) // block)  # as on arrival
        shown.append(
            f"{seq.request_id} ({seq.prompt_len} prompt + {seq.output_tokens} output tokens: "
            f"{kv} KV pages{f' + {states} state pages' if states else ''}, admitted "
            f"{seq.admissions} times, furthest token {seq.furthest})"
        )
    more = f" and {len(seqs) - 4} more" if len(seqs) > 4 else ""
    budget = "[cache] cache_budget_bytes" if config.memory == "unified" else "[cache] kv_blocks"
    return (
        f"the engine made no progress in its last {STALL_PREEMPTIONS} preemptions: its "
        f"requests push each other (or one itself) out of a pool of {pages} pages before "
        f"any computes a token it had not computed before. In the engine: "
        f"{'; '.join(shown)}{more}. Raise {budget}, or lower [engine] max_num_seqs or "
        "[cache] running_states; vLLM's rules never stalled on tiny budgets: [cache] "
        "states_in_place = true and [engine] admit_after_preemption = false "
        "(docs/SIMULATION.md, 'Requests the budget cannot serve')"
    )
