"""Planning a step: decodes first, then prefill chunks, then admissions.

:class:`Planning` fills a :class:`~sim.engine.step_plan.StepPlan` at the step's start
(:meth:`Planning._schedule`): the tokens each decode verifies, the KV blocks each request
grows by (preempting the youngest running requests when none are free), each admission's
hybrid hit (:mod:`sim.engine.hits`) and pinned restore, and each chunk's checkpoints,
reserved in the index in the placement policy's order (SEMANTICS H5).
"""

from __future__ import annotations

from itertools import islice

from reference.api import PrefillChunk, Reservation
from reference.hashing import TOKEN_BYTES
from sim.engine.decode_reservation import admits, reservation_room
from sim.engine.engine_core import EngineCore
from sim.engine.hits import block_digests, reconcile
from sim.engine.leaf_kv import LeafKVPool
from sim.engine.sequence import Phase, RequestLike, Seq
from sim.engine.step_plan import StepPlan, _Chunk

#: SGLang's ``WAITING_PREFIX_REFRESH_INTERVAL`` and ``WAITING_QUEUE_PREFIX_MATCH_MAX``
#: (``srt/managers/schedule_policy.py``): every 32nd look at the waiting queue refreshes
#: the prefixes of its first 128 requests (SEMANTICS H9m).
WAITING_REFRESH_INTERVAL = 32
WAITING_REFRESH_MAX = 128


def _tokens(reservation: Reservation) -> int:
    return reservation.tokens


def _retraction_key(seq: Seq) -> tuple[int, int]:
    """SGLang's retraction order (``ScheduleBatch._get_decode_retraction_order``, the
    ``length`` policy): the smallest key is retracted first (fewest output tokens, then
    the longest prompt)."""
    return (seq.generated, -seq.prompt_len)


class Planning(EngineCore):
    """The engine's step planning (a part of :class:`~sim.engine.scheduler.Engine`)."""

    def _schedule(self) -> StepPlan:
        """Plan the next step at the current time: decode, then prefill, then admit; with
        ``mixed_batches = False`` prefill and admit, and decode only in a step that has
        no prefill chunk (SEMANTICS H9i)."""
        self.step += 1
        self.checker.step = self.step
        plan = StepPlan(self.step)
        config = self.config
        budget = config.token_budget
        preempted = self.metrics.preemptions
        if config.mixed_batches:
            budget = self._plan_decodes(plan, budget)
            self._plan_prefills(plan, budget, preempted)
        else:
            self._plan_prefills(plan, budget, preempted)
            if not plan.prefills:
                self._plan_decodes(plan, budget)
        plan.after_let_go = self._take_in_finished()  # SEMANTICS H9f
        rate = config.faults.preempt_mid_prefill_rate
        # Only a step with other work can lose a request this way: a step left empty
        # would make no progress (at rate 1 a lone request would be preempted forever).
        others = len(plan.prefills) + len(plan.decodes) - 1
        if rate and plan.prefills and others and self._fault_rng.random() < rate:
            victim = max(plan.prefills, key=lambda s: self.running.index(s))
            self._preempt(victim, plan)
        return plan

    def _plan_decodes(self, plan: StepPlan, budget: int) -> int:
        """Plan each decoding request's decode (growing its blocks, which may preempt);
        return the prefill budget left (``decodes_share_budget``: less the decodes')."""
        share = self.config.decodes_share_budget
        preempted = self.metrics.preemptions
        for seq in list(self.running):
            if seq.phase is not Phase.DECODE:
                continue
            if seq.held or seq.held_pages:  # SEMANTICS H9h: its turn
                self._release_held(seq)
            tokens = self._decode_tokens(seq)
            if self._grow(seq, seq.computed + tokens, plan):
                plan.decodes[seq] = tokens
                if share:
                    budget -= tokens
        # SEMANTICS H9j: the new-token ratio decays with each decode step that retracts
        # no one, and is estimated anew at a retraction.
        if self.metrics.preemptions > preempted:
            if self._reserve_decodes:
                decoding = (seq for seq in self.running if seq.phase is Phase.DECODE)
                self._new_token_ratio.after_retraction(decoding, self._decode_steps)
        elif plan.decodes:
            self._decode_steps += 1
        return budget

    def _decode_room(self, plan: StepPlan) -> float:
        """SEMANTICS H9j (SGLang's ``PrefillBudget.remaining_total``): free and evictable
        KV tokens, less each decoding request's remaining output times the new-token
        ratio, less a page and, for a chunk that completes its prefill, the output of
        each request ``plan`` prefills (its chunk's own blocks are allocated already)."""
        return reservation_room(
            self._free_blocks() * self._block,
            (seq for seq in self.running if seq.phase is Phase.DECODE),
            ((seq, chunk.end == seq.prefill_len) for seq, chunk in plan.prefills.items()),
            self._new_token_ratio.at(self._decode_steps),
        )

    def _plan_prefills(self, plan: StepPlan, budget: int, preempted: int) -> None:
        """Plan the prefilling requests' chunks, then admit from the waiting queue, within
        ``budget`` tokens (no admission after a preemption this step, ``preempted``
        being the count before it, unless ``admit_after_preemption``)."""
        config = self.config
        if self._pause_after_refusal and (self._batch_changed or not self._any_decoding()):
            # SGLang clears batch_is_full when its running (decoding) batch shrank or is
            # empty (get_next_batch_to_run, _get_new_batch_prefill_raw).
            self._admission_paused = self._batch_changed = False
        if self._refresh_waiting and self.waiting:
            self._look_at_waiting()
        if self._allocate_after_lookups:
            self._deferred = []
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.phase is not Phase.PREFILL:
                continue
            if seq.held or seq.held_pages:
                self._release_held(seq)
            chunk_budget = budget
            if self._reserve_decodes:
                # PrefillBudget.available_chunk_tokens: cut to the room left, if any.
                room = int(self._decode_room(plan))
                chunk_budget = min(budget, room) if room > 0 else budget
            end = self._chunk_end(seq, seq.computed, chunk_budget, seq.branch_points)
            if end == seq.computed:
                continue  # less than a block of budget left for an aligned chunk
            captures = 0
            if self._required_captures:
                captures = self._capture_pages(seq, seq.computed, end, seq.branch_points)
            if self._grow(seq, end, plan, captures):
                self._plan_chunk(seq, seq.computed, end, plan)
                budget -= end - seq.computed
        admit = config.admit_after_preemption or self.metrics.preemptions == preempted
        admit = admit and not self._admission_paused
        while admit and self.waiting and budget > 0 and len(self.running) < config.max_num_seqs:
            taken = self._admit(self.waiting[0], budget, plan)
            if not taken:
                break
            budget -= taken
        if self._deferred is not None:
            self._allocate_deferred()
            # SGLang takes a chunk's state slot when it inserts the state, after the
            # step's KV allocation (SEMANTICS H9p).
            planned, self._deferred_captures = self._deferred_captures, []
            for seq, chunk, positions in planned:
                chunk.reservations = self._reserve_chunk(seq, chunk.end, positions)

    def _any_decoding(self) -> bool:
        """Whether a running request decodes (is in SGLang's running batch)."""
        return any(seq.phase is Phase.DECODE for seq in self.running)

    def _free_blocks(self) -> int:
        """Free KV blocks less those promised to this step's chunks and admissions
        (SEMANTICS H9p), which are allocated when the step's lookups are done."""
        free = self.pool.free_count()
        if self._deferred:
            free -= sum(count for _, count in self._deferred)
        return free

    def _allocate_deferred(self) -> None:
        """SEMANTICS H9p (SGLang's ``prepare_for_extend``): allocate the fresh blocks the
        step's chunks and admissions were promised, in one allocation, in the order they
        were planned; whatever it evicts is no prefix the step's requests hit, those
        being held already."""
        deferred, self._deferred = self._deferred, None
        assert deferred is not None
        count = sum(need for _, need in deferred)
        if not count:
            return
        blocks = self.pool.allocate(count)
        assert blocks is not None  # promised only what was free
        at = 0
        for seq, need in deferred:
            seq.blocks.extend(blocks[at : at + need])
            at += need

    def _take_blocks(self, seq: Seq, count: int) -> None:
        """Give ``seq`` ``count`` fresh blocks now, or with SEMANTICS H9p when the step's
        lookups are done (``count`` of them must be free)."""
        if self._deferred is not None:
            self._deferred.append((seq, count))
            return
        blocks = self.pool.allocate(count)
        assert blocks is not None
        seq.blocks.extend(blocks)

    def _look_at_waiting(self) -> None:
        """SEMANTICS H9m (``SchedulePolicy.calc_priority``): a pass that can admit (a
        running slot free, or a request mid-prefill) looks at the waiting queue; every
        32nd such pass refreshes the first 128 waiting requests' cached prefixes, the
        head last (``_touch_waiting_prefixes``)."""
        mid_prefill = any(seq.phase is Phase.PREFILL for seq in self.running)
        full = len(self.running) >= self.config.max_num_seqs or self._admission_paused
        if full and not mid_prefill:
            return  # SGLang's batch is full: it returns before ordering the queue
        looks = self._waiting_looks
        self._waiting_looks += 1
        if looks % WAITING_REFRESH_INTERVAL:
            return
        for seq in reversed(list(islice(self.waiting, WAITING_REFRESH_MAX))):
            self._refresh_prefix(seq)

    def _refresh_prefix(self, seq: Seq) -> None:
        """``touch_waiting_prefix``: the match of ``seq``'s whole prefill (no limit)
        refreshes the checkpoint it ends at and the free KV blocks before it."""
        self._hash_prefill(seq)
        assert seq.hashed is not None
        present = self.pool.match(seq.digests)
        hit = reconcile(
            self.index,
            self._namespace,
            seq.hashed,
            seq.prefill_len + 1,
            present,
            self._block,
            paged=self._paged,
        )
        if hit is not None:
            self.pool.refresh(seq.digests[: hit.tokens // self._block])

    def _hash_prefill(self, seq: Seq) -> None:
        """Hash what ``seq``'s prefill computes, once: its prompt, or for a resumed request
        (SEMANTICS H9g) the first ``prefill_len`` tokens of its answer; and the digests of
        its full blocks."""
        if seq.hashed is None:
            request = seq.request
            source = request.answer if seq.resumed else request.prompt  # type: ignore[attr-defined]
            seq.hashed = source.hashed(self._namespace, self.config.unit)
            seq.digests = block_digests(
                seq.hashed, seq.prefill_len // self._block, self._units_per_block
            )

    def _decode_tokens(self, seq: Seq) -> int:
        """Tokens ``seq`` verifies in a decode step: 1 + speculative, fewer near its end."""
        return 1 + max(0, min(self.config.spec_tokens, seq.output_tokens - seq.generated - 1))

    def _grow(self, seq: Seq, tokens: int, plan: StepPlan, captures: int = 0) -> bool:
        """Give ``seq`` blocks for ``tokens`` tokens (and, with ``state_handover``, the
        pages of the state it leaves when its state moves to a new block), preempting
        running requests (:meth:`_preemption_victim`) if needed; ``False`` when ``seq``
        itself was preempted, or waits.
        ``captures`` more pages must be free afterwards (``required_captures``: the
        chunk's checkpoints, which its planning reserves)."""
        need = max(0, -(-tokens // self._block) - len(seq.blocks))
        moves = self._handover and self._state_moves(seq, tokens)
        # It leaves its own running state (held for the step), or a checkpoint its
        # running state's pages went to (it takes new ones for good).
        handover = moves and seq.computed != seq.tracked
        retake = moves and seq.state_lent
        pages = need + ((handover + retake) * self._slot_pages if moves else 0) + captures
        if pages == 0:
            return True
        while pages > self._free_blocks():
            victim = self._preemption_victim(seq)
            if victim is None:
                return False  # SGLang: a prefill chunk waits for the decodes
            self._preempt(victim, plan)
            if victim is seq:
                return False
        if need:
            self._take_blocks(seq, need)
        if handover:
            self._take_handover(seq, plan)
        if retake:
            self._take_back_running_state(seq)
            self._leave_lent(seq, plan)
        return True

    def _preemption_victim(self, seq: Seq) -> Seq | None:
        """The running request :meth:`_grow` preempts when ``seq`` finds too few free
        pages; ``None``: ``seq`` waits for a later step instead (SEMANTICS H9g).

        ``preemption_policy = "youngest"``: the youngest running request. ``"sglang"``
        (``ScheduleBatch.retract_decode`` with ``_get_decode_retraction_order``,
        ``retraction_policy = "length"``): for a decode, the decoding request with the
        fewest output tokens, the longest prompt among those, the youngest among those;
        a prefill chunk never retracts anyone and waits while a request decodes. Where
        SGLang would abort its last decoding request (or has no decodes to retract for a
        chunk), the youngest running request is preempted: SGLang's admission, which
        reserves room for the running requests' outputs (``decode_reservation``),
        rarely gets there (docs/SEMANTICS.md H9g)."""
        if self._sglang_retraction:
            decoding = [other for other in self.running if other.phase is Phase.DECODE]
            if seq.phase is not Phase.DECODE and decoding:
                return None
            if len(decoding) > 1:
                # min() keeps the first of equals: over the reversed list, the youngest.
                return min(reversed(decoding), key=_retraction_key)
        return self.running[-1]

    def _chunk_end(self, seq: Seq, start: int, budget: int, stops: tuple[int, ...]) -> int:
        """Where a prefill chunk of ``seq`` from ``start`` ends with ``budget`` tokens left
        in the step: ``min(prefill_len, start + budget)``. With ``block_aligned_chunks``
        (vLLM's align mode, ``Scheduler._mamba_block_aligned_split``) a chunk that does not
        finish the prefill ends on a block boundary (``start`` itself, an empty chunk, when
        less than a block is left), a resumed request's chunk stops where vLLM's does
        (:meth:`_resumed_stop`), and a chunk stops at a branch point of the request inside
        it (the junction where its prompt leaves the cached KV)."""
        total = seq.prefill_len
        end = min(total, start + budget)
        if not self._aligned_chunks:
            return end
        # vLLM splits up to its prefill's end, which for a resumed request is the last
        # token it had sampled (num_tokens - 1): that token's step is a decode's.
        prefill_end = total - 1 if seq.resumed else total
        if end < prefill_end:
            end = max(start, end // self._block * self._block)
        if seq.resumed:
            end = self._resumed_stop(seq, start, end)
        return min((stop for stop in stops if start < stop < end), default=end)

    def _resumed_stop(self, seq: Seq, start: int, end: int) -> int:
        """SEMANTICS H9g: a resumed request's chunk ``[start, end)`` stops at the last
        block boundary below its last token, ``L = floor((N - 1)/B)*B`` (``N =
        prefill_len``, vLLM's ``num_tokens``), unless the chunk exports the prefill
        checkpoint from inside, at ``floor((N - 2)/B)*B`` (its prefill ends at ``N - 1``):
        ``last_cache_position`` and ``use_internal_checkpoint`` in
        ``Scheduler._mamba_block_aligned_split``, ``is_mamba_prefill_checkpoint_valid``.
        For a request that was not preempted the two positions are equal and the stop
        never applies (a chunk holding it exports it)."""
        block, total = self._block, seq.prefill_len
        last = (total - 1) // block * block
        checkpoint = (total - 2) // block * block
        exported = (
            end >= total - 1
            and start % block == 0
            and start + block <= checkpoint
            and start < checkpoint < end
        )
        return last if not exported and start < last < end else end

    def _state_moves(self, seq: Seq, tokens: int) -> bool:
        """``state_handover`` (SEMANTICS H9a): computing ``seq`` from ``seq.computed`` up
        to ``tokens`` takes its state into a new block."""
        block, computed = self._block, seq.computed
        return computed > 0 and -(-tokens // block) > -(-computed // block)

    def _admit(self, seq: Seq, budget: int, plan: StepPlan) -> int:
        """Admit the head of the queue if its first chunk fits; tokens scheduled (0 = not)."""
        if not self._free_batch or self._free_blocks() <= 0:
            return 0
        block, n = self._block, seq.prefill_len
        request = seq.request
        self._hash_prefill(seq)
        assert seq.hashed is not None
        self.checker.request_id = request.request_id
        if seq.admissions == 0:
            self._before_first_lookup(seq)
        present = self.pool.match(seq.digests)
        hit = reconcile(
            self.index, self._namespace, seq.hashed, n, present, block, paged=self._paged
        )
        p = hit.tokens if hit is not None else 0
        if self._lookup_refreshes and p:
            # SEMANTICS H9q: SGLang's match stamps the path before PrefillAdder decides;
            # an admitted request takes these blocks out of the free queue anyway.
            self.pool.refresh(seq.digests[: p // block])
        # Blocks of [0, p) still cached are shared. Without paged attention a hit is not
        # limited by the KV pool (its blocks hold nothing the model reads), so some of
        # them may have been reused since: those come fresh, like the chunk's.
        shared = min(p // block, present)
        # SEMANTICS H9j (PrefillAdder.add_one_req): its uncached prompt, its output and a
        # page must fit in what the running requests' reservations leave, its own hit
        # not counted as evictable (SGLang locks the matched node while it checks). Into
        # an empty engine a request that fits the pool alone goes (SGLang clips its
        # output to the pool instead, max_new_tokens_for_memory).
        if self._reserve_decodes and (self.running or plan.prefills):
            own_cached = self.pool.free_among(seq.digests[:shared]) * block
            if not admits(seq, p, self._decode_room(plan), own_cached):
                # SEMANTICS H9o (PrefillAdder's NO_TOKEN sets batch_is_full). It is a
                # flag of SGLang's running (decoding) batch: with none decoding, the
                # flagged batch is empty and the next step's running batch is a new
                # one (this step's prefill batch), so the pause ends with this step.
                self._admission_paused = self._pause_after_refusal and self._any_decoding()
                return 0
        branch = self._hints(request, "branch_points")
        cached_end = present * block
        if p < cached_end < n and cached_end not in branch:
            branch = (*branch, cached_end)
        if self._drop_leaf_kv and present and cached_end < n:
            self._split_at_match_end(seq, present)
        end = self._chunk_end(seq, p, budget, branch)
        if end == p:  # an aligned chunk needs a block of budget: wait for the next step
            return 0
        # The pages for the chunk, or the request's running states, may come from
        # evicting checkpoints: not this one.
        pinned = None
        if hit is not None and (self._unified or self._states_per_running > 0):
            pinned = hit.slot
            self.index.pin(pinned)
            if self._unified:
                self._ledger.pin(pinned)
        if (self._required_captures or self._admit_full_prompt) and not self._admission_fits(
            seq, p, shared, end, branch
        ):
            if pinned is not None:
                self._unpin(pinned)
            return 0
        # SEMANTICS H9: with split memory the running states come first (SGLang takes the
        # request's Mamba slot at its lookup, before the chunk's KV); with unified memory
        # the chunk's pages do (vLLM allocates the attention group's blocks first).
        states = self._states_per_running
        states_first = states > 0 and not self._unified
        blocks: list[int] | None = None
        if not states_first or self._take_running_states():
            blocks = self._admit_blocks(seq, shared, -(-end // block) - shared)
            if blocks is None and states_first:
                self._give_back_running_states(seq)
            elif (
                blocks is not None
                and states
                and not states_first
                and not self._take_running_states()  # last: it takes them
            ):
                self.pool.release(blocks)  # nothing evictable holds the states: wait
                blocks = None
        if blocks is None:
            if pinned is not None:
                self._unpin(pinned)
            return 0
        self.waiting.popleft()
        seq.batch_slot = self._free_batch.pop()
        self.running.append(seq)
        seq.phase = Phase.PREFILL
        seq.blocks = blocks
        seq.computed = p
        seq.registered = shared
        seq.hit_tokens = p
        seq.tracked = p
        seq.admissions += 1
        metrics = self.metrics
        if seq.admissions == 1:
            metrics.requests_admitted += 1
            metrics.prompt_tokens += n
            if seq.after_warmup:
                metrics.warm_requests += 1
                metrics.warm_prompt_tokens += n
        seq.generated = seq.resumed
        # The hit itself is counted when its restore is issued (_issue_restores).
        seq.branch_points = branch
        self.backend.start(seq.started(), seq.batch_slot)
        if hit is not None:
            seq.hit_slot = hit.slot
            if self._hold_latest:  # SEMANTICS H9l: it holds its hit while it runs
                self._hold_latest_checkpoint(seq, hit.slot, p)
            if self._unified:  # pinned above
                self._ledger.touch(hit.slot, self._shared_pool.tick())
            elif pinned is None:
                self.index.pin(hit.slot)
            plan.restores.append(seq)
        else:
            seq.hit_slot = -1
        self._plan_chunk(seq, p, end, plan)
        return end - p

    def _admit_blocks(self, seq: Seq, shared: int, fresh: int) -> list[int] | None:
        """Share the cached blocks of ``seq``'s first ``shared`` block digests and take
        ``fresh`` more (:meth:`KVPool.admit`); with SEMANTICS H9p the fresh ones are
        promised (:meth:`_take_blocks`) and the list holds the shared ones only.
        ``None`` (nothing changed) when they are not free."""
        digests = seq.digests[:shared]
        if self._deferred is None:
            return self.pool.admit(digests, fresh)
        if fresh > self._free_blocks() - self.pool.free_among(digests):
            return None
        blocks = self.pool.admit(digests, 0)
        assert blocks is not None
        self._take_blocks(seq, fresh)
        return blocks

    def _admission_fits(
        self, seq: Seq, hit: int, shared: int, end: int, branch: tuple[int, ...]
    ) -> bool:
        """SEMANTICS H9e: whether the pages admitting ``seq`` with a hit at ``hit``
        (``shared`` cached blocks) needs are free: its first chunk's, ending at ``end``,
        with its checkpoints (``required_captures``), and those of its whole prompt as one
        chunk with no junction (``admit_full_prompt``), as vLLM counts them."""
        free = self._free_blocks()
        pages = self.pool.free_among(seq.digests[:shared]) - shared
        if self._unified:
            pages += self._states_per_running * self._slot_pages
        if self._required_captures:
            chunk = -(-end // self._block) + self._capture_pages(seq, hit, end, branch)
            if pages + chunk > free:
                return False
        if self._admit_full_prompt:
            whole = -(-seq.prefill_len // self._block)
            if self._required_captures:
                whole += self._capture_pages(seq, hit, seq.prefill_len, (), whole=True)
            if pages + whole > free:
                return False
        return True

    def _capture_pages(
        self, seq: Seq, start: int, end: int, branch: tuple[int, ...], *, whole: bool = False
    ) -> int:
        """``required_captures`` (SEMANTICS H9e): the pages of the checkpoints placement
        puts in chunk ``[start, end)`` of ``seq`` (junctions ``branch``) that take pages of
        their own: all but the one at ``end`` its running state becomes
        (``state_handover``), and a resumed request's transient prefill checkpoint
        (:meth:`_transient_checkpoint`). ``whole``: its whole prefill as one chunk of a
        prompt that long, as vLLM's full-sequence admission check counts it."""
        positions = self._positions(seq, start, end, branch, whole=whole)
        # The state is lent at the chunk's end unless it is lent already and stays put.
        lent = self._handover and (not seq.state_lent or self._state_moves(seq, end))
        count = len(positions) - (lent and end in positions)
        count += self._transient_checkpoint(seq, start, end, positions)
        return count * self._slot_pages

    def _transient_checkpoint(
        self, seq: Seq, start: int, end: int, positions: tuple[int, ...]
    ) -> bool:
        """``required_captures`` (SEMANTICS H9g): whether a resumed request's chunk
        ``[start, end)`` gets a prefill-checkpoint block (:meth:`_internal_checkpoint`)
        that no kept position is: beyond the prompt's retained boundary vLLM does not keep
        the state (``_cache_partial_tail_block`` evicts it), but its block is held for
        the step."""
        internal = self._internal_checkpoint(seq, start, end)
        return internal > 0 and internal not in positions

    def _internal_checkpoint(self, seq: Seq, start: int, end: int) -> int:
        """``required_captures`` (SEMANTICS H9g): the position of the state a resumed
        request's chunk ``[start, end)`` exports from inside, or 0. vLLM's allocation keys
        it on the chunk's end, ``p = floor((end - 1)/B)*B``, for a chunk reaching its
        prefill's end (``N - 1``) that can export it (``MambaManager.
        get_num_blocks_to_allocate``, ``_needs_internal_checkpoint``,
        ``is_mamba_prefill_checkpoint_valid``)."""
        if not (self._required_captures and seq.resumed):
            return 0
        block = self._block
        if end < seq.prefill_len - 1:
            return 0
        p = (end - 1) // block * block
        exported = start % block == 0 and start + block <= p and start < p < end
        return p if exported else 0

    def _split_at_match_end(self, seq: Seq, present: int) -> None:
        """``drop_leaf_kv`` (SEMANTICS H10): a lookup whose cached KV (``present`` full
        blocks of ``seq``'s prompt) ends where a cached sequence goes on (another block
        continues the last one matched) makes a node boundary where the prompt leaves
        that sequence, to the token (inside the next block when the prompt shares its
        first tokens with a cached continuation; SGLang matches up to the prompt's last
        token but one), as SGLang's match splits the radix node it stops inside
        (``UnifiedTreeCore._match_prefix_helper``)."""
        pool, hashed = self.pool, seq.hashed
        assert isinstance(pool, LeafKVPool) and hashed is not None
        last = seq.digests[present - 1]
        if not pool.children(last):
            return
        end = present * self._block
        limit = min(end + self._block, seq.prefill_len - 1)
        tokens = hashed.token_bytes(end, limit)
        shared = pool.shared_past(last, tokens)
        at = hashed.digest(end + shared) if shared else last
        pool.split_at(last, at, end + shared, tokens[:TOKEN_BYTES] if shared else None)

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

    def _plan_chunk(self, seq: Seq, start: int, end: int, plan: StepPlan) -> None:
        """Plan chunk ``[start, end)`` of ``seq`` and reserve the checkpoints inside it
        (with SEMANTICS H9p once the step's KV blocks are allocated)."""
        from_checkpoint = 0 < start == seq.tracked
        positions = self._positions(seq, start, end, seq.branch_points)
        if positions:
            seq.tracked = max(seq.tracked, *positions)
        chunk = _Chunk(start, end, [], from_checkpoint)
        if positions and self._deferred is not None:
            self._deferred_captures.append((seq, chunk, positions))
        elif positions:
            chunk.reservations = self._reserve_chunk(seq, end, positions)
        if self._transient_checkpoint(seq, start, end, positions):
            self._take_handover(seq, plan)  # its block, held for the step (H9g)
        plan.prefills[seq] = chunk

    def _reserve_chunk(self, seq: Seq, end: int, positions: tuple[int, ...]) -> list[Reservation]:
        """Reserve the checkpoints at ``positions`` of ``seq``'s chunk ending at ``end``;
        the reservations made, in ascending order."""
        request = seq.request
        reservations: list[Reservation] = []
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
        limit = not self.config.capture_all  # vLLM keeps every reachable boundary
        for position in sorted(positions, key=lambda p: (p not in shared, -p)):
            metrics.captures_planned += 1
            if (
                limit
                and reservations
                and position not in shared
                and not self._room_without_eviction()
            ):
                metrics.captures_skipped_full += 1
                continue
            lend = self._handover and position == end and not seq.state_lent
            if lend:
                self._lend_running_state(seq)
            outcome = self._reserve(seq.hashed, position)
            if outcome is not None:
                reservations.append(outcome)
                if lend:
                    self._hold_lent(seq, outcome.slot)
                elif self._hold_until_turn:
                    self._capture_holders[outcome.slot] = seq
                if self._hold_latest:
                    self._latest_writers[outcome.slot] = (seq, position)
            elif lend:
                self._take_back_running_state(seq)
        reservations.sort(key=_tokens)  # ascending: the order the backend computes them
        return reservations

    def _positions(
        self, seq: Seq, start: int, end: int, branch: tuple[int, ...], *, whole: bool = False
    ) -> tuple[int, ...]:
        """The positions placement chooses in chunk ``[start, end)`` of ``seq`` (junctions
        ``branch``). Placement sees the prompt: a resumed request's chunk (SEMANTICS H9g)
        is cut at the prompt's end, and one wholly past it holds no checkpoint, as vLLM
        keeps the states of ``replay_boundaries(num_prompt_tokens)``; with
        ``required_captures`` only those at the chunk's end and at the position it exports
        from inside. ``whole``, or ``preemption_policy = "sglang"`` (SGLang refills the
        prompt and the output as one sequence): the chunk is seen as part of a prompt of
        ``prefill_len`` tokens."""
        # SGLang re-prefills origin_input_ids + output_ids like any prompt (fill_ids).
        whole_fill = whole or self._sglang_retraction
        prompt_len = seq.prefill_len if whole_fill else seq.prompt_len
        cut = min(end, prompt_len)
        if start >= cut:
            return ()
        chunk = PrefillChunk(
            start=start,
            end=cut,
            prompt_len=prompt_len,
            turn_starts=self._hints(seq.request, "turn_starts"),
            branch_points=branch,
        )
        positions = self.placement.positions(chunk)
        if seq.resumed and self._required_captures and not whole:
            # vLLM's align mode keeps a resumed chunk's state at its end (the running
            # block) and the one it exports from inside, no other (SEMANTICS H9g).
            internal = self._internal_checkpoint(seq, start, end)
            positions = tuple(p for p in positions if p in (end, internal))
        return positions

    def _hints(self, request: RequestLike, name: str) -> tuple[int, ...]:
        """The request's workload hint ``name`` (``branch_points``, ``turn_starts``), or
        nothing when the engine is not told the workload's structure."""
        if not self.config.workload_hints:
            return ()
        return tuple(getattr(request, name, ()))

    def _room_without_eviction(self) -> bool:
        """A checkpoint can be reserved without evicting anything."""
        if self.index.free_count() <= (0 if self._unified else self._running_states_held):
            return False
        return not self._unified or self._shared_pool.fresh_count() >= self._slot_pages

    def _preempt(self, seq: Seq, plan: StepPlan) -> None:
        """Free ``seq``'s blocks and batch slot, undo its plan, requeue it (at the head;
        with ``preemption_policy = "sglang"`` at the back)."""
        self._batch_changed = True  # SEMANTICS H9o: the running batch shrinks
        self._check_progress()
        self.metrics.preemptions += 1
        answered = self._has_answer(seq)
        # SGLang frees a retracted request's KV without inserting it into the tree.
        cache_decoded = self._cache_generated and not self._sglang_retraction
        if cache_decoded and seq.phase is Phase.DECODE and answered:
            # SEMANTICS H9g: the blocks its decode filled are cached, as vLLM caches them
            # when they fill (what is freed stays registered).
            answer = seq.request.answer  # type: ignore[attr-defined]
            hashed = answer.hashed(self._namespace, self.config.unit)
            cached = seq.tracked if self.config.kv_up_to_checkpoint else seq.computed
            self._register_answer_blocks(seq, hashed, cached)
        if self._resume_output and seq.generated and answered:
            # SEMANTICS H9g: it keeps its output and prefills it again when readmitted.
            seq.resumed = seq.generated
            seq.hashed, seq.digests = None, ()
        else:
            self.metrics.discarded_decode_tokens += seq.generated  # decoded again
            seq.resumed = 0
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
        if self._deferred is not None:  # SEMANTICS H9p: its promised blocks go back
            self._deferred = [(s, n) for s, n in self._deferred if s is not seq]
            self._deferred_captures = [c for c in self._deferred_captures if c[0] is not seq]
        if self._states_per_running:
            self._give_back_running_states(seq)
        self._let_go_of_holds(seq)
        if plan.handovers or plan.lent_held:
            self._end_handovers(plan, seq)
        self.backend.release(seq.request_id, seq.batch_slot)
        self._free_batch.append(seq.batch_slot)
        seq.batch_slot = -1
        seq.phase = Phase.WAITING
        seq.computed = seq.generated = seq.registered = seq.hit_tokens = 0
        seq.hit_slot = -1
        if self._sglang_retraction:
            self.waiting.append(seq)  # SGLang: _add_request_to_queue, at the back
        else:
            self.waiting.appendleft(seq)

    @staticmethod
    def _has_answer(seq: Seq) -> bool:
        """Whether the workload gives ``seq``'s output tokens (its ``answer``), which a
        resumed prefill recomputes."""
        answer = getattr(seq.request, "answer", None)
        return answer is not None and len(answer) >= seq.prompt_len + seq.generated
