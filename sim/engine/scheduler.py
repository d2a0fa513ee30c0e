"""The SimPy serving engine: continuous batching, chunked prefill, paged KV, checkpoints.

Processes and resources (SimPy):

- **arrivals**: pulls requests from the workload iterator in arrival order and queues
  each at its ``arrival_s`` (seconds); with ``closed_loop`` sessions
  (:mod:`sim.engine.sessions`) a follow-up turn is held until the previous turn of its
  session has left, then released a think time later by a process of its own;
- **engine**: one step after another while there is work. A step is planned at its start
  (:meth:`Engine._schedule`), runs on the **compute stream** (a ``simpy.Resource`` of
  capacity 1) for the cost model's duration, and is completed at its end
  (:meth:`Engine._complete`);
- **copy stream** (a ``simpy.Resource`` of capacity 1): one job per step for the restores
  the step issued (the step's compute waits for it) and one for the captures it wrote,
  which may complete after the step ends. A capture's reservation is published when its
  job completes, never earlier.

A step is planned vLLM-style with a token budget (``token_budget`` tokens):

1. **decode first**: every running request that has its prompt computed verifies
   ``1 + k`` tokens (``k`` speculative tokens, fewer near its last token);
2. **prefill chunks** of running requests, oldest first: ``min(remaining, budget)``
   tokens each;
3. **admissions** from the waiting queue (FIFO; preempted requests go first) while budget,
   batch slots and KV blocks last. Admission reconciles the hybrid hit
   (:mod:`sim.engine.hits`): the KV pool's contiguous cached prefix bounds a checkpoint
   lookup; a hit at ``p`` shares the full blocks of ``[0, p)``, pins the slot and
   restores it; the prefill starts at ``p``.

A chunk ``[s, e)`` captures the positions the placement policy returns for it (a target
``s < p <= e`` of a target-set policy; for ``vllm-align`` whatever its own validity rules
allow). Each position is reserved in the index while planning; the backend writes it in
the step that computes the chunk; a failed write is aborted.

When a request needs KV blocks and none are free, the **youngest** running request is
**preempted**: its blocks are freed (they stay cached), its reservations of this step are
aborted, and it goes back to the head of the queue; it restarts (looking its prompt up
again) when readmitted, or with ``preemption = "resume"`` it keeps its output and
prefills its prompt and that output (SEMANTICS H9g). Decode steps with speculative tokens
roll back the blocks of rejected tokens.

Consecutive decode-only steps (nothing waiting, no arrival before the step would start)
run inside one SimPy timeout, with exactly the same per-step logic: the results do not
change, only the number of SimPy events.

The engine is assembled from modules with one job each, each class building on the
parts it calls:

- :mod:`sim.engine.step_plan`: :class:`StepPlan`, what one step computes;
- :mod:`sim.engine.engine_core`: the engine's state, the arrivals process, departures,
  gauges and index bookkeeping (:class:`~sim.engine.engine_core.EngineCore`);
- :mod:`sim.engine.planning`: planning a step — decodes, chunks, admissions, preemption;
- :mod:`sim.engine.copy_stream`: restore and capture copy jobs;
- :mod:`sim.engine.completion`: a step's duration and completion, finishing requests;
- :mod:`sim.engine.fused_decode`: fused decode-only steps;
- this module: :class:`Engine`, the engine process that runs them.
"""

from __future__ import annotations

from sim.engine.fused_decode import FusedDecode
from sim.engine.sequence import Phase
from sim.engine.step_plan import ProcessGenerator, StepPlan

__all__ = ["Engine", "ProcessGenerator", "StepPlan"]


class Engine(FusedDecode):
    """One simulated serving engine over one workload.

    Args:
        config: the run's configuration.
        requests: the workload, in arrival order (consumed lazily).
        backend: data backend; wrapped by the configured fault injectors.
        progress: called with a number of requests that left the system (finished or
            rejected), in batches.
    """

    def run(self) -> None:
        """Run the simulation to the end: every request served or rejected, every copy done."""
        self.env.process(self._arrivals())
        self.env.process(self._engine())
        self.env.run()
        self._now = self.env.now
        self._flush_progress(force=True)
        self.metrics.sample(self._now, self.step, self.gauges())
        self.checker.finish(self.index.inner)

    # --- the engine process -----------------------------------------------------------

    def _engine(self) -> ProcessGenerator:
        env = self.env
        # Unified memory: a decode's page may evict a checkpoint, which must happen at
        # SimPy's time (a capture copy due earlier may still publish): no fused steps.
        # Nor when requests hold checkpoints until their next turn (SEMANTICS H9h).
        fuse = (
            self.config.fuse_decode_steps
            and not self._unified
            and not self._async_scheduling
            and not self._hold_until_turn
        )
        plan: StepPlan | None = None  # a step planned ahead by the fused loop
        while True:
            if plan is None:
                if not self.running and not self.waiting:
                    self._take_in_finished()  # nothing to plan: the output is taken in
                    self._new_token_ratio.reset(self._decode_steps)  # Scheduler.on_idle
                    if self._arrivals_done:
                        return
                    self._idle = env.event()
                    yield self._idle
                    self._idle = None
                    continue
                self._now = env.now
                plan = self._schedule()
            if plan.empty:
                if plan.after_let_go:  # memory came back after this step was planned
                    plan = None
                    continue
                job = self._last_capture_job
                if not self.running and self.waiting and job is not None and job.is_alive:
                    # Checkpoints being written hold the slots the head needs for its
                    # running states (SEMANTICS H9): it waits for the copy to publish them.
                    yield job
                    plan = None
                    continue
                if not self.running and self.waiting:
                    # Cannot happen with a consistent pool; never spin forever.
                    head = self.waiting.popleft()
                    head.phase = Phase.DONE
                    self.metrics.requests_rejected += 1
                    self._leave(head, env.now)
                plan = None
                continue
            self._issue_restores(plan)
            duration = self._duration(plan)
            with self.compute.request() as turn:
                yield turn
                if plan.restore_done is not None:
                    yield plan.restore_done
                if (
                    fuse
                    and plan.decode_only
                    and not self.waiting
                    and not (self._cache_generated and self._plan_finishes(plan))
                ):
                    end = self._fuse(plan, env.now + duration)
                    plan = None
                    yield from self._sleep_until(end)
                    if self.metrics.due(env.now):  # the last step's sample, left to now
                        self._now = env.now
                        self.metrics.sample(env.now, self.step, self.gauges())
                else:
                    yield env.timeout(duration)
                    self._complete(plan, env.now)
                    plan = None
