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
again) when readmitted. Decode steps with speculative tokens roll back the blocks of
rejected tokens.

Consecutive decode-only steps (nothing waiting, no arrival before the step would start)
run inside one SimPy timeout, with exactly the same per-step logic: the results do not
change, only the number of SimPy events.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import simpy

from reference.api import AlreadyCached, EntryCost, PrefillChunk, Reservation
from reference.errors import HyckptError, InvalidConfigError
from reference.hashing import HashedPrompt
from sim.engine.alpha_tuning import AlphaTuner
from sim.engine.backends.base import Backend, Capture, DecodeStep, EngineLayout
from sim.engine.backends.faulty import DecliningBackend, FailingCaptures
from sim.engine.config import SimConfig
from sim.engine.hits import block_digests, reconcile
from sim.engine.kv_pool import KVPool
from sim.engine.lockstep import LockstepChecker, ObservedIndex
from sim.engine.metrics import Gauges, Metrics
from sim.engine.sequence import Phase, RequestLike, Seq
from sim.engine.sessions import SessionGate
from sim.engine.unified import SharedKVPool

ProcessGenerator = Generator[simpy.Event, Any, None]


def _tokens(reservation: Reservation) -> int:
    return reservation.tokens


@dataclass(eq=False, slots=True)
class _Chunk:
    """A prefill chunk ``[start, end)`` planned for a step, with its reservations."""

    start: int
    end: int
    reservations: list[Reservation]


@dataclass(eq=False)
class StepPlan:
    """What one step computes.

    Attributes:
        step: the step number (1-based).
        decodes: request → tokens it verifies this step (1 + speculative).
        prefills: request → its chunk.
        restores: requests admitted this step with a hit (restore issued after planning).
        restore_done: triggered when the step's restore job completed.
    """

    step: int
    decodes: dict[Seq, int] = field(default_factory=dict)
    prefills: dict[Seq, _Chunk] = field(default_factory=dict)
    restores: list[Seq] = field(default_factory=list)
    restore_done: simpy.Event | None = None

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def decode_only(self) -> bool:
        return not self.prefills and not self.restores


class Engine:
    """One simulated serving engine over one workload.

    Args:
        config: the run's configuration.
        requests: the workload, in arrival order (consumed lazily).
        backend: data backend; wrapped by the configured fault injectors.
        progress: called with a number of requests that left the system (finished or
            rejected), in batches.
    """

    def __init__(
        self,
        config: SimConfig,
        requests: Iterable[RequestLike],
        backend: Backend,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.costs = config.costs()
        self.env = simpy.Environment()
        self.compute = simpy.Resource(self.env, capacity=1)
        self.copy = simpy.Resource(self.env, capacity=1)
        self.metrics = Metrics(sample_interval_s=config.sample_interval_s)
        self._now = 0.0
        self.checker = LockstepChecker(clock=self._clock)
        implementation = backend.implementation
        self.capacity = config.checkpoint_capacity()
        inner = implementation.make_index(
            self.capacity,
            eviction=config.eviction,
            hash_unit=config.unit,
            **config.eviction_params,
        )
        self.index = ObservedIndex(inner, self.checker)
        self.alpha_tuner = AlphaTuner.for_run(config, inner)
        self.placement = implementation.make_placement(
            config.placement, **config.placement_arguments()
        )
        self._unified = config.memory == "unified"
        if self._unified:
            if not callable(getattr(inner, "evict_one", None)):
                raise InvalidConfigError(
                    f"memory='unified' needs an index with evict_one(reason) (the reference "
                    f"index has it), to give a checkpoint's pages back before the index is "
                    f"full; {implementation.name!r}'s index has none"
                )
            self._slot_pages = config.unified_slot_pages()
            self._held_slots: set[int] = set()  # slots whose pages are withheld
            self._shared_pool = SharedKVPool(
                config.kv_capacity(),
                config.block_size,
                self._slot_pages,
                self._evict_checkpoint_for_memory,
            )
            self._ledger = self._shared_pool.ledger
            self.pool: KVPool = self._shared_pool
        else:
            self.pool = KVPool(config.kv_capacity(), config.block_size)
        faults = config.faults
        if faults.capture_failure_rate > 0:
            backend = FailingCaptures(
                backend,
                faults.capture_failure_rate,
                random.Random(f"hyckpt-sim:{config.seed}:capture-failures"),
            )
        if faults.broken_backend:
            backend = DecliningBackend(backend)
        self.backend = backend
        backend.bind(
            EngineLayout(
                batch_slots=config.max_num_seqs,
                kv_blocks=self.pool.num_blocks,
                block_size=config.block_size,
                first_slot=self.index.first_slot,
                checkpoint_slots=self.capacity,
                draft_head=self.costs.with_draft,
            ),
            self.checker,
        )
        self._spec_rng = random.Random(f"hyckpt-sim:{config.seed}:speculation")
        self._fault_rng = random.Random(f"hyckpt-sim:{config.seed}:preemption")
        self._requests = iter(requests)
        self._progress = progress
        self._progress_pending = 0
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._free_batch = list(range(config.max_num_seqs - 1, -1, -1))
        self._slot_bytes: dict[int, int] = {}
        self._checkpoint_bytes = 0
        self._source_next_s = math.inf  # the workload's next arrival time
        self._source_done = False
        self._gate = SessionGate() if config.closed_loop else None
        self._releases: list[float] = []  # times of scheduled releases (a heap)
        self._idle: simpy.Event | None = None
        self.step = 0
        self._block = config.block_size
        self._units_per_block = config.block_size // config.unit
        self._namespace = config.key_namespace
        self._paged = self.costs.has_full_attention
        self._max_tokens = self.pool.num_blocks * config.block_size
        self._cache_generated = config.cache_generated
        self._step_writes: list[Reservation] = []  # captures written in the current step

    # --- running -----------------------------------------------------------------------

    def _clock(self) -> float:
        return self._now

    @property
    def _next_arrival_s(self) -> float:
        """The next time a request arrives: from the workload or a released turn."""
        releases = self._releases
        if releases and releases[0] < self._source_next_s:
            return releases[0]
        return self._source_next_s

    @property
    def _arrivals_done(self) -> bool:
        """No request will arrive any more."""
        return (
            self._source_done
            and not self._releases
            and (self._gate is None or self._gate.held == 0)
        )

    def run(self) -> None:
        """Run the simulation to the end: every request served or rejected, every copy done."""
        self.env.process(self._arrivals())
        self.env.process(self._engine())
        self.env.run()
        self._now = self.env.now
        self._flush_progress(force=True)
        self.metrics.sample(self._now, self.step, self.gauges())
        self.checker.finish(self.index.inner)

    def gauges(self) -> Gauges:
        """Current pool and queue state."""
        return Gauges(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_blocks_in_use=self.pool.used_count(),
            kv_blocks_cached=self.pool.cached_count(),
            checkpoint_slots_in_use=self.capacity - self.index.free_count(),
            checkpoint_bytes_in_use=self._checkpoint_bytes,
            evictions_checkpoint=sum(self.index.evictions.values()),
            evictions_kv=sum(self.pool.evictions.values()),
        )

    def evictions(self) -> Counter[str]:
        """Evictions by reason: ``checkpoint:<reason>`` and ``kv:<reason>``."""
        counter: Counter[str] = Counter()
        for reason, count in self.index.evictions.items():
            counter[f"checkpoint:{reason}"] += count
        for reason, count in self.pool.evictions.items():
            counter[f"kv:{reason}"] += count
        return counter

    # --- processes -----------------------------------------------------------------------

    def _arrivals(self) -> ProcessGenerator:
        env, gate = self.env, self._gate
        for index, request in enumerate(self._requests):
            arrival = request.arrival_s
            self._source_next_s = arrival
            if arrival > env.now:
                yield env.timeout(arrival - env.now)
            if gate is None:
                self._arrive(index, request, arrival)
                continue
            at_s = gate.on_source(index, request)
            if at_s is None:
                continue  # held until the session's previous turn leaves
            if at_s > env.now:
                self._release_at(index, request, at_s)
            else:
                self._arrive(index, request, at_s)
        self._source_next_s = math.inf
        self._source_done = True
        self._wake()

    def _release_at(self, index: int, request: RequestLike, at_s: float) -> None:
        """Let ``request`` arrive at ``at_s`` (a closed-loop turn): a timeout whose callback
        queues it (cheaper than a process per turn)."""
        heapq.heappush(self._releases, at_s)
        timeout = self.env.timeout(max(0.0, at_s - self.env.now))
        timeout.callbacks.append(lambda _: self._release(index, request, at_s))

    def _release(self, index: int, request: RequestLike, at_s: float) -> None:
        heapq.heappop(self._releases)
        self._arrive(index, request, at_s)

    def _leave(self, seq: Seq, at_s: float) -> None:
        """``seq`` left the engine (finished or rejected) at ``at_s``."""
        self._count_done()
        if self._gate is not None:
            release = self._gate.on_leave(seq.request, at_s)
            if release is not None:
                self._release_at(release.index, release.request, release.at_s)

    def _wake(self) -> None:
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _arrive(self, index: int, request: RequestLike, arrival_s: float) -> None:
        seq = Seq(request, index, len(request.prompt), max(1, request.output_tokens))
        seq.arrival_s = arrival_s
        metrics = self.metrics
        metrics.requests_arrived += 1
        if metrics.first_arrival_s is None:
            metrics.first_arrival_s = arrival_s
        metrics.last_arrival_s = arrival_s
        need = seq.prompt_len + seq.output_tokens + self.config.spec_tokens + self._block
        if seq.prompt_len < 1 or need > self._max_tokens:
            seq.phase = Phase.DONE
            self.metrics.requests_rejected += 1
            self._leave(seq, arrival_s)
            self._wake()
            return
        self.waiting.append(seq)
        metrics.waiting_at_last_arrival = queued = len(self.waiting)
        if queued > metrics.peak_waiting:
            metrics.peak_waiting = queued
        self._wake()

    def _engine(self) -> ProcessGenerator:
        env = self.env
        # Unified memory: a decode's page may evict a checkpoint, which must happen at
        # SimPy's time (a capture copy due earlier may still publish): no fused steps.
        fuse = self.config.fuse_decode_steps and not self._unified
        plan: StepPlan | None = None  # a step planned ahead by the fused loop
        while True:
            if plan is None:
                if not self.running and not self.waiting:
                    if self._arrivals_done:
                        return
                    self._idle = env.event()
                    yield self._idle
                    self._idle = None
                    continue
                self._now = env.now
                plan = self._schedule()
            if plan.empty:
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

    def _decode_tokens(self, seq: Seq) -> int:
        """Tokens ``seq`` verifies in a decode step: 1 + speculative, fewer near its end."""
        return 1 + max(0, min(self.config.spec_tokens, seq.output_tokens - seq.generated - 1))

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
        for seq, (computed, generated) in base.items():
            if done:
                self.backend.decode(
                    DecodeStep(
                        seq.request_id, seq.batch_slot, computed, computed + done, seq.blocks
                    )
                )
            seq.computed, seq.generated = computed + done, generated + done
        return now

    def _can_fuse(self, at_s: float) -> bool:
        return (
            bool(self.running)
            and not self.waiting
            and at_s < self._next_arrival_s
            and all(seq.phase is Phase.DECODE for seq in self.running)
        )

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

    def _capture_job(self, writes: list[Reservation], duration: float) -> ProcessGenerator:
        with self.copy.request() as turn:
            yield turn
            yield self.env.timeout(duration)
        self.metrics.copy_busy_s += duration
        self._now = self.env.now
        self._captures_complete(writes)

    def _captures_complete(self, writes: list[Reservation]) -> None:
        """The capture copies of ``writes`` completed: publish them."""
        publish = not self.config.faults.publish_on_issue
        for reservation in writes:
            self.checker.on_write_complete(reservation)
            if publish:
                self._publish(reservation)

    # --- planning ------------------------------------------------------------------------

    def _schedule(self) -> StepPlan:
        """Plan the next step at the current time (decode, then prefill, then admit)."""
        self.step += 1
        self.checker.step = self.step
        plan = StepPlan(self.step)
        config = self.config
        budget = config.token_budget
        for seq in list(self.running):
            if seq.phase is not Phase.DECODE:
                continue
            tokens = self._decode_tokens(seq)
            if self._grow(seq, seq.computed + tokens, plan):
                plan.decodes[seq] = tokens
                budget -= tokens
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.phase is not Phase.PREFILL:
                continue
            end = min(seq.prompt_len, seq.computed + budget)
            if self._grow(seq, end, plan):
                self._plan_chunk(seq, seq.computed, end, plan)
                budget -= end - seq.computed
        while self.waiting and budget > 0 and len(self.running) < config.max_num_seqs:
            taken = self._admit(self.waiting[0], budget, plan)
            if not taken:
                break
            budget -= taken
        rate = config.faults.preempt_mid_prefill_rate
        # Only a step with other work can lose a request this way: a step left empty
        # would make no progress (at rate 1 a lone request would be preempted forever).
        others = len(plan.prefills) + len(plan.decodes) - 1
        if rate and plan.prefills and others and self._fault_rng.random() < rate:
            victim = max(plan.prefills, key=lambda s: self.running.index(s))
            self._preempt(victim, plan)
        return plan

    def _grow(self, seq: Seq, tokens: int, plan: StepPlan) -> bool:
        """Give ``seq`` blocks for ``tokens`` tokens, preempting the youngest running
        requests if needed; ``False`` when ``seq`` itself was preempted."""
        need = -(-tokens // self._block) - len(seq.blocks)
        if need <= 0:
            return True
        pool = self.pool
        while not pool.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        blocks = pool.allocate(need)
        assert blocks is not None
        seq.blocks.extend(blocks)
        return True

    def _admit(self, seq: Seq, budget: int, plan: StepPlan) -> int:
        """Admit the head of the queue if its first chunk fits; tokens scheduled (0 = not)."""
        if not self._free_batch or not self.pool.free_count():
            return 0
        block, n = self._block, seq.prompt_len
        request = seq.request
        if seq.hashed is None:
            seq.hashed = request.prompt.hashed(self._namespace, self.config.unit)
            seq.digests = block_digests(seq.hashed, n // block, self._units_per_block)
        self.checker.request_id = request.request_id
        if seq.admissions == 0:
            self._before_first_lookup(seq)
        present = self.pool.match(seq.digests)
        hit = reconcile(
            self.index, self._namespace, seq.hashed, n, present, block, paged=self._paged
        )
        p = hit.tokens if hit is not None else 0
        # Blocks of [0, p) still cached are shared. Without paged attention a hit is not
        # limited by the KV pool (its blocks hold nothing the model reads), so some of
        # them may have been reused since: those come fresh, like the chunk's.
        shared = min(p // block, present)
        end = min(n, p + budget)
        if hit is not None and self._unified:
            # The pages for the chunk may come from evicting checkpoints: not this one.
            self.index.pin(hit.slot)
            self._ledger.pin(hit.slot)
        blocks = self.pool.admit(seq.digests[:shared], -(-end // block) - shared)
        if blocks is None:
            if hit is not None and self._unified:
                self._unpin(hit.slot)
            return 0
        self.waiting.popleft()
        seq.batch_slot = self._free_batch.pop()
        self.running.append(seq)
        seq.phase = Phase.PREFILL
        seq.blocks = blocks
        seq.computed = p
        seq.generated = 0
        seq.registered = shared
        seq.hit_tokens = p
        seq.admissions += 1
        metrics = self.metrics
        if seq.admissions == 1:
            metrics.requests_admitted += 1
            metrics.prompt_tokens += n
            if seq.after_warmup:
                metrics.warm_requests += 1
                metrics.warm_prompt_tokens += n
        # The hit itself is counted when its restore is issued (_issue_restores).
        branch = self._hints(request, "branch_points")
        cached_end = present * block
        if p < cached_end < n and cached_end not in branch:
            branch = (*branch, cached_end)
        seq.branch_points = branch
        self.backend.start(request, seq.batch_slot)
        if hit is not None:
            seq.hit_slot = hit.slot
            if self._unified:  # pinned above
                self._ledger.touch(hit.slot, self._shared_pool.tick())
            else:
                self.index.pin(hit.slot)
            plan.restores.append(seq)
        else:
            seq.hit_slot = -1
        self._plan_chunk(seq, p, end, plan)
        return end - p

    def _plan_chunk(self, seq: Seq, start: int, end: int, plan: StepPlan) -> None:
        """Plan chunk ``[start, end)`` of ``seq`` and reserve the checkpoints inside it."""
        request = seq.request
        chunk = PrefillChunk(
            start=start,
            end=end,
            prompt_len=seq.prompt_len,
            turn_starts=self._hints(request, "turn_starts"),
            branch_points=seq.branch_points,
        )
        reservations: list[Reservation] = []
        positions = self.placement.positions(chunk)
        if positions:
            self.checker.request_id = request.request_id
            metrics = self.metrics
            assert seq.hashed is not None
            # SEMANTICS H5. The request's own branch points first (the workload's prefix
            # tree: other prompts share the prefix up to them), then the rest, each group
            # longest first (a longer prompt of the same conversation can use it). A
            # branch point may always evict; any other position only while nothing of
            # this chunk is reserved, else it takes free memory or is skipped: a chunk's
            # other checkpoints never flush the cache.
            unit = self.config.unit
            hints = self._hints(request, "branch_points")
            shared = {point // unit * unit for point in hints}
            for position in sorted(positions, key=lambda p: (p not in shared, -p)):
                metrics.captures_planned += 1
                if reservations and position not in shared and not self._room_without_eviction():
                    metrics.captures_skipped_full += 1
                    continue
                outcome = self._reserve(seq.hashed, position)
                if outcome is not None:
                    reservations.append(outcome)
            reservations.sort(key=_tokens)  # ascending: the order the backend computes them
        plan.prefills[seq] = _Chunk(start, end, reservations)

    def _hints(self, request: RequestLike, name: str) -> tuple[int, ...]:
        """The request's workload hint ``name`` (``branch_points``, ``turn_starts``), or
        nothing when the engine is not told the workload's structure."""
        if not self.config.workload_hints:
            return ()
        return tuple(getattr(request, name, ()))

    def _room_without_eviction(self) -> bool:
        """A checkpoint can be reserved without evicting anything."""
        if not self.index.free_count():
            return False
        return not self._unified or self._shared_pool.fresh_count() >= self._slot_pages

    def _reserve(self, hashed: HashedPrompt, position: int) -> Reservation | None:
        """Reserve the checkpoint at ``position`` of ``hashed`` (its bytes, FLOPs and, with
        unified memory, its pages accounted); the reservation, or ``None`` (already
        cached, or no slot: counted)."""
        metrics, costs = self.metrics, self.costs
        size = costs.checkpoint_bytes(position)
        outcome = self.index.reserve(
            self._namespace,
            hashed,
            position,
            cost=EntryCost(position, size, float(costs.prefill_flops(position))),
        )
        if isinstance(outcome, AlreadyCached):
            metrics.captures_already_cached += 1
            if self._unified and outcome.published:
                self._ledger.touch(outcome.slot, self._shared_pool.tick())
            return None
        if not isinstance(outcome, Reservation):
            metrics.captures_no_slot += 1
            return None
        slot = outcome.slot
        if self._unified:
            # The index evicted the slot's old entry itself (it was full), or took a
            # free slot, whose pages must now come out of the shared budget.
            if slot in self._held_slots:
                self._ledger.dropped(slot)
            elif self._shared_pool.make_fresh(self._slot_pages):
                self._held_slots.add(slot)
                self._shared_pool.withheld += self._slot_pages
            else:
                self.index.abort(outcome)
                metrics.captures_no_slot += 1
                return None
        metrics.captures_reserved += 1
        self._checkpoint_bytes += size - self._slot_bytes.get(slot, 0)
        self._slot_bytes[slot] = size
        return outcome

    def _evict_checkpoint_for_memory(self) -> bool:
        """Unified memory: evict the index policy's victim to give its pages back."""
        slot = self.index.evict_one("memory")
        if slot is None:
            return False
        self._ledger.dropped(slot)
        self._release_bytes(slot)
        return True

    def _preempt(self, seq: Seq, plan: StepPlan) -> None:
        """Free ``seq``'s blocks and batch slot, undo its plan, requeue it at the head."""
        self.metrics.preemptions += 1
        self.metrics.discarded_decode_tokens += seq.generated  # decoded again after resuming
        chunk = plan.prefills.pop(seq, None)
        if chunk is not None and not self.config.faults.skip_abort_on_preempt:
            self.checker.request_id = seq.request_id
            for reservation in chunk.reservations:
                self._abort(reservation)
        plan.decodes.pop(seq, None)
        if seq in plan.restores:
            plan.restores.remove(seq)
            self._unpin(seq.hit_slot)
        self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        self.backend.release(seq.request_id, seq.batch_slot)
        self._free_batch.append(seq.batch_slot)
        seq.batch_slot = -1
        seq.phase = Phase.WAITING
        seq.computed = seq.generated = seq.registered = seq.hit_tokens = 0
        seq.hit_slot = -1
        self.waiting.appendleft(seq)

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
        """Run the step's restore copies on the copy stream; the step's compute waits."""
        plan.restore_done = self.env.event()
        self.env.process(self._restore_job(slots, duration, plan.restore_done))

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

    # --- completion ----------------------------------------------------------------------

    def _complete(self, plan: StepPlan, now_s: float, *, sample: bool = True) -> None:
        """The step's forward pass ended at ``now_s``: write, register, advance, finish.

        ``sample=False`` leaves a due series sample to the engine (see :meth:`_fuse`).
        """
        self._now = now_s
        checker, metrics, backend = self.checker, self.metrics, self.backend
        checker.step = plan.step
        metrics.steps += 1
        faults = self.config.faults
        writes = self._step_writes = []
        for seq, chunk in plan.prefills.items():
            rid = seq.request_id
            checker.request_id = rid
            seq.ran = True
            reservations = chunk.reservations
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
            metrics.recomputed_tokens += chunk.end - chunk.start
            seq.computed = chunk.end
            self._register(seq)
            if seq.computed == seq.prompt_len:
                for mismatch in backend.prefill_done(rid, seq.batch_slot, seq.blocks):
                    checker.on_mismatch(seq.hit_slot, mismatch)
                seq.phase = Phase.DECODE
                seq.generated = 1
                metrics.decode_tokens += 1
                if seq.first_token_s < 0:
                    seq.first_token_s = now_s
                    metrics.ttft_s.append(now_s - seq.arrival_s)
                if seq.generated >= seq.output_tokens:
                    self._finish(seq)
        if plan.decodes:
            self._advance_decodes(plan)
        self._issue_captures()
        checker.on_step_end()
        if any(seq.phase is Phase.DONE for seq in self.running):
            self.running = [seq for seq in self.running if seq.phase is not Phase.DONE]
        used = self.pool.used_count()
        metrics.observe_peaks(used, self._checkpoint_bytes)
        if sample and metrics.due(now_s):
            metrics.sample(now_s, plan.step, self.gauges())

    def _issue_captures(self) -> None:
        """Issue the copy job of the captures written this step (published on completion)."""
        writes = self._step_writes
        if not writes:
            return
        self._step_writes = []
        faults = self.config.faults
        if faults.publish_on_issue:
            for reservation in writes:
                self._publish(reservation)
        capture_bytes = sum(self.costs.checkpoint_bytes(r.tokens) for r in writes)
        self.metrics.capture_bytes += capture_bytes
        duration = self.costs.copy_s(capture_bytes, len(writes)) + faults.copy_delay_s
        self._start_capture_job(writes, duration)

    def _start_capture_job(self, writes: list[Reservation], duration: float) -> None:
        """Run the step's capture copies on the copy stream; they publish on completion."""
        self.env.process(self._capture_job(writes, duration))

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
            seq.generated += 1 + accepted
            metrics.decode_tokens += 1 + accepted
            keep = -(-seq.computed // block)
            if len(seq.blocks) > keep:
                pool.release(seq.blocks[keep:])
                del seq.blocks[keep:]
            if seq.generated >= seq.output_tokens:
                self._finish(seq)

    def _register(self, seq: Seq) -> None:
        """Register the prompt blocks ``seq`` has fully computed, for prefix sharing."""
        full = min(seq.computed, seq.prompt_len) // self._block
        if full > seq.registered:
            register, blocks, digests = self.pool.register, seq.blocks, seq.digests
            for i in range(seq.registered, full):
                register(blocks[i], digests[i])
            seq.registered = full

    def _before_first_lookup(self, seq: Seq) -> None:
        """``seq`` is about to look up for the first time: tell the alpha tuner how many
        requests came before it while the cache had not yet evicted, and mark ``seq`` as
        counting after warm-up — from the first request admitted once the cache has
        evicted to make room (it is full), or after ``warmup_requests`` admitted requests
        when that is set. The eviction count is read only while one of them needs it."""
        metrics, tuner = self.metrics, self.alpha_tuner
        tuning = tuner is not None and tuner.requests_before_first_eviction is None
        if metrics.warm_from_request is not None and not tuning:
            seq.after_warmup = True
            return
        evictions = self._cache_evictions()
        if tuning:
            assert tuner is not None
            tuner.before_lookup(metrics.requests_admitted, evictions)
        if metrics.warm_from_request is None:
            limit = self.config.warmup_requests
            full = evictions > 0 if limit is None else metrics.requests_admitted >= limit
            if not full:
                return
            metrics.warm_from_request = seq.index
        seq.after_warmup = True

    def _cache_evictions(self) -> int:
        """Entries the cache has evicted to make room: checkpoints, and with unified
        memory cached KV blocks too (invalidations are not evictions)."""
        evictions = self.index.evictions
        count = evictions["capacity"] + evictions["memory"]
        if self._unified:
            count += sum(self.pool.evictions.values())
        return count

    def _finish(self, seq: Seq) -> None:
        seq.phase = Phase.DONE
        if self.alpha_tuner is not None:
            self.alpha_tuner.on_finish(seq.index, seq.request)
        if self._cache_generated:
            self._cache_answer(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        self.backend.release(seq.request_id, seq.batch_slot)
        self._free_batch.append(seq.batch_slot)
        seq.batch_slot = -1
        seq.hashed = None
        seq.digests = ()
        self.metrics.requests_finished += 1
        self._leave(seq, self._now)

    def _cache_answer(self, seq: Seq) -> None:
        """Cache what finished ``seq`` computed of its answer (``cache_generated``).

        The request holds KV and recurrent state for ``p = prompt + generated - 1``
        tokens of its ``answer`` (the last generated token was sampled, never fed). Its
        full blocks of ``[0, p)`` are registered by the answer's block digests, and the
        state at ``p`` is captured into a reserved slot (partial page ``p mod B`` rows
        included), written now and published when the step's capture copy completes,
        like any capture. A request without an ``answer`` caches nothing.
        """
        answer = getattr(seq.request, "answer", None)
        p = seq.computed
        if answer is None or p > len(answer) or p < 1:
            return
        block, metrics = self._block, self.metrics
        hashed = answer.hashed(self._namespace, self.config.unit)
        full = min(p // block, len(seq.blocks))
        if full > seq.registered:
            digests = block_digests(hashed, full, self._units_per_block)
            register, blocks = self.pool.register, seq.blocks
            for i in range(seq.registered, full):
                register(blocks[i], digests[i])
            metrics.generated_blocks_registered += full - seq.registered
            seq.registered = full
        if p <= seq.prompt_len or not self.config.generated_state:
            return  # nothing generated was fed, or only KV is kept of an answer
        self.checker.request_id = seq.request_id
        metrics.captures_planned += 1
        outcome = self._reserve(hashed, p)
        if outcome is None:
            return
        metrics.captures_generated += 1
        ok = self.backend.capture_generated(
            seq.request_id, seq.batch_slot, Capture(p, outcome.slot), seq.blocks
        )
        if not ok:
            metrics.captures_failed += 1
        if ok or self.config.faults.publish_failed_captures:
            self._step_writes.append(outcome)
        else:
            self._abort(outcome)

    def _next_step_finishes(self) -> bool:
        """With ``cache_generated``: the next decode step may finish a running request.
        Such a step captures, so it is never fused ahead of SimPy time."""
        if not self._cache_generated:
            return False
        return any(
            seq.generated + self._decode_tokens(seq) >= seq.output_tokens for seq in self.running
        )

    def _count_done(self) -> None:
        self._progress_pending += 1
        self._flush_progress()

    def _flush_progress(self, force: bool = False) -> None:
        if self._progress is not None and (self._progress_pending >= 64 or force):
            if self._progress_pending:
                self._progress(self._progress_pending)
            self._progress_pending = 0

    # --- index helpers -------------------------------------------------------------------

    def _publish(self, reservation: Reservation) -> None:
        if self.index.publish(reservation):
            self.metrics.captures_published += 1
            if self._unified:
                self._ledger.published(reservation.slot, self._shared_pool.tick())
        else:
            self.metrics.captures_cancelled += 1
            self._release_bytes(reservation.slot)

    def _abort(self, reservation: Reservation) -> None:
        self.index.abort(reservation)
        self.metrics.captures_aborted += 1
        self._release_bytes(reservation.slot)

    def _unpin(self, slot: int) -> None:
        """Release a restore's pin. An implementation whose index lost the pin (it evicted
        the slot while pinned) raises here; that is recorded, not fatal."""
        if self._unified:
            self._ledger.unpin(slot)
        try:
            self.index.unpin(slot)
        except HyckptError as error:
            self.checker.report(
                "pinned-evicted", slot, f"unpin of slot {slot} failed: the pin was lost ({error})"
            )

    def _release_bytes(self, slot: int) -> None:
        """``slot`` holds no checkpoint any more (aborted, cancelled, evicted for memory)."""
        self._checkpoint_bytes -= self._slot_bytes.pop(slot, 0)
        if self._unified and slot in self._held_slots:
            self._held_slots.discard(slot)
            self._shared_pool.withheld -= self._slot_pages
