"""Cache-only replay: the engine's caching code, one request at a time, without time.

A planner comparing placement and eviction policies wants the cache's answer alone:
which prefix each request finds, given what earlier requests left behind. The timed
engine (:mod:`sim.engine.scheduler`) adds live-KV pressure, preemption and TTFT, which
move hit rates too. :class:`Replayer` is that engine with its clock taken out: it *is*
an :class:`~sim.engine.scheduler.Engine` (same index and eviction policy, placement,
KV pool, hybrid-hit reconciliation, longest-first reservation, generated-token caching,
lockstep checker, metrics), driven synchronously:

1. requests are taken in the workload's order (arrival order); the clock reads each
   request's ``arrival_s`` (for the series), and nothing else is timed;
2. a request is admitted alone: its lookup, restore and prefill chunks (``token_budget``
   tokens each, so placement sees the chunks a lone request gets in the engine) run step
   after step, and every copy — restore or capture — completes at once: a capture is
   published at the end of the step that wrote it;
3. its decode is not stepped: the request jumps to its last token
   (``prompt + output - 1`` computed), takes the KV blocks that needs, and finishes
   (caching its answer with ``cache_generated``).

So nothing waits, nothing is preempted (one request always fits: the engine's rejection
rule still applies), and a lookup sees every checkpoint of every earlier request. What
differs from the timed engine, and why, is in docs/SIMULATION.md ("Cache-only replay").
"""

from __future__ import annotations

from reference.api import Reservation
from sim.engine.backends.base import DecodeStep
from sim.engine.scheduler import Engine, StepPlan
from sim.engine.sequence import Phase, Seq
from sim.engine.step_plan import Retouch

#: ``totals`` keys that only a timed run has; a replay's result leaves them out.
TIMING_TOTALS = ("sim_time_s", "ttft", "queue", "compute_busy_s", "copy_busy_s")
#: ``series`` columns that only a timed run has.
TIMING_SERIES = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")


class Replayer(Engine):
    """The engine's caching, request by request, with every copy instantaneous.

    Built like :class:`~sim.engine.scheduler.Engine`; :meth:`run` replays the workload.
    """

    def run(self) -> None:
        """Replay every request in order; then the end-of-run checks."""
        self._gate = None  # no sessions to time: the workload's order is the order
        now = 0.0
        for index, request in enumerate(self._requests):
            now = max(now, request.arrival_s)
            self._now = now
            self._arrive(index, request, now)
            if self.waiting:
                self._serve(self.waiting[0])
        self._source_done = True
        self._flush_progress(force=True)
        self.metrics.sample(self._now, self.step, self.gauges())
        self.checker.finish(self.index.inner)

    def _serve(self, seq: Seq) -> None:
        """Admit ``seq``, prefill it chunk by chunk, jump to its last token, finish it."""
        while seq.phase is not Phase.DECODE:
            plan = self._schedule()
            if plan.empty:  # cannot happen with a consistent pool; never loop forever
                self.waiting.remove(seq)
                seq.phase = Phase.DONE
                self.metrics.requests_rejected += 1
                self._leave(seq, self._now)
                return
            self._issue_restores(plan)
            self._duration(plan)  # counts the prefill FLOPs (its seconds are not used)
            self._complete(plan, self._now)
            if seq.phase is Phase.DONE:  # a one-token answer finishes with its prefill
                return  # (and _complete has taken it out of the running list)
        last = seq.prompt_len + seq.output_tokens - 1
        decode = StepPlan(self.step)
        grown = self._grow(seq, last, decode)
        assert grown, "a lone request always fits (the rejection rule)"
        if decode.handovers or decode.lent_held:  # its state moved: let go of the old pages
            self._end_handovers(decode)
        self.metrics.decode_tokens += seq.output_tokens - seq.generated
        if last > seq.computed:
            self.backend.decode(
                DecodeStep(seq.request_id, seq.batch_slot, seq.computed, last, seq.blocks)
            )
        seq.computed, seq.generated = last, seq.output_tokens
        self.checker.request_id = seq.request_id
        self._finish(seq)
        self._issue_captures()
        self.checker.on_step_end()
        self.running.remove(seq)

    def _start_restore_job(self, slots: list[int], duration: float, plan: StepPlan) -> None:
        self._restores_complete(slots)

    def _start_capture_job(
        self, writes: list[Reservation], duration: float, retouch: Retouch
    ) -> None:
        self._captures_complete(writes, retouch)


def strip_timing(totals: dict[str, object], series: dict[str, list[float | int | None]]) -> None:
    """Remove the fields a replay has no value for (in place)."""
    for key in TIMING_TOTALS:
        totals.pop(key, None)
    for key in TIMING_SERIES:
        series.pop(key, None)
