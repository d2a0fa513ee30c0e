"""Fused decode steps: consecutive decode-only steps inside one SimPy timeout.

While nothing waits and no request arrives before the next step would start, the engine
completes decode-only steps ahead of SimPy time (:meth:`FusedDecode._fuse`), with
aggregate arithmetic where it can (:meth:`FusedDecode._decode_window`) and exactly the
per-step logic otherwise: the results do not change (bit for bit), only the number of
SimPy events. ``SimConfig.fuse_decode_steps`` turns it off; unified memory never fuses.
"""

from __future__ import annotations

import heapq
import math

from sim.engine.backends.base import DecodeStep
from sim.engine.completion import Completion
from sim.engine.planning import Planning
from sim.engine.sequence import Phase, Seq
from sim.engine.step_plan import ProcessGenerator, StepPlan


class FusedDecode(Planning, Completion):
    """The engine's fused decode path (a part of :class:`~sim.engine.scheduler.Engine`)."""

    @staticmethod
    def _plan_finishes(plan: StepPlan) -> bool:
        """A decode of ``plan`` may finish its request."""
        return any(
            seq.generated + tokens >= seq.output_tokens for seq, tokens in plan.decodes.items()
        )

    def _sleep_until(self, at_s: float) -> ProcessGenerator:
        """Wait until SimPy's clock reads exactly ``at_s`` (seconds).

        The fused path's step ends must equal the per-step path's bit for bit, but SimPy
        fires a timeout at ``now + delay``, and no delay may make that sum round to
        ``at_s`` (``now`` can carry bits below ``at_s``'s last place). So: one timeout to
        the last float not past ``at_s``, then, if short, a second whose delay is exact
        (the clock is then within a few ulps of ``at_s``, where subtraction is exact).
        """
        env = self.env
        delay = at_s - env.now
        while env.now + delay > at_s:
            delay = math.nextafter(delay, -math.inf)
        yield env.timeout(delay)
        if env.now < at_s:
            yield env.timeout(at_s - env.now)
        assert env.now == at_s, (env.now, at_s)

    def _fuse(self, plan: StepPlan, end_s: float) -> float:
        """Complete the decode-only ``plan`` ending at ``end_s`` and the decode-only steps
        that can follow it, all ahead of SimPy time; return the last one's end, seconds.

        Each step is completed before SimPy reaches its end, so nothing that happens
        before that end may be able to change it. Hence every step but the last ends
        before the next arrival; the last one's series sample, if one is due, is left to
        the engine once SimPy reaches its end, so that it counts the requests that
        arrived during that step. And no step is planned here that would preempt: a
        readmission looks the index up, which capture copies due before the step starts
        may still change.
        """
        self._complete(plan, end_s, sample=end_s < self._next_arrival_s)
        while self._can_fuse(end_s):
            end_s = self._decode_window(end_s)
            if not self._can_fuse(end_s) or not self._decodes_fit() or self._next_step_finishes():
                break
            self._now = end_s
            following = self._schedule()
            assert following.decode_only and not following.empty
            end_s = end_s + self._duration(following)
            self._complete(following, end_s, sample=end_s < self._next_arrival_s)
        return end_s

    def _decodes_fit(self) -> bool:
        """The next step's decodes need no more KV blocks than are free: planning it
        preempts nothing."""
        block, tokens = self._block, self._decode_tokens
        need = 0
        for seq in self.running:
            need += max(0, -(-(seq.computed + tokens(seq)) // block) - len(seq.blocks))
        return self.pool.can_allocate(need)

    def _decode_window(self, start_s: float) -> float:
        """Run decode-only steps from ``start_s`` with aggregate arithmetic; return the end.

        Exactly the steps, block allocations, finishes, metrics and samples the per-step
        path would produce, at O(1) per step plus O(log n) per block boundary crossed and
        per request finished, instead of O(running requests) per step. Runs while nothing
        waits, no arrival comes before the next step would start, and every block the
        next step needs is free; returns at once (zero steps) with speculative decoding,
        or while a request's context is shorter than the sliding window. The caller runs
        the next step through the per-step path in that case.
        """
        running = self.running
        costs, metrics, pool = self.costs, self.metrics, self.pool
        window = costs.window
        if self.config.spec_tokens or (
            costs.swa_key_flops and any(seq.computed + 1 < window for seq in running)
        ):
            return start_s
        block = self._block
        count = len(running)
        contexts = sum(seq.computed for seq in running)
        base = {seq: (seq.computed, seq.generated) for seq in running}
        # (step, kind, order, seq): kind 0 = needs a block before that step, 1 = finishes
        # after it; order (the running list's) breaks ties as the per-step path does.
        events: list[tuple[int, int, int, Seq]] = []
        for order, seq in enumerate(running):
            events.append((len(seq.blocks) * block - seq.computed, 0, order, seq))
            events.append((seq.output_tokens - seq.generated - 1, 1, order, seq))
        heapq.heapify(events)
        per_seq_flops = costs.dense_flops + costs.full_key_flops + costs.swa_key_flops * window
        per_seq_bytes = costs.kv_bytes_per_token + 2 * costs.recurrent_bytes
        checker = self.checker
        kv_per_token = costs.kv_bytes_per_token
        # costs.step_s, inlined: this loop runs once per decode step of a million-request
        # run. The weights a step reads depend on its token count, which changes only when
        # a request finishes; so does the next arrival (a finish may release a turn).
        flops_rate, bytes_rate, overhead = (
            costs.flops_per_s,
            costs.bytes_per_s,
            costs.step_overhead_s,
        )
        weights = costs.weight_read_bytes(count)
        sync = costs.sync_s(count)  # 0 on one GPU
        next_arrival = self._next_arrival_s
        # Counters kept in locals and stored once at the end (nothing reads them in
        # between); busy_s continues the running float sum, so its rounding is unchanged.
        step_flops = steps = tokens = 0
        busy_s = metrics.compute_busy_s
        now, done = start_s, 0
        # With cache_generated a finishing step captures; it runs through the per-step path.
        stop = (
            min(seq.output_tokens - seq.generated - 1 for seq in running)
            if self._cache_generated
            else math.inf
        )
        while count and now < next_arrival and done < stop:
            crossing = []
            while events and events[0][0] == done and events[0][1] == 0:
                crossing.append(heapq.heappop(events))
            if crossing:
                if len(crossing) > pool.free_count():
                    for event in crossing:
                        heapq.heappush(events, event)
                    break
                for _, _, order, seq in crossing:
                    blocks = pool.allocate(1)
                    assert blocks is not None
                    seq.blocks.append(blocks[0])
                    heapq.heappush(events, (done + block, 0, order, seq))
            self.step += 1
            checker.step = self.step
            flops = count * per_seq_flops + costs.full_key_flops * contexts
            compute = flops / flops_rate
            memory = (count * per_seq_bytes + kv_per_token * contexts + weights) / bytes_rate
            duration = (compute if compute > memory else memory) + overhead + sync
            step_flops += flops
            busy_s += duration
            steps += 1
            tokens += count
            now = now + duration
            self._now = now
            crossed = now >= next_arrival  # a request arrives during this (last) step
            contexts += count
            done += 1
            finished = False
            while events and events[0][0] == done - 1 and events[0][1] == 1:
                _, _, _, seq = heapq.heappop(events)
                computed, generated = base.pop(seq)
                self.backend.decode(
                    DecodeStep(
                        seq.request_id, seq.batch_slot, computed, computed + done, seq.blocks
                    )
                )
                seq.computed, seq.generated = computed + done, generated + done
                self._advanced(seq)
                contexts -= seq.computed
                count -= 1
                self._finish(seq)
                finished = True
            if finished:
                events = [event for event in events if event[3].phase is not Phase.DONE]
                heapq.heapify(events)
                self.running = running = [seq for seq in running if seq.phase is not Phase.DONE]
                if count:
                    weights = costs.weight_read_bytes(count)
                    sync = costs.sync_s(count)
                next_arrival = self._next_arrival_s
            if crossing or finished:  # only then can the step-end peak have changed
                metrics.observe_peaks(pool.used_count(), self._checkpoint_bytes)
            if checker.step_has_reservations:  # decode steps reserve nothing
                checker.on_step_end()
            # A step a request arrived in is sampled by the engine once SimPy gets there.
            if now >= metrics.next_sample_s and not crossed:
                metrics.sample(now, self.step, self.gauges())
        metrics.decode_flops += step_flops
        metrics.compute_busy_s = busy_s
        metrics.steps += steps
        metrics.decode_tokens += tokens
        self._decode_steps += steps  # SEMANTICS H9j: decode steps that retracted no one
        for seq, (computed, generated) in base.items():
            if done:
                self.backend.decode(
                    DecodeStep(
                        seq.request_id, seq.batch_slot, computed, computed + done, seq.blocks
                    )
                )
            seq.computed, seq.generated = computed + done, generated + done
            self._advanced(seq)
        return now

    def _can_fuse(self, at_s: float) -> bool:
        return (
            bool(self.running)
            and not self.waiting
            and at_s < self._next_arrival_s
            and all(seq.phase is Phase.DECODE for seq in self.running)
        )

    def _next_step_finishes(self) -> bool:
        """With ``cache_generated``: the next decode step may finish a running request.
        Such a step captures, so it is never fused ahead of SimPy time."""
        if not self._cache_generated:
            return False
        return any(
            seq.generated + self._decode_tokens(seq) >= seq.output_tokens for seq in self.running
        )
