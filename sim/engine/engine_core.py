"""The engine's state and the bookkeeping every part of it shares.

:class:`EngineCore` builds an engine (cost model, SimPy streams, KV pool — shared with
checkpoints under unified memory —, index, placement, the backend wrapped by its fault
injectors, queues, seeded random streams) and holds what the step logic of
:class:`~sim.engine.scheduler.Engine` leans on:

- the **arrivals** process: a request's arrival (or rejection), its departure, and with
  closed-loop sessions the release of the turn it held back;
- progress reports, the pool and queue gauges, evictions by reason;
- **index bookkeeping**: reserving a checkpoint (its bytes, FLOPs and, with unified memory,
  pages accounted), publishing, aborting, unpinning, evicting one for memory.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable

import simpy

from reference.api import AlreadyCached, EntryCost, Reservation, SlotState
from reference.errors import HyckptError, InvalidConfigError
from reference.hashing import HashedPrompt
from sim.engine.alpha_tuning import AlphaTuner
from sim.engine.backends.base import Backend, EngineLayout
from sim.engine.backends.faulty import DecliningBackend, FailingCaptures
from sim.engine.config import SimConfig
from sim.engine.decode_reservation import NewTokenRatio, sglang_max_new_tokens
from sim.engine.hits import block_digests
from sim.engine.kv_pool import KVPool
from sim.engine.leaf_kv import LeafKVPool
from sim.engine.length_limits import LengthLimits
from sim.engine.lockstep import LockstepChecker, ObservedIndex
from sim.engine.metrics import Gauges, Metrics
from sim.engine.progress_guard import (
    STALL_PREEMPTIONS,
    StalledRunError,
    stall_message,
    state_pages_per_request,
)
from sim.engine.sequence import Phase, RequestLike, Seq
from sim.engine.sessions import SessionGate
from sim.engine.step_plan import ChunkRelease, ProcessGenerator, StepPlan, _Chunk
from sim.engine.unified import SharedKVPool


class EngineCore:
    """An engine's state, arrivals and index bookkeeping (built like
    :class:`~sim.engine.scheduler.Engine`, which adds the steps)."""

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
        # running_states: what each running request holds of the checkpoint budget, and
        # what the running requests hold together now (SEMANTICS H9).
        self._states_per_running = config.running_states
        self._running_states_held = 0
        # vLLM's align-mode step rules (SEMANTICS H9a, H9b, H9c; planning and completion).
        self._handover = config.state_handover
        self._aligned_chunks = config.block_aligned_chunks
        self._release_recency = config.release_recency
        self._interleaved_free = config.interleaved_free
        self._required_captures = config.required_captures
        self._states_in_place = config.states_in_place
        # SEMANTICS H9f; a replay takes each output in at once.
        self._async_scheduling = config.async_scheduling and config.mode == "engine"
        self._finishing: list[Seq] = []
        self._resume_output = config.preemption == "resume"  # SEMANTICS H9g
        self._sglang_retraction = config.preemption_policy == "sglang"  # SEMANTICS H9g
        # SEMANTICS H9j: SGLang's reservation for running requests' output; the decode
        # steps counted for its new-token ratio's decay.
        self._reserve_decodes = config.decode_reservation == "sglang"
        self._new_token_ratio = NewTokenRatio()
        self._decode_steps = 0
        # SEMANTICS H9a: checkpoint slot -> the request whose running state's pages it took.
        self._lent_holders: dict[int, Seq] = {}
        # SEMANTICS H9h: states live in the request's blocks, which it holds until its turn
        # in the next step's planning; capture slot -> the request that wrote it.
        # A replay serves one request at a time: nothing else is planned between its steps.
        self._hold_until_turn = config.states_in_place and config.mode == "engine"
        self._capture_holders: dict[int, Seq] = {}
        # SEMANTICS H9l: captures of running requests' chunks, by slot (writer, tokens).
        self._hold_latest = config.hold_latest_checkpoint
        # SEMANTICS H9m: planning passes that looked at a non-empty waiting queue.
        self._refresh_waiting = config.refresh_waiting_prefixes and config.mode == "engine"
        self._waiting_looks = 0
        # SEMANTICS H9o: SGLang's running_batch.batch_is_full after a refusal, and
        # whether a request left (or a prefill step left one mid-prefill) since.
        self._pause_after_refusal = config.pause_after_refusal and config.mode == "engine"
        self._admission_paused = False
        self._batch_changed = False
        # SEMANTICS H9p: while a prefill step is planned, the fresh blocks each chunk and
        # admission will take (allocated together once the step's lookups are done), and
        # the chunks whose checkpoints are reserved after that.
        self._allocate_after_lookups = config.allocate_after_lookups and config.mode == "engine"
        self._deferred: list[tuple[Seq, int]] | None = None
        self._deferred_captures: list[tuple[Seq, _Chunk, tuple[int, ...]]] = []
        # SEMANTICS H9q: every admission lookup refreshes the KV before its hit.
        self._lookup_refreshes = config.lookup_refreshes_prefix and config.mode == "engine"
        self._latest_writers: dict[int, tuple[Seq, int]] = {}
        self._admit_full_prompt = config.admit_full_prompt
        self._adopt_cached = config.adopt_cached_blocks
        # Unified memory and running states both evict a checkpoint before the index is
        # full, which only an index with evict_one(reason) can do.
        needs_evict_one = [
            why
            for wanted, why in (
                (self._unified, "memory='unified' (to give a checkpoint's pages back)"),
                (
                    self._states_per_running > 0,
                    f"running_states={config.running_states} (to make room for a running "
                    "request's states)",
                ),
            )
            if wanted
        ]
        if needs_evict_one and not callable(getattr(inner, "evict_one", None)):
            raise InvalidConfigError(
                f"{' and '.join(needs_evict_one)} needs an index with evict_one(reason), "
                f"which the reference index has; {implementation.name!r}'s index has none"
            )
        if self._unified:
            self._slot_pages = config.unified_slot_pages()
            self._held_slots: set[int] = set()  # slots whose pages are withheld
            self._shared_pool = SharedKVPool(
                config.kv_capacity(),
                config.block_size,
                self._slot_pages,
                self._evict_checkpoint_for_memory,
                keep_copies=config.keep_block_copies,
            )
            self._ledger = self._shared_pool.ledger
            self.pool: KVPool = self._shared_pool
        elif config.drop_leaf_kv:
            leaf_pool = LeafKVPool(config.kv_capacity(), config.block_size, config.unit)
            leaf_pool.on_leaf_evicted = self._leaf_kv_evicted
            self.pool = leaf_pool
        else:
            self.pool = KVPool(
                config.kv_capacity(), config.block_size, keep_copies=config.keep_block_copies
            )
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
        # The marconi policy's free_leaf_kv: the policy (it names each leaf victim) and,
        # only then, each reserved slot's prompt and position.
        policy = getattr(inner, "eviction", None)
        self._leaf_kv_policy = policy if getattr(policy, "free_leaf_kv", False) else None
        self._drop_leaf_kv = config.drop_leaf_kv
        self._slot_prompt: dict[int, tuple[HashedPrompt, int]] = {}
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
        # A request the pool could not hold alone is rejected on arrival (vLLM's
        # max_model_len check): its KV blocks and, with unified memory, its states.
        self._max_kv_pages = self.pool.num_blocks - state_pages_per_request(config)
        self._length_limits = LengthLimits.of(config)  # max_model_len, as the engine's
        # Without one, requests longer than the model's context are counted (a warning).
        self._model_context = (
            config.sizes().max_position_embeddings if config.max_model_len is None else 0
        )
        self._preemptions_at_progress = 0  # the progress guard's mark
        self._cache_generated = config.cache_generated
        self._step_writes: list[Reservation] = []  # captures written in the current step
        self._step_retouch: list[ChunkRelease] = []  # release_recency
        self._last_capture_job: simpy.Process | None = None

    # --- running ----------------------------------------------------------------------

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

    # --- finished requests ------------------------------------------------------------

    def _let_go(self, seq: Seq) -> None:
        """Finished ``seq`` gives back what it holds (implemented by
        :class:`~sim.engine.completion.Completion`)."""
        raise NotImplementedError

    def _take_in_finished(self) -> bool:
        """``async_scheduling``: the last step's finished requests let go (implemented by
        :class:`~sim.engine.completion.Completion`)."""
        raise NotImplementedError

    # --- arrivals and departures ------------------------------------------------------

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

    def _advanced(self, seq: Seq) -> None:
        """``seq`` has ``seq.computed`` tokens computed: progress if no step had taken it
        that far before (:mod:`sim.engine.progress_guard`)."""
        if seq.computed > seq.furthest:
            seq.furthest = seq.computed
            self._preemptions_at_progress = self.metrics.preemptions

    def _check_progress(self) -> None:
        """Before a preemption: raise :class:`StalledRunError` when the last
        ``STALL_PREEMPTIONS`` preemptions came with no progress."""
        stalled = self.metrics.preemptions - self._preemptions_at_progress
        if stalled >= STALL_PREEMPTIONS:
            seqs = [*self.running, *self.waiting]
            raise StalledRunError(
                stall_message(self.config, seqs, self.pool.num_blocks, self._block),
                self.step,
                stalled,
            )

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
        limits = self._length_limits
        refused = capped = False
        if self._model_context and seq.prompt_len + seq.output_tokens > self._model_context:
            metrics.requests_over_context += 1
        asked = self.config.client_max_tokens
        if isinstance(asked, int) and seq.output_tokens > asked:  # it stops at max_tokens
            seq.output_tokens, capped = asked, True
        if limits is not None:
            refused = limits.refuses(seq.prompt_len)
            room = limits.output_room(seq.prompt_len)
            if not refused and seq.output_tokens > room:  # it stops at max_model_len
                seq.output_tokens, capped = room, True
        seq.max_new_tokens = self._max_new_tokens(seq, asked, limits)
        # Its KV peaks at prompt + output - 1 tokens: the last output token is sampled,
        # never fed (speculative tokens are capped at the output left).
        tokens = seq.prompt_len + seq.output_tokens - 1
        if refused or seq.prompt_len < 1 or -(-tokens // self._block) > self._max_kv_pages:
            seq.phase = Phase.DONE
            self.metrics.requests_rejected += 1
            self._leave(seq, arrival_s)
            self._wake()
            return
        metrics.requests_length_capped += capped
        self.waiting.append(seq)
        metrics.waiting_at_last_arrival = queued = len(self.waiting)
        if queued > metrics.peak_waiting:
            metrics.peak_waiting = queued
        self._wake()

    def _max_new_tokens(self, seq: Seq, asked: int | str, limits: LengthLimits | None) -> int:
        """What the engine takes as ``seq``'s ``max_new_tokens`` (SEMANTICS H9k): its
        answer's length when the client asks for exactly that, else the client's
        ``max_tokens`` capped as SGLang caps it (the KV pool counted only with SGLang's
        reservation, the one reader of the value), never below its output."""
        if asked == "answer":
            return seq.output_tokens
        most = sglang_max_new_tokens(
            asked if isinstance(asked, int) else None,
            seq.prompt_len,
            None if limits is None else limits.output_room(seq.prompt_len),
            self.pool.num_blocks * self._block if self._reserve_decodes else None,
        )
        return max(most, seq.output_tokens)

    def _count_done(self) -> None:
        self._progress_pending += 1
        self._flush_progress()

    def _flush_progress(self, force: bool = False) -> None:
        if self._progress is not None and (self._progress_pending >= 64 or force):
            if self._progress_pending:
                self._progress(self._progress_pending)
            self._progress_pending = 0

    # --- index helpers ----------------------------------------------------------------

    def _reserve(self, hashed: HashedPrompt, position: int) -> Reservation | None:
        """Reserve the checkpoint at ``position`` of ``hashed`` (its bytes, FLOPs and, with
        unified memory, its pages accounted); the reservation, or ``None`` (already
        cached, or no slot: counted)."""
        metrics, costs = self.metrics, self.costs
        size = costs.checkpoint_bytes(position)
        if self._running_states_held and not self._unified and not self._free_slots(1):
            metrics.captures_no_slot += 1
            return None
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
            elif self._shared_pool.withhold(self._slot_pages):
                self._held_slots.add(slot)
            else:
                self.index.abort(outcome)
                metrics.captures_no_slot += 1
                return None
        metrics.captures_reserved += 1
        if self._drop_leaf_kv:
            evicted = self._slot_prompt.get(slot)
            if evicted is not None:  # the index evicted the slot's entry to reuse it
                self._drop_leaf_kv_of(slot, *evicted)
        if self._leaf_kv_policy is not None or self._drop_leaf_kv:
            self._slot_prompt[slot] = (hashed, position)
        if self._drop_leaf_kv:
            # Every reserved position is a node boundary (SGLang splits its tree there),
            # kept when an inner checkpoint is evicted (a tombstone).
            pool = self.pool
            assert isinstance(pool, LeafKVPool)
            home = self._home_block(hashed, position)
            pool.add_boundary(home, hashed.digest(position), position)
        self._checkpoint_bytes += size - self._slot_bytes.get(slot, 0)
        self._slot_bytes[slot] = size
        return outcome

    # --- running requests' states (running_states, SEMANTICS H9) ------------------------

    def _take_running_states(self) -> bool:
        """Hold ``running_states`` states of the checkpoint budget for a request being
        admitted, evicting cached checkpoints (split memory) or pages (unified memory, by
        the shared pool's rule) as needed; whether it got them (what was evicted stays
        evicted)."""
        count = self._states_per_running
        if self._unified:
            if not self._shared_pool.withhold(count * self._slot_pages):
                return False
        elif not self._free_slots(count):
            return False
        self._running_states_held += count
        return True

    def _give_back_running_states(self, seq: Seq) -> None:
        """``seq`` finished or was preempted: its states are free again (but for one
        whose pages it lent to a checkpoint, which keeps them)."""
        count = self._states_per_running
        self._running_states_held -= count
        if self._unified:
            kept = count - 1 if seq.state_lent else count
            seq.state_lent = False
            self._shared_pool.withheld -= kept * self._slot_pages

    def _register_answer_blocks(self, seq: Seq, hashed: HashedPrompt, cached: int) -> None:
        """Register ``seq``'s full KV blocks of ``[0, cached)`` of its answer (``hashed``)
        past those registered already (``cache_generated``, SEMANTICS H4)."""
        block = self._block
        full = min(cached // block, len(seq.blocks))
        if full <= seq.registered:
            return
        digests = block_digests(hashed, full, self._units_per_block)
        start = seq.registered
        parent = digests[start - 1] if start else None
        if self._adopt_cached:  # SEMANTICS H10a
            self.pool.adopt_cached(seq.blocks, start, full, digests)
        self.pool.register_many(seq.blocks[start:full], digests[start:full], parent, start, hashed)
        past_prompt = max(seq.registered, seq.prompt_len // block)
        self.metrics.generated_blocks_registered += max(0, full - past_prompt)
        seq.registered = full

    def _hold_lent(self, seq: Seq, slot: int) -> None:
        """``seq``'s running state's pages went to the checkpoint reserved in ``slot``
        (:meth:`_lend_running_state`): pinned once published, while the state is there."""
        seq.lent_slot = slot
        self._lent_holders[slot] = seq

    def _pin_if_held(self, slot: int) -> None:
        """Checkpoint ``slot`` was just published: pin it if a running request's state is
        still in it (SEMANTICS H9a: vLLM frees that block only once the state moved on),
        or until the turn of the request that wrote it in the next step's planning
        (H9h)."""
        writer = self._capture_holders.pop(slot, None)
        holder = self._lent_holders.pop(slot, None)
        if holder is not None and holder.state_lent and holder.lent_slot == slot:
            self._pin(slot)
            holder.lent_pinned = True
        elif writer is not None and writer.batch_slot >= 0:
            self._pin(slot)
            self._hold(writer, slot)

    def _hold_latest_checkpoint(self, seq: Seq, slot: int, tokens: int) -> None:
        """SEMANTICS H9l: running ``seq`` holds checkpoint ``slot`` (``tokens`` long)
        pinned instead of the one it held, as SGLang's request moves its lock to the
        tree node it has reached."""
        self._pin(slot)
        if seq.latest_slot >= 0:
            self._unpin(seq.latest_slot)
        seq.latest_slot, seq.latest_tokens = slot, tokens

    def _hold_if_latest(self, slot: int) -> None:
        """Checkpoint ``slot`` was just published: the request whose chunk wrote it, still
        running, holds it if it reaches further than what it holds (SEMANTICS H9l)."""
        writer = self._latest_writers.pop(slot, None)
        if writer is None:
            return
        seq, tokens = writer
        if seq.batch_slot >= 0 and tokens > seq.latest_tokens:
            self._hold_latest_checkpoint(seq, slot, tokens)

    def _pin(self, slot: int) -> None:
        self.index.pin(slot)
        if self._unified:
            self._ledger.pin(slot)

    def _hold(self, seq: Seq, slot: int) -> None:
        """SEMANTICS H9h: ``seq`` holds pinned checkpoint ``slot``, which the step being
        completed read or wrote, until its turn in the next step's planning; with
        ``async_scheduling`` in the one after (vLLM's ``remove_skipped_blocks`` frees only
        what processed steps moved past, and a step is scheduled before the previous
        one's output is processed)."""
        seq.held.append((slot, self._turn_after()))

    def _turn_after(self) -> int:
        """The step at whose planning a request lets go of what this step held (H9h)."""
        return self.step + (2 if self._async_scheduling else 1)

    def _release_held(self, seq: Seq, *, turn: bool = True) -> None:
        """``seq``'s turn in planning this step (or with ``turn=False`` its end): the
        checkpoints and state pages it held until now (until its end: all) are let go of
        (SEMANTICS H9h)."""
        step = self.step
        keep = []
        for slot, until in seq.held:
            if turn and until > step:
                keep.append((slot, until))
            else:
                self._unpin(slot)
        seq.held = keep
        if seq.held_pages:
            pages = [(n, until) for n, until in seq.held_pages if turn and until > step]
            freed = sum(n for n, _ in seq.held_pages) - sum(n for n, _ in pages)
            self._shared_pool.withheld -= freed
            seq.held_pages = pages

    def _let_go_of_holds(self, seq: Seq) -> None:
        """``seq`` no longer holds the checkpoint its state's pages went to, nor those it
        held since its last step: unpinned."""
        self._release_held(seq, turn=False)
        if seq.latest_slot >= 0:  # SEMANTICS H9l: release_kv_cache unlocks its node
            self._unpin(seq.latest_slot)
            seq.latest_slot, seq.latest_tokens = -1, 0
        if seq.lent_pinned:
            self._unpin(seq.lent_slot)
        self._lent_holders.pop(seq.lent_slot, None)
        seq.lent_slot, seq.lent_pinned = -1, False

    def _leave_lent(self, seq: Seq, plan: StepPlan) -> None:
        """``seq``'s state moves on from its lent checkpoint this step: the step holds it
        (pinned) until it completes."""
        if seq.lent_pinned:
            plan.lent_held.append((seq, seq.lent_slot))
        else:
            self._lent_holders.pop(seq.lent_slot, None)
        seq.lent_slot, seq.lent_pinned = -1, False

    def _lend_running_state(self, seq: Seq) -> None:
        """``state_handover``: the checkpoint at the end of ``seq``'s chunk is the block
        its running state is written to, so it takes that state's pages (which are fresh
        for :meth:`_reserve` to take) rather than new ones."""
        self._shared_pool.withheld -= self._slot_pages
        seq.state_lent = True

    def _take_back_running_state(self, seq: Seq) -> None:
        """``seq``'s running state takes pages of its own again: undoing
        :meth:`_lend_running_state` (the lent pages are still fresh), or when its state
        moves on from the checkpoint it lent them to (the caller checked that the shared
        pool can free them)."""
        taken = self._shared_pool.withhold(self._slot_pages)
        assert taken, "the pages are fresh or can be freed (checked by the caller)"
        seq.state_lent = False

    def _take_handover(self, seq: Seq, plan: StepPlan) -> None:
        """``state_handover`` (SEMANTICS H9a): ``seq``'s state moves to a new block this
        step, so its old one stays held until the step completes: one state's pages more,
        made fresh by the shared pool's rule (the caller checked that they can be)."""
        taken = self._shared_pool.withhold(self._slot_pages)
        assert taken, "checked by the caller (can_allocate)"
        plan.handovers.append(seq)

    def _end_handovers(self, plan: StepPlan, seq: Seq | None = None) -> None:
        """Free the old states' pages the step held, and unpin the checkpoints states left
        (only ``seq``'s when it is given, a request preempted while the step is planned)."""
        for moved in [s for s in plan.handovers if seq is None or s is seq]:
            plan.handovers.remove(moved)
            if self._hold_until_turn and seq is None and moved.batch_slot >= 0:
                # H9h: vLLM frees the old block at the request's turn in the next step
                # (two steps on asynchronously: once this step's output is processed).
                moved.held_pages.append((self._slot_pages, self._turn_after()))
            else:
                self._shared_pool.withheld -= self._slot_pages
        for held in [h for h in plan.lent_held if seq is None or h[0] is seq]:
            plan.lent_held.remove(held)
            holder, slot = held
            if self._hold_until_turn and seq is None and holder.batch_slot >= 0:
                self._hold(holder, slot)  # H9h: until its turn in the next step
            else:
                self._unpin(slot)

    def _free_slots(self, count: int) -> bool:
        """Split memory: evict the index policy's victims until ``count`` free slots lie
        beyond those the running requests hold; whether it got there."""
        index = self.index
        while index.free_count() < self._running_states_held + count:
            slot = index.evict_one("capacity")
            if slot is None:
                return False
            if self._drop_leaf_kv:
                self._drop_leaf_kv_of(slot, *self._slot_prompt[slot])
            self._release_bytes(slot)
        return True

    def _drop_leaf_kv_of(self, slot: int, hashed: HashedPrompt, position: int) -> None:
        """``drop_leaf_kv`` (SEMANTICS H10): the checkpoint at ``position`` of ``hashed``
        in ``slot`` was evicted. Unless another cached checkpoint continues its prefix
        (it was not a leaf), evict its free cached KV blocks back to its node's start:
        the deepest earlier checkpoint position on its prefix (a node boundary, even if
        that checkpoint was evicted since), or a block another cached sequence continues
        or a sequence holds (:meth:`LeafKVPool.drop_path`)."""
        digest = hashed.digest(position)
        for other_slot, (other, tokens) in self._slot_prompt.items():
            if other_slot != slot and tokens > position and other.digest(position) == digest:
                return  # a deeper checkpoint continues it: not a leaf
        pool = self.pool
        assert isinstance(pool, LeafKVPool)
        pool.remove_boundary(self._home_block(hashed, position), digest)  # its node goes
        block = self._block
        digests = block_digests(hashed, position // block, self._units_per_block)
        keep = pool.deepest_boundary(digests, position, hashed.digest)
        full, part = divmod(keep, block)  # a boundary inside a block keeps a stub of it
        pool.drop_path(digests, full + (part > 0), part)

    def _leaf_kv_evicted(self, digest: bytes) -> None:
        """``drop_leaf_kv`` (SEMANTICS H10): KV pressure evicted the cached block
        ``digest``, a leaf of the block tree. A checkpoint whose last full block it was
        (its home block) can no longer be used; SGLang deletes that radix node with its
        state and the rest of its KV, so the checkpoint is invalidated (the index counts
        it under ``invalidate``) and its free cached KV goes back to its node's start."""
        gone = [
            (slot, hashed, position)
            for slot, (hashed, position) in self._slot_prompt.items()
            if position >= self._block and self._home_block(hashed, position) == digest
        ]
        for slot, hashed, position in gone:
            if self.index.slot_state(slot) != SlotState.PUBLISHED or self.index.pins(slot):
                continue  # being written or read: it stays until its holder is done
            key = self.index.make_key(self._namespace, hashed, position)
            if not self.index.invalidate(key):
                continue
            self._drop_leaf_kv_of(slot, hashed, position)
            self._release_bytes(slot)

    def _home_block(self, hashed: HashedPrompt, position: int) -> bytes:
        """The digest of the last full KV block before ``position`` of ``hashed``
        (``b""`` inside the first block): where ``drop_leaf_kv`` files its boundary."""
        full = position // self._block
        return hashed.unit_digest(full * self._units_per_block) if full else b""

    def _evict_checkpoint_for_memory(self) -> bool:
        """Unified memory: evict the index policy's victim to give its pages back."""
        slot = self.index.evict_one("memory")
        if slot is None:
            return False
        # interleaved_free (SEMANTICS H9d): one page now, the rest after its group.
        self._ledger.dropped(slot, self._slot_pages - 1 if self._interleaved_free else 0)
        self._free_leaf_kv(slot)
        self._release_bytes(slot)
        return True

    def _free_leaf_kv(self, slot: int) -> None:
        """With a policy asking ``free_leaf_kv`` (the ``marconi`` preset): when the evicted
        checkpoint was a leaf of the prefix forest, evict the free cached KV blocks of its
        prompt past its parent checkpoint too, as Marconi frees a leaf node's KV with its
        state (no other checkpoint lies past them on this prompt: H1)."""
        if self._leaf_kv_policy is None:
            return
        victim = self._leaf_kv_policy.last_victim
        if victim is None or victim[0] != slot:
            return
        hashed, position = self._slot_prompt[slot]
        block = self._block
        digests = block_digests(hashed, position // block, self._units_per_block)
        self._shared_pool.drop_cached(digests[victim[1] // block :])

    def _publish(self, reservation: Reservation) -> None:
        if self.index.publish(reservation):
            self.metrics.captures_published += 1
            if self._unified:
                self._ledger.published(reservation.slot, self._shared_pool.tick())
            if self._lent_holders or self._capture_holders:
                self._pin_if_held(reservation.slot)
            if self._latest_writers:
                self._hold_if_latest(reservation.slot)
        else:
            self._lent_holders.pop(reservation.slot, None)
            self._capture_holders.pop(reservation.slot, None)
            self._latest_writers.pop(reservation.slot, None)
            self.metrics.captures_cancelled += 1
            self._release_bytes(reservation.slot)

    def _abort(self, reservation: Reservation) -> None:
        self._latest_writers.pop(reservation.slot, None)
        self._lent_holders.pop(reservation.slot, None)
        self._capture_holders.pop(reservation.slot, None)
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
        self._slot_prompt.pop(slot, None)
        if self._unified and slot in self._held_slots:
            self._held_slots.discard(slot)
            self._shared_pool.withheld -= self._slot_pages
