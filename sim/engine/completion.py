"""A step's forward pass: its modeled duration, and what its end does.

At the end of a step (:meth:`Completion._complete`) the backend computes each planned
chunk and writes its captures (a failed write is aborted), the computed prompt blocks are
registered for prefix sharing, decodes accept their speculative tokens and roll back the
blocks of rejected ones, requests that produced their last token finish (caching their
answer with ``cache_generated``), and the step's capture copy is issued.
"""

from __future__ import annotations

from reference.api import Reservation
from sim.engine.answer_state import answer_state_position
from sim.engine.backends.base import Capture, DecodeStep
from sim.engine.copy_stream import CopyStream
from sim.engine.sequence import Phase, Seq
from sim.engine.step_plan import ChunkRelease, StepPlan


class Completion(CopyStream):
    """The engine's step execution (a part of :class:`~sim.engine.scheduler.Engine`)."""

    def _duration(self, plan: StepPlan) -> float:
        """Modeled duration of the step's forward pass, seconds."""
        costs, metrics = self.costs, self.metrics
        flops = moved = step_tokens = 0
        for chunk in plan.prefills.values():
            work = costs.chunk_flops(chunk.start, chunk.end)
            metrics.prefill_flops += work
            flops += work
            moved += costs.chunk_bytes(chunk.end)
            step_tokens += chunk.end - chunk.start
        decode = 0
        for seq, tokens in plan.decodes.items():
            decode += costs.decode_flops(seq.computed, tokens)
            moved += costs.decode_bytes(seq.computed, tokens)
            step_tokens += tokens
        metrics.decode_flops += decode
        duration = costs.step_s(flops + decode, moved, tokens=step_tokens)
        metrics.compute_busy_s += duration
        return duration

    # --- completion -------------------------------------------------------------------

    def _complete(self, plan: StepPlan, now_s: float, *, sample: bool = True) -> None:
        """The step's forward pass ended at ``now_s``: write, register, advance, finish.

        ``sample=False`` leaves a due series sample to the engine (see :meth:`_fuse`).
        """
        self._now = now_s
        checker, metrics, backend = self.checker, self.metrics, self.backend
        checker.step = plan.step
        metrics.steps += 1
        if plan.handovers or plan.lent_held:  # states moved: let go of their old pages
            self._end_handovers(plan)
        faults = self.config.faults
        writes = self._step_writes = []
        for seq, chunk in plan.prefills.items():
            rid = seq.request_id
            checker.request_id = rid
            seq.ran = True
            reservations = chunk.reservations
            first = len(writes)
            if reservations:
                captures = [Capture(r.tokens, r.slot) for r in reservations]
                written = backend.prefill(
                    rid, seq.batch_slot, chunk.start, chunk.end, seq.blocks, captures
                )
                for reservation, ok in zip(reservations, written, strict=True):
                    if not ok:
                        metrics.captures_failed += 1
                    if ok or faults.publish_failed_captures:
                        writes.append(reservation)
                    else:
                        self._abort(reservation)
            else:
                backend.prefill(rid, seq.batch_slot, chunk.start, chunk.end, seq.blocks, ())
            if self._release_recency:
                # vLLM frees the states a request moved past a step later, highest
                # position first, and the checkpoint the chunk started from with them.
                writes[first:] = writes[first:][::-1]
                start = None
                if chunk.from_checkpoint:
                    assert seq.hashed is not None
                    start = (seq.hashed, chunk.start)
                let_go: list[Reservation] = []
                if self._interleaved_free:
                    held = chunk.end if self._handover else -1
                    let_go = [r for r in writes[first:] if r.tokens != held]
                if start is not None or len(let_go) > 1:
                    self._step_retouch.append(ChunkRelease(start, let_go))
            metrics.recomputed_tokens += chunk.end - chunk.start
            seq.computed = chunk.end
            self._advanced(seq)
            self._register(seq)
            if seq.computed == seq.prefill_len:
                for mismatch in backend.prefill_done(rid, seq.batch_slot, seq.blocks):
                    checker.on_mismatch(seq.hit_slot, mismatch)
                seq.phase = Phase.DECODE
                seq.generated = seq.resumed + 1  # SEMANTICS H9g: a resumed one goes on
                metrics.decode_tokens += 1
                if seq.first_token_s < 0:
                    seq.first_token_s = now_s
                    metrics.ttft_s.append(now_s - seq.arrival_s)
                if seq.generated >= seq.output_tokens:
                    self._finish(seq)
        if plan.decodes:
            self._advance_decodes(plan)
        if any(seq.phase is Phase.PREFILL for seq in plan.prefills):
            # SGLang's next pass takes the chunked request out of the last batch before
            # merging it, which counts as the batch shrinking (SEMANTICS H9o).
            self._batch_changed = True
        self._issue_captures()
        checker.on_step_end()
        if any(seq.phase is Phase.DONE for seq in self.running):
            self.running = [seq for seq in self.running if seq.phase is not Phase.DONE]
        used = self.pool.used_count()
        metrics.observe_peaks(used, self._checkpoint_bytes)
        if sample and metrics.due(now_s):
            metrics.sample(now_s, plan.step, self.gauges())

    def _advance_decodes(self, plan: StepPlan) -> None:
        """Accept speculative tokens (seeded draws) and roll back the rejected ones."""
        rng, acceptance = self._spec_rng, self.config.spec_acceptance
        block, pool, metrics = self._block, self.pool, self.metrics
        for seq, tokens in plan.decodes.items():
            proposed = tokens - 1
            accepted = 0
            while accepted < proposed and rng.random() < acceptance:
                accepted += 1
            metrics.spec_proposed += proposed
            metrics.spec_accepted += accepted
            fed = seq.computed + 1 + accepted
            self.backend.decode(
                DecodeStep(seq.request_id, seq.batch_slot, seq.computed, fed, seq.blocks, proposed)
            )
            seq.computed = fed
            if fed > seq.furthest:  # self._advanced(seq), inlined: once per decode
                seq.furthest = fed
                self._preemptions_at_progress = metrics.preemptions
            seq.generated += 1 + accepted
            metrics.decode_tokens += 1 + accepted
            keep = -(-seq.computed // block)
            if len(seq.blocks) > keep:
                pool.release(seq.blocks[keep:])
                del seq.blocks[keep:]
            if seq.generated >= seq.output_tokens:
                self._finish(seq)

    def _register(self, seq: Seq) -> None:
        """Register the prompt blocks ``seq`` has fully computed, for prefix sharing (and
        with ``cache_generated`` the blocks of output a resumed request recomputed, by its
        answer's digests: SEMANTICS H9g)."""
        prompt = seq.prompt_len
        cached = min(seq.computed, seq.prefill_len if self._cache_generated else prompt)
        if self.config.kv_up_to_checkpoint:  # SEMANTICS H8a: KV goes in with a state
            cached = min(cached, seq.tracked)
        full = cached // self._block
        if full > seq.registered:
            start = seq.registered
            parent = seq.digests[start - 1] if start else None
            if self._adopt_cached:  # SEMANTICS H10a
                self.pool.adopt_cached(seq.blocks, start, full, seq.digests)
            self.pool.register_many(
                seq.blocks[start:full], seq.digests[start:full], parent, start, seq.hashed
            )
            past_prompt = max(start, prompt // self._block)
            self.metrics.generated_blocks_registered += max(0, full - past_prompt)
            seq.registered = full

    def _finish(self, seq: Seq) -> None:
        seq.phase = Phase.DONE
        self._batch_changed = True  # SEMANTICS H9o: the running batch shrinks
        if self.alpha_tuner is not None:
            self.alpha_tuner.on_finish(seq.index, seq.request)
        if self._async_scheduling:
            # SEMANTICS H9f: the engine takes the step's output in after planning the next
            # step; until then the request holds what it held.
            self._finishing.append(seq)
        else:
            self._let_go(seq)
        self.metrics.requests_finished += 1
        self._leave(seq, self._now)

    def _take_in_finished(self) -> bool:
        """``async_scheduling`` (SEMANTICS H9f): the requests that finished in the last
        step let go of what they hold now, the next step being planned; whether any did.
        The states their answers leave (``cache_generated``) are captured now, issued
        with a copy job of their own (a step's job starts from an empty list)."""
        finishing = self._finishing
        if not finishing:
            return False
        self._finishing = []
        for seq in finishing:
            self._let_go(seq)
        if self._step_writes:
            self._issue_captures()
        return True

    def _let_go(self, seq: Seq) -> None:
        """Finished ``seq`` gives back its states, caches its answer (``cache_generated``)
        and frees its KV blocks and batch slot."""
        if self._states_per_running:
            # Before the answer's state is captured: the engine hands the request's own
            # state over to the cache rather than copying it (SEMANTICS H9).
            self._give_back_running_states(seq)
        self._let_go_of_holds(seq)
        if self._cache_generated:
            self._cache_answer(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        self.backend.release(seq.request_id, seq.batch_slot)
        self._free_batch.append(seq.batch_slot)
        seq.batch_slot = -1
        seq.hashed = None
        seq.digests = ()

    def _cache_answer(self, seq: Seq) -> None:
        """Cache what finished ``seq`` computed of its answer (``cache_generated``).

        The request holds KV and recurrent state for ``p = prompt + generated - 1``
        tokens of its ``answer`` (the last generated token was sampled, never fed). Its
        full blocks of ``[0, p)`` are registered by the answer's block digests, and the
        state at ``p`` is captured into a reserved slot (partial page ``p mod B`` rows
        included), written now and published when the step's capture copy completes,
        like any capture. A request without an ``answer`` caches nothing. With
        ``generated_state_grid`` the state is the last one on that grid instead
        (:func:`answer_state_position`).
        """
        answer = getattr(seq.request, "answer", None)
        p = seq.computed
        if answer is None or p > len(answer) or p < 1:
            return
        metrics, config = self.metrics, self.config
        hashed = answer.hashed(self._namespace, config.unit)
        position = None
        if p > seq.prompt_len and config.generated_state:
            position = answer_state_position(seq.prompt_len, p, config.generated_state_grid)
        cached = p
        if config.kv_up_to_checkpoint:  # SEMANTICS H8a: KV goes in with a state
            cached = seq.tracked if position is None else position
        self._register_answer_blocks(seq, hashed, cached)
        if position is None:
            return  # nothing generated was fed, only KV is kept of an answer, or no
            # decode-tracked state (generated_state_grid): the prefill's last one stands
        self.checker.request_id = seq.request_id
        metrics.captures_planned += 1
        outcome = self._reserve(hashed, position)
        if outcome is None:
            return
        metrics.captures_generated += 1
        ok = self.backend.capture_generated(
            seq.request_id, seq.batch_slot, Capture(position, outcome.slot), seq.blocks
        )
        if not ok:
            metrics.captures_failed += 1
        if ok or self.config.faults.publish_failed_captures:
            self._step_writes.append(outcome)
        else:
            self._abort(outcome)
