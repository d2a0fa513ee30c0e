"""The copy stream: a step's restores and captures as copy jobs.

One job per step for the restores it issued (the step's compute waits for it; the pins
are released when it completes) and one for the captures it wrote (published when it
completes, never earlier, so it may complete after the step ends). Each job holds the
copy stream, a ``simpy.Resource`` of capacity 1, for its modeled duration. With
``states_in_place`` (vLLM's align mode) there are no copies: a step reads a hit's state and
writes its checkpoints in their own memory, so restores take no time and captures publish
when the step completes.
:class:`~sim.engine.replay.Replayer` overrides the ``_start_*_job`` methods to complete
every copy at once.
"""

from __future__ import annotations

import simpy

from reference.api import Reservation
from sim.engine.engine_core import EngineCore
from sim.engine.step_plan import ProcessGenerator, Retouch, StepPlan


class CopyStream(EngineCore):
    """The engine's copy jobs (a part of :class:`~sim.engine.scheduler.Engine`)."""

    # --- restores ---------------------------------------------------------------------

    def _issue_restores(self, plan: StepPlan) -> None:
        """Restore every hit admitted this step; the step's compute waits for the job."""
        if not plan.restores:
            return
        slots, total = [], 0
        for seq in plan.restores:
            self.checker.request_id = seq.request_id
            self.checker.on_restore_issued(seq.hit_slot)
            self.backend.restore(
                seq.request_id, seq.batch_slot, seq.hit_slot, seq.hit_tokens, seq.blocks
            )
            total += self.costs.checkpoint_bytes(seq.hit_tokens)
            slots.append(seq.hit_slot)
            # A hit counts when its copy is issued (a preemption can drop a planned
            # restore): hit tokens and FLOPs saved together, as a prefix hit if nothing of
            # the request ran before, else as a resumption recovering from memory pressure.
            saved = self.costs.prefill_flops(seq.hit_tokens)
            metrics = self.metrics
            if not seq.ran:
                metrics.hit_tokens += seq.hit_tokens
                metrics.requests_with_hit += 1
                metrics.flops_saved += saved
                if seq.after_warmup:
                    metrics.warm_hit_tokens += seq.hit_tokens
                    metrics.warm_requests_with_hit += 1
            else:
                metrics.resume_hit_tokens += seq.hit_tokens
                metrics.resume_flops_saved += saved
            seq.ran = True
        self.metrics.restores += len(slots)
        self.metrics.restore_bytes += total
        duration = self.costs.copy_s(total, len(slots)) + self.config.faults.copy_delay_s
        self._start_restore_job(slots, duration, plan)

    def _start_restore_job(self, slots: list[int], duration: float, plan: StepPlan) -> None:
        """Run the step's restore copies on the copy stream; the step's compute waits.
        With ``states_in_place`` there is no copy: the step reads each state where it is,
        and the request holds it (pinned) until its turn in the next step's planning."""
        if self._states_in_place:
            # SEMANTICS H9h: each request holds its hit's block until its next turn.
            for seq in plan.restores:
                self.checker.on_restore_complete(seq.hit_slot)
                self._hold(seq, seq.hit_slot)
            return
        plan.restore_done = self.env.event()
        self.env.process(self._restore_job(slots, duration, plan.restore_done))

    def _restore_job(
        self, slots: list[int], duration: float, done: simpy.Event
    ) -> ProcessGenerator:
        with self.copy.request() as turn:
            yield turn
            yield self.env.timeout(duration)
        self.metrics.copy_busy_s += duration
        self._restores_complete(slots)
        done.succeed()

    def _restores_complete(self, slots: list[int]) -> None:
        """The restore copies of ``slots`` completed: release their pins."""
        for slot in slots:
            self.checker.on_restore_complete(slot)
        for slot in slots:
            self._unpin(slot)

    # --- captures ---------------------------------------------------------------------

    def _issue_captures(self) -> None:
        """Issue the copy job of the captures written this step (published on completion)."""
        writes, retouch = self._step_writes, self._step_retouch
        self._step_retouch = []
        if not writes:
            self._retouch(retouch)
            return
        self._step_writes = []
        faults = self.config.faults
        if faults.publish_on_issue:
            for reservation in writes:
                self._publish(reservation)
        capture_bytes = sum(self.costs.checkpoint_bytes(r.tokens) for r in writes)
        self.metrics.capture_bytes += capture_bytes
        duration = self.costs.copy_s(capture_bytes, len(writes)) + faults.copy_delay_s
        self._start_capture_job(writes, duration, retouch)

    def _start_capture_job(
        self, writes: list[Reservation], duration: float, retouch: Retouch
    ) -> None:
        """Run the step's capture copies on the copy stream; they publish on completion.
        With ``states_in_place`` the step wrote them where they are, and with
        ``captures_in_step`` it copied them in its own stream: published now, at the
        step's end."""
        if self._states_in_place:
            self._captures_complete(writes, retouch)
            return
        if self.config.captures_in_step:  # SEMANTICS H9n: copied in the step's stream
            self.metrics.copy_busy_s += duration
            self._captures_complete(writes, retouch)
            return
        # The stream runs its jobs in order: the latest one finishes last.
        self._last_capture_job = self.env.process(self._capture_job(writes, duration, retouch))

    def _capture_job(
        self, writes: list[Reservation], duration: float, retouch: Retouch
    ) -> ProcessGenerator:
        with self.copy.request() as turn:
            yield turn
            yield self.env.timeout(duration)
        self.metrics.copy_busy_s += duration
        self._now = self.env.now
        self._captures_complete(writes, retouch)

    def _captures_complete(self, writes: list[Reservation], retouch: Retouch) -> None:
        """The capture copies of ``writes`` completed: publish them (then, with
        ``release_recency``, use the checkpoints the step's chunks started from)."""
        publish = not self.config.faults.publish_on_issue
        for reservation in writes:
            self.checker.on_write_complete(reservation)
            if publish:
                self._publish(reservation)
        self._retouch(retouch)

    def _retouch(self, retouch: Retouch) -> None:
        """``release_recency`` (SEMANTICS H9b): each chunk's start checkpoint is used now,
        as when its holder lets go of it: a lookup of exactly that position refreshes it
        in the index, and with unified memory in the shared pool's clock. With
        ``interleaved_free`` (H9d) it and the chunk's captures form a release group."""
        for release in retouch:
            let_go = [r.slot for r in release.captures]
            if release.start is not None:
                hashed, position = release.start
                hit = self.index.lookup(self._namespace, hashed, position - 1, position)
                if hit is not None and self._unified:
                    self._ledger.touch(hit.slot, self._shared_pool.tick())
                    let_go.append(hit.slot)
            if self._interleaved_free and len(let_go) > 1:
                self._ledger.release_together(let_go)
