"""hyckpt's ``CheckpointIndex`` over SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + MAMBA).

Built by :func:`engines.sglang_adapter.make_index` (which imports SGLang); this module
imports nothing of SGLang itself. A checkpoint is a node of SGLang's radix tree whose
MAMBA component holds a Mamba pool index; its hyckpt slot is that index, shifted so that
SGLang's first real slot (1; 0 is the dummy) is ``first_slot``. Every SGLang file below is
under ``sglang/srt/mem_cache/``.

==================  =========================================================================
hyckpt              SGLang 0.5.23
==================  =========================================================================
key                 ``RadixKey(tokens, extra_key=json(namespace), cache_salt=json(extras))``
                    (``radix_cache.py``); the hyckpt digest (``make_key``) is the adapter's
lookup              ``UnifiedRadixCache.match_prefix(MatchPrefixParams(key=prompt[:upper]))``
                    with ``upper = min(maximum, len(prompt))``: ``device_prefix_len`` and the
                    MAMBA value of ``best_match_node``; a hit needs ``> minimum``. SGLang has
                    no minimum: the match refreshes the node it found in any case
                    (``UnifiedTreeCore._match_post_processor``, ``MambaComponent.refresh_lru``)
reserve             published? ``tree_core.match_full_device_prefix`` (read-only) ends at
                    ``tokens`` on a node with a MAMBA value -> ``touch_prefix`` (the hit's
                    refresh) and ``AlreadyCached``; else a slot from
                    ``MambaComponent._alloc_mamba_slot`` (``mamba_allocator.alloc(1)``, else
                    ``evict_for_alloc(EvictParams(mamba_num=1))`` and again; its assertion
                    "Can not alloc mamba cache" is ``NoSlot``)
publish             ``UnifiedRadixCache.insert(InsertParams(key, value=<fresh KV indices>,
                    mamba_value=[slot]))``, what ``checkpoint_into_tree`` does for a chunk;
                    the insert frees the KV indices the tree already has
                    (``UnifiedTreeCore._insert_overlap_step``)
abort               ``mamba_allocator.free([slot])``, as releasing an aborted request frees its
                    Mamba slot (``HybridReqToTokenPool.free_mamba_cache``)
pin / unpin         ``inc_lock_ref(node)`` / ``dec_lock_ref(node, receipt)``: FULL locked up to
                    the root, MAMBA on the node (``MambaComponent.acquire_component_lock``)
eviction            SGLang's, inside ``evict_for_alloc``: the MAMBA LRU list's least recent
                    unlocked state; a leaf goes whole, an inner node keeps its FULL KV
free_count          ``mamba_allocator.available_size()``
slot_state          PUBLISHED: in ``tree_core.all_mamba_values_flatten()``; FREE: in the
                    allocator's free list; RESERVED: the adapter's open reservations
==================  =========================================================================

The adapter's own code, where SGLang has no counterpart: argument checks and typed errors
(SGLang asserts), the reservation handles (SGLang's "reservation" is a running request's
Mamba slot; two requests with one prompt both compute and the second insert finds
``mamba_exist``, so "being written" answers come from the adapter's table of open
reservations), the receipts of pins (kept per slot, replayed by ``unpin``), the KV
indices a publish inserts (SGLang's request would have computed them), and the hyckpt
digests. Not provided: ``invalidate``/``clear`` (SGLang resets the whole tree only). The
argument checks and the table of open reservations are the ones the vLLM adapter uses too
(:mod:`engines.index_common`).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from typing import Any, NoReturn

from engines.index_common import OpenReservations, SlotRange
from reference.api import (
    AlreadyCached,
    CheckpointKey,
    EntryCost,
    LookupHit,
    NoSlot,
    PromptLike,
    Reservation,
    ReservationState,
    ReserveOutcome,
    SlotState,
    check_count,
)
from reference.errors import (
    AllocationTooLargeError,
    CapabilityMissingError,
    PinUnderflowError,
    SlotStateError,
)
from reference.hashing import HashedPrompt
from reference.index import (
    check_lookup_range,
    check_reserve_tokens,
    hashed_prompt,
    prompt_key,
)

#: SGLang's Mamba pool index of the first real slot (0 is the dummy write target).
SGLANG_FIRST_MAMBA_INDEX = 1


@dataclass(eq=False)
class _Open:
    """An open reservation's record: what publish needs to insert it."""

    tokens: list[int]
    extra_key: str
    cache_salt: str | None
    cost: EntryCost | None


@dataclass
class _Pins:
    """The node a pinned slot's checkpoint sits on and one lock receipt per pin."""

    node: Any
    receipts: list[Any] = field(default_factory=list)


class SglangIndex(SlotRange):
    """A hyckpt index driving one SGLang ``UnifiedRadixCache`` (see the module table)."""

    def __init__(
        self,
        sglang: Any,
        capacity: int,
        *,
        first_slot: int,
        hash_unit: int,
        bytes_per_slot: int,
        tree_core: str | None,
        kv_tokens: int,
    ) -> None:
        super().__init__(capacity, first_slot, hash_unit)
        self._sg = sglang
        self._bytes_per_slot = bytes_per_slot
        self._open: OpenReservations[_Open] = OpenReservations(invalidation=False)
        self._node_of: dict[int, Any] = {}  # slot -> node id it was published on
        self._pins: dict[int, _Pins] = {}
        self._build(capacity, kv_tokens, tree_core)

    def _build(self, capacity: int, kv_tokens: int, tree_core: str | None) -> None:
        """The pools and the cache, as SGLang's own CPU tests build them (one Mamba2
        layer 0 with the smallest state, one full-attention layer 1, fp16 KV of one head
        of dimension 1)."""
        sg = self._sg
        torch = sg.torch
        ct = sg.component_type
        shape = sg.mamba2_state_shape.create(
            tp_world_size=1,
            intermediate_size=2,
            n_groups=1,
            num_heads=1,
            head_dim=2,
            state_size=1,
            conv_kernel=2,
        )
        cache_params = sg.mamba2_cache_params(shape=shape, layers=[0])
        self._req_to_token_pool = sg.hybrid_req_to_token_pool(
            size=1,
            mamba_size=capacity,
            mamba_spec_state_size=1,
            max_context_len=8,
            device="cpu",
            enable_memory_saver=False,
            cache_params=cache_params,
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False,
            speculative_num_draft_tokens=None,
        )
        kv_pool = sg.hybrid_linear_kv_pool(
            size=kv_tokens,
            dtype=torch.float16,
            page_size=1,
            head_num=1,
            head_dim=1,
            full_attention_layer_ids=[1],
            device="cpu",
            enable_memory_saver=False,
            mamba_pool=self._req_to_token_pool.mamba_pool,
        )
        self._kv_allocator = sg.token_to_kv_pool_allocator(
            size=kv_tokens, dtype=torch.float16, device="cpu", kvcache=kv_pool, need_sort=False
        )
        self.cache = sg.unified_radix_cache(
            sg.cache_init_params(
                disable=False,
                req_to_token_pool=self._req_to_token_pool,
                token_to_kv_pool_allocator=self._kv_allocator,
                page_size=1,
                tree_components=(ct.FULL, ct.MAMBA),
                enable_mamba_extra_buffer=False,
                eviction_policy="lru",
                tree_core_backend=tree_core,
            )
        )
        self._mamba_allocator = self._req_to_token_pool.mamba_allocator
        self._mamba = self.cache.components[ct.MAMBA]
        self._MAMBA = ct.MAMBA

    # --- properties ---------------------------------------------------------------------

    @property
    def tree_core_name(self) -> str:
        """The class of SGLang's tree core in use (``RustUnifiedTreeCore`` or
        ``UnifiedTreeCore``)."""
        return type(self.cache.tree_core).__name__

    # --- slots --------------------------------------------------------------------------

    def _to_sglang(self, slot: int) -> int:
        return slot - self._first + SGLANG_FIRST_MAMBA_INDEX

    def _to_slot(self, index: Any) -> int:
        return int(index) - SGLANG_FIRST_MAMBA_INDEX + self._first

    def _published_slots(self) -> set[int]:
        values = self.cache.tree_core.all_mamba_values_flatten()
        return {self._to_slot(v) for v in values.tolist()}

    def _reserved_slots(self) -> set[int]:
        return self._open.slots()

    def free_count(self) -> int:
        """``MambaSlotAllocator.available_size()``: slots in SGLang's free list."""
        return int(self._mamba_allocator.available_size())

    def slot_state(self, slot: int) -> SlotState:
        """Where the slot is: SGLang's tree, the adapter's open reservations, or SGLang's
        free list. A slot in none of them is a leak, reported as an error."""
        self._check_slot(slot)
        if slot in self._reserved_slots():
            return SlotState.RESERVED
        if slot in self._published_slots():
            return SlotState.PUBLISHED
        index = self._to_sglang(slot)
        if index in set(self._mamba_allocator.free_slots.tolist()):
            return SlotState.FREE
        raise SlotStateError(
            f"slot {slot} (SGLang Mamba index {index}) is neither in SGLang's free list, nor "
            "held by its tree, nor reserved: it leaked"
        )

    def pins(self, slot: int) -> int:
        self._check_slot(slot)
        held = self._pins.get(slot)
        return 0 if held is None else len(held.receipts)

    # --- keys ---------------------------------------------------------------------------

    def hashed(
        self, namespace: str, prompt: PromptLike, extras: tuple[str, ...] = ()
    ) -> HashedPrompt:
        """``prompt`` as a :class:`HashedPrompt` for this index (checked if it already is one)."""
        return hashed_prompt(prompt, namespace, extras, self._unit)

    def make_key(
        self, namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...] = ()
    ) -> CheckpointKey:
        return prompt_key(namespace, prompt, tokens, extras, self._unit)

    def _radix_key(self, namespace: str, extras: tuple[str, ...], tokens: list[int]) -> Any:
        """SGLang's key: the tokens, the namespace as ``extra_key`` and the extras as
        ``cache_salt`` (both namespace the tree, ``radix_cache.py::RadixKey``)."""
        return self._sg.radix_key(
            array("q", tokens), json.dumps(namespace), cache_salt=_salt(extras)
        )

    # --- lookup -------------------------------------------------------------------------

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None:
        """``match_prefix`` on ``prompt[:min(maximum, len(prompt))]``; a hit if the
        deepest node whose FULL and MAMBA values are both present lies past ``minimum``."""
        check_lookup_range(minimum, maximum)
        hashed = self.hashed(namespace, prompt, extras)
        upper = min(maximum, len(hashed))
        if upper == 0:
            return None
        key = self._radix_key(namespace, extras, hashed.tokens()[:upper])
        result = self.cache.match_prefix(self._sg.match_prefix_params(key=key))
        tokens = int(result.device_prefix_len)
        value = self.cache.tree_core.get_component_device_value(result.best_match_node, self._MAMBA)
        if value is None or not minimum < tokens:
            return None
        return LookupHit(tokens, self._to_slot(value.view(-1)[0]))

    # --- reserve / publish / abort ------------------------------------------------------

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: EntryCost | None = None,
    ) -> ReserveOutcome:
        """AlreadyCached from the tree or the open reservations, else a Mamba slot from
        ``MambaComponent._alloc_mamba_slot`` (evicting through SGLang when full)."""
        check_count("tokens", tokens, minimum=1)
        hashed = self.hashed(namespace, prompt, extras)
        check_reserve_tokens(tokens, len(hashed), cost)
        key = CheckpointKey(namespace, extras, hashed.digest(tokens), tokens)
        writing = self._open.writing(key)
        if writing is not None:
            return AlreadyCached(writing.slot, published=False)
        ids = hashed.tokens()[:tokens]
        radix_key = self._radix_key(namespace, extras, ids)
        cached = self._published_at(radix_key, tokens)
        if cached is not None:
            self.cache.touch_prefix(radix_key)
            return AlreadyCached(cached, published=True)
        index = self._alloc_mamba_slot()
        if index is None:
            return NoSlot(
                f"SGLang found no Mamba slot: all {self._capacity} are reserved or pinned "
                "(MambaComponent._alloc_mamba_slot evicted nothing)"
            )
        record = _Open(ids, json.dumps(namespace), _salt(extras), cost)
        return self._open.issue(key, self._to_slot(index), record)

    def _published_at(self, radix_key: Any, tokens: int) -> int | None:
        """The slot of the MAMBA value on the node ending exactly at ``tokens``, read
        without touching recency (``match_full_device_prefix``, "read-only FULL-device
        match")."""
        matched, node, whole = self.cache.tree_core.match_full_device_prefix(radix_key)
        if matched != tokens or whole != tokens:
            return None
        value = self.cache.tree_core.get_component_device_value(node, self._MAMBA)
        return None if value is None else self._to_slot(value.view(-1)[0])

    def _alloc_mamba_slot(self) -> int | None:
        """``MambaComponent._alloc_mamba_slot()`` (no request): its "Can not alloc mamba
        cache" assertion, after ``evict_for_alloc`` freed nothing, means no slot."""
        try:
            slot = self._mamba._alloc_mamba_slot()
        except AssertionError as error:
            if "Can not alloc mamba cache" not in str(error):
                raise
            return None
        return None if slot is None else int(slot.view(-1)[0])

    def publish(self, reservation: Reservation) -> bool:
        """Insert the key with its Mamba slot into SGLang's tree (a chunk's checkpoint).

        Raises:
            ForeignReservationError, AlreadyPublishedError, AlreadyAbortedError.
            AllocationTooLargeError: the FULL KV pool cannot hold the key's tokens even
                after SGLang's eviction (raise ``kv_tokens``); the reservation stays open.
        """
        entry = self._open.record(reservation, "publish")
        torch = self._sg.torch
        count = len(entry.tokens)
        kv = self._kv_allocator.alloc(count)
        if kv is None:
            self.cache.evict_for_alloc(self._sg.evict_params(num_tokens=count))
            kv = self._kv_allocator.alloc(count)
        if kv is None:
            raise AllocationTooLargeError(
                f"SGLang's FULL KV pool has no {count} free token slots for the key, even "
                "after evicting; build the index with a larger kv_tokens"
            )
        key = self._sg.radix_key(
            array("q", entry.tokens), entry.extra_key, cache_salt=entry.cache_salt
        )
        mamba_value = torch.tensor([self._to_sglang(reservation.slot)], dtype=torch.int64)
        result = self.cache.insert(
            self._sg.insert_params(key=key, value=kv, mamba_value=mamba_value)
        )
        self._open.close(reservation, ReservationState.PUBLISHED)
        if result.mamba_exist:
            # The node already had a state: SGLang keeps it and frees the new slot
            # (MambaComponent.cleanup_after_caching_req, not finished). Not reachable
            # through this index (reserve answers AlreadyCached), kept for safety.
            self._mamba._free_mamba_value(mamba_value)
            return True
        self._node_of[reservation.slot] = result.last_device_node
        return True

    def abort(self, reservation: Reservation) -> None:
        """Return the slot to SGLang's Mamba free list; the key never reached the tree."""
        self._open.record(reservation, "abort")
        torch = self._sg.torch
        self._mamba_allocator.free(
            torch.tensor([self._to_sglang(reservation.slot)], dtype=torch.int64)
        )
        self._open.close(reservation, ReservationState.ABORTED)

    # --- pins ---------------------------------------------------------------------------

    def pin(self, slot: int) -> int:
        """``inc_lock_ref`` on the node holding the slot's checkpoint; returns the count."""
        self._check_slot(slot)
        if slot not in self._published_slots():
            state = "reserved" if slot in self._reserved_slots() else "free"
            raise SlotStateError(
                f"cannot pin slot {slot}: it is {state}; pin only a slot returned by lookup"
            )
        node = self._node_of[slot]
        value = self.cache.tree_core.get_component_device_value(node, self._MAMBA)
        if value is None or self._to_slot(value.view(-1)[0]) != slot:
            raise SlotStateError(
                f"slot {slot} is in SGLang's tree but not on node {node}, where it was "
                "published: the adapter lost track of it"
            )
        held = self._pins.setdefault(slot, _Pins(node))
        held.receipts.append(self.cache.inc_lock_ref(node).to_dec_params())
        return len(held.receipts)

    def unpin(self, slot: int) -> int:
        """``dec_lock_ref`` with the receipt of the slot's latest pin."""
        self._check_slot(slot)
        held = self._pins.get(slot)
        if held is None or not held.receipts:
            raise PinUnderflowError(
                f"unpin of slot {slot} would take its pin count below zero; call unpin once "
                "per successful pin, after the restore's copy completed"
            )
        self.cache.dec_lock_ref(held.node, held.receipts.pop())
        left = len(held.receipts)
        if not left:
            del self._pins[slot]
        return left

    # --- not in SGLang ------------------------------------------------------------------

    def invalidate(self, key: CheckpointKey) -> bool:
        """Not provided: SGLang drops single keys only by evicting them."""
        _no_invalidation()

    def clear(self) -> None:
        """Not provided: ``UnifiedRadixCache.reset`` drops pinned entries at once."""
        _no_invalidation()


def _salt(extras: tuple[str, ...]) -> str | None:
    return json.dumps(list(extras)) if extras else None


def _no_invalidation() -> NoReturn:
    raise CapabilityMissingError(
        "SGLang's radix cache has no invalidation of one key, nor a clear that waits for "
        "readers (UnifiedRadixCache.reset drops everything at once); the SGLang adapter "
        "does not declare 'invalidate'"
    )
