"""vLLM 0.33's prefix cache as a hyckpt :class:`~reference.api.CheckpointIndex`.

``engines.vllm_adapter.make_index`` builds a :class:`VllmIndex`: every slot is one block
of a ``vllm.v1.core.block_pool.BlockPool`` of its own, used as the block pool of a
``MambaSpec`` group in ``mamba_cache_mode="align"`` (one block holds the state after
``(i + 1) * block_size`` tokens, and a hit needs that one block only, not the blocks
before it). What each operation calls (``vllm/v1/core/...``):

========================  ==============================================================
hyckpt                    vLLM 0.33.0
========================  ==============================================================
slot ``first_slot + k``   block id ``k + 1`` (block 0 is ``BlockPool.null_block``)
key digest                ``BlockHash`` of ``get_request_block_hasher`` /
                          ``hash_block_tokens`` (``kv_cache_utils.py``; sha256, the
                          default ``prefix_caching_hash_algo``); namespace and extras
                          are the request's ``cache_salt``
``lookup``                ``MambaManager.find_longest_cache_hit`` (classmethod,
                          ``single_type_kv_cache_manager.py``) up to
                          ``min(maximum, len(prompt))``; a hit above ``minimum`` is
                          used: ``BlockPool.touch`` then ``BlockPool.free_blocks``
``reserve``               ``BlockPool.get_cached_block`` (already cached: used as a
                          hit), else ``BlockPool.get_new_blocks(1)`` (pops the head of
                          ``FreeKVCacheBlockQueue``; a cached head is evicted by
                          ``_maybe_evict_cached_block``); ``ValueError`` -> ``NoSlot``
``publish``               ``BlockPool.cache_full_blocks`` then ``free_blocks`` (the
                          writer lets go; a cached block joins the queue's tail)
``abort``                 ``BlockPool.free_blocks`` of the uncached block (queue head)
``pin`` / ``unpin``       ``BlockPool.touch`` / ``BlockPool.free_blocks``
``invalidate``            ``BlockPool.get_cached_block`` + ``BlockPool.evict_blocks``
``clear``                 ``BlockPool.reset_prefix_cache`` (refuses while any block is
                          in use: then nothing changes)
``free_count``            blocks with ``ref_cnt == 0`` and no ``block_hash``
========================  ==============================================================

Block size and hash unit: vLLM keys a prefix only at multiples of ``hash_block_size``
(``CacheConfig.prefix_match_unit``: "the finest token boundary a prefix-cache hit can
land on"; ``request_block_hasher``: "We only hash full blocks"). With
``hash_block="unit"`` (``engines.vllm_adapter:implementation``) the hash block and the
Mamba block are ``hash_unit`` tokens, as vLLM is configured; a key off that grid does
not exist in vLLM, and ``make_key``/``reserve`` raise
:class:`~reference.errors.CapabilityMissingError`. With ``hash_block=1``
(``engines.vllm_adapter:implementation_token_hash``) vLLM hashes every token, so every
position is a key; ``hash_unit`` then only names which
:class:`~reference.hashing.HashedPrompt` the index accepts.

What is the adapter's own code, because vLLM has no equivalent (kept minimal; the parts
the SGLang adapter shares are in :mod:`engines.index_common`):

- argument checks (the typed errors of :mod:`reference.errors`); vLLM's internal API
  trusts its scheduler (``touch`` of a free block or ``free_blocks`` below zero do not
  raise);
- reservations: vLLM caches a request's blocks when it *allocates* them
  (``KVCacheManager.allocate_slots`` calls ``coordinator.cache_blocks`` before the forward
  pass), so it has no unpublished state. The adapter caches at ``publish`` instead and
  keeps the open reservations (:class:`engines.index_common.OpenReservations`),
  answering ``AlreadyCached(slot, False)`` for a key being written (what vLLM's own
  timing answers, as a hit) and cancelling a reservation invalidated during its write
  (its ``publish`` frees the block uncached and returns ``False``; ``clear`` never
  reaches one: ``reset_prefix_cache`` refuses while the writer holds the block);
- ``namespace``/``extras`` go into ``cache_salt`` (JSON of ``[namespace, *extras]``), which
  vLLM hashes into the first block only (``generate_block_hash_extra_keys``); chaining
  carries it to every later block.

What vLLM does otherwise, passed through as it is (docs/CONFORMANCE.md classifies the
suite's failures): ``get_new_blocks`` takes the free queue's head, not the lowest free
slot, and the head may be a live cached block while a block whose hash ``evict_blocks`` or
``reset_prefix_cache`` dropped waits further back (neither moves blocks in the queue);
``free_blocks`` prepends uncached blocks (LIFO reuse); a cached block's LRU position is
when its last reference was freed, so an ``unpin`` counts as a use; ``reset_prefix_cache``
changes nothing while any block is held.

Not driven: ``KVCacheManager``/``HybridKVCacheCoordinator``. Their
``find_longest_cache_hit`` needs the full-attention group to hit every block of the
prefix; a hyckpt index holds recurrent checkpoints only (the KV pages live elsewhere),
so the index is the Mamba group's part of that path, called directly.
"""

from __future__ import annotations

import difflib
import importlib
import itertools
import json
from array import array
from dataclasses import dataclass
from typing import Any

from engines.index_common import OpenReservations, SlotRange, check_index_counts
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
    ImplementationLoadError,
    InvalidConfigError,
    InvalidTokenCountError,
    PinUnderflowError,
    SlotStateError,
    UnknownPolicyError,
)
from reference.hashing import HashedPrompt
from reference.index import check_lookup_range, check_reserve_tokens, hashed_prompt

#: The only eviction order vLLM has: ``FreeKVCacheBlockQueue`` is LRU.
EVICTION_POLICIES = ("lru",)
#: The adapter's limit: ``BlockPool`` builds one ``KVCacheBlock`` per block up front.
MAX_CAPACITY = 2**24
#: ``CacheConfig.prefix_caching_hash_algo``'s default.
HASH_ALGO = "sha256"
#: KV cache group id of the Mamba group (the only group of the pool).
GROUP = 0

_requests = itertools.count()


@dataclass(frozen=True)
class VllmIndexCode:
    """The vLLM classes and functions the index calls, imported once."""

    block_pool: Any  # vllm.v1.core.block_pool.BlockPool
    mamba_manager: Any  # vllm.v1.core.single_type_kv_cache_manager.MambaManager
    mamba_spec: Any  # vllm.v1.kv_cache_interface.MambaSpec
    request: Any  # vllm.v1.request.Request
    sampling_params: Any  # one vllm.SamplingParams(max_tokens=1), shared
    block_hasher: Any  # vllm.v1.core.kv_cache_utils.get_request_block_hasher
    hash_fn: Any  # vllm.utils.hashing.get_hash_fn_by_name(HASH_ALGO)
    torch_float32: Any


_code: dict[str, VllmIndexCode] = {}


def load_index_code() -> VllmIndexCode:
    """Import vLLM's prefix-cache code and seed its ``NONE_HASH`` as ``EngineCore`` does
    (``init_none_hash``); raise ImplementationLoadError when it cannot be imported.
    The caller checks vLLM's version first (``engines.vllm_adapter.load_vllm``)."""
    if "code" in _code:
        return _code["code"]
    try:
        pool = importlib.import_module("vllm.v1.core.block_pool")
        managers = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        interface = importlib.import_module("vllm.v1.kv_cache_interface")
        request = importlib.import_module("vllm.v1.request")
        sampling = importlib.import_module("vllm.sampling_params")
        hashing = importlib.import_module("vllm.utils.hashing")
        torch = importlib.import_module("torch")
    except ImportError as error:
        raise ImplementationLoadError(
            f"vllm is installed but its prefix-cache code cannot be imported ({error}); "
            "build the engine venv with `bash scripts/engine-venv.sh`"
        ) from error
    hash_fn = hashing.get_hash_fn_by_name(HASH_ALGO)
    utils.init_none_hash(hash_fn)
    code = VllmIndexCode(
        block_pool=pool.BlockPool,
        mamba_manager=managers.MambaManager,
        mamba_spec=interface.MambaSpec,
        request=request.Request,
        sampling_params=sampling.SamplingParams(max_tokens=1),
        block_hasher=utils.get_request_block_hasher,
        hash_fn=hash_fn,
        torch_float32=torch.float32,
    )
    _code["code"] = code
    return code


@dataclass(eq=False)
class _Open:
    """An open reservation's record: the block a writer holds and the request that will
    cache it."""

    block: Any  # KVCacheBlock with ref_cnt 1 (the writer's), no hash yet
    request: Any  # vllm Request of prompt[:tokens]


def _token_ids(tokens: object) -> list[int]:
    """The prompt's token ids as a list (checked to be integers, as the reference does)."""
    try:
        return array("q", tokens).tolist()  # type: ignore[arg-type]
    except (TypeError, OverflowError) as error:
        raise InvalidTokenCountError(
            f"prompt tokens must be integers in the signed 64-bit range ({error}); "
            "pass a sequence of int token ids"
        ) from None


class VllmIndex(SlotRange):
    """A checkpoint index whose slots, keys, hits and evictions are a vLLM ``BlockPool``'s.

    Args:
        code: vLLM's classes (:func:`load_index_code`).
        capacity: slots (blocks besides the null block).
        first_slot: id of the first slot.
        hash_unit: tokens per hash unit of the suite.
        hash_block: ``"unit"`` (vLLM's ``hash_block_size`` and Mamba ``block_size`` are
            ``hash_unit``) or ``1`` (every token hashed; every position a key).
    """

    def __init__(
        self,
        code: VllmIndexCode,
        capacity: int,
        *,
        first_slot: int,
        hash_unit: int,
        hash_block: int,
    ) -> None:
        super().__init__(capacity, first_slot, hash_unit)
        self._code = code
        self._block_size = hash_block
        # BlockPool(num_gpu_blocks, enable_caching, hash_block_size): block 0 is the null
        # block (BlockPool.__init__ pops it), blocks 1..capacity are the slots.
        self._pool = code.block_pool(capacity + 1, enable_caching=True, hash_block_size=hash_block)
        self._spec = code.mamba_spec(
            block_size=hash_block,
            shapes=((1,),),
            dtypes=(code.torch_float32,),
            mamba_cache_mode="align",
        )
        self._hasher = code.block_hasher(hash_block, code.hash_fn)
        self._open: OpenReservations[_Open] = OpenReservations(invalidation=True)

    # --- properties ---------------------------------------------------------------------

    @property
    def block_pool(self) -> Any:
        """vLLM's ``BlockPool`` behind the index (read it; do not change it)."""
        return self._pool

    def free_count(self) -> int:
        """Blocks neither held (``ref_cnt``) nor cached (``block_hash``). vLLM's own
        ``get_num_free_blocks`` also counts cached blocks nobody holds (evictable)."""
        return sum(1 for b in self._pool.blocks[1:] if b.ref_cnt == 0 and b.block_hash is None)

    def slot_state(self, slot: int) -> SlotState:
        block = self._block(slot)
        opened = self._open.at(slot)
        if opened is not None:
            cancelled = opened.state is ReservationState.CANCELLED
            return SlotState.DOOMED if cancelled else SlotState.RESERVED
        if block.block_hash is not None:
            return SlotState.PUBLISHED
        # evict_blocks drops the hash of a held block; it is freed at its last free_blocks.
        return SlotState.DOOMED if block.ref_cnt > 0 else SlotState.FREE

    def pins(self, slot: int) -> int:
        """The block's ``ref_cnt``, less the writer's reference of an open reservation."""
        block = self._block(slot)
        return 0 if self._open.at(slot) is not None else block.ref_cnt

    # --- keys ---------------------------------------------------------------------------

    def make_key(
        self, namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...] = ()
    ) -> CheckpointKey:
        """The key of ``prompt[:tokens]``; its digest is vLLM's ``BlockHash`` there."""
        check_count("tokens", tokens)
        ids = self._prompt(namespace, prompt, extras)
        if tokens > len(ids):
            raise InvalidTokenCountError(f"tokens={tokens} exceeds the prompt length {len(ids)}")
        self._on_grid(tokens)
        if tokens == 0:
            return CheckpointKey(namespace, extras, b"", 0)
        request = self._request(namespace, extras, ids[:tokens])
        return CheckpointKey(namespace, extras, request.block_hashes[-1], tokens)

    # --- lookup -------------------------------------------------------------------------

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None:
        """``MambaManager.find_longest_cache_hit`` up to ``min(maximum, len(prompt))``.

        vLLM searches right to left and stops at the first cached block, so a hit at or
        below ``minimum`` means none lies in ``(minimum, maximum]``. A hit is used as a
        request uses one: ``touch`` (``add_local_computed_blocks``) and, when the request
        ends, ``free_blocks`` (``SingleTypeKVCacheManager.free``), which moves an
        unreferenced block to the tail of the free queue.
        """
        check_lookup_range(minimum, maximum)
        ids = self._prompt(namespace, prompt, extras)
        upper = min(maximum, len(ids))
        if upper <= minimum:
            return None
        request = self._request(namespace, extras, ids[:upper])
        blocks, hit = self._code.mamba_manager.find_longest_cache_hit(
            block_hashes=request.block_hashes,
            max_length=upper,
            kv_cache_group_ids=[GROUP],
            block_pool=self._pool,
            kv_cache_spec=self._spec,
            drop_eagle_block=False,
            alignment_tokens=self._block_size,
        )
        if hit <= minimum:
            return None
        block = blocks[0][-1]
        self._use(block)
        return LookupHit(hit, self._slot(block))

    # --- reserve / publish / abort ------------------------------------------------------

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: EntryCost | None = None,
    ) -> ReserveOutcome:
        """A block to write ``prompt[:tokens]``'s checkpoint into (``get_new_blocks(1)``).

        ``cost`` is checked and ignored: vLLM's blocks are all one size and its
        eviction order is recency only.
        """
        check_count("tokens", tokens, minimum=1)
        ids = self._prompt(namespace, prompt, extras)
        check_reserve_tokens(tokens, len(ids), cost)
        self._on_grid(tokens)
        request = self._request(namespace, extras, ids[:tokens])
        key = CheckpointKey(namespace, extras, request.block_hashes[-1], tokens)
        writing = self._open.writing(key)
        if writing is not None:
            return AlreadyCached(writing.slot, published=False)
        cached = self._pool.get_cached_block(key.digest, [GROUP])
        if cached:
            self._use(cached[0])
            return AlreadyCached(self._slot(cached[0]), published=True)
        try:
            (block,) = self._pool.get_new_blocks(1)
        except ValueError:  # "Cannot get 1 free blocks from the pool"
            return NoSlot(
                f"all {self._capacity} blocks are held (reserved or pinned): vLLM's "
                "BlockPool has no free block to allocate"
            )
        return self._open.issue(key, self._slot(block), _Open(block, request))

    def publish(self, reservation: Reservation) -> bool:
        """``cache_full_blocks`` for the one block (the blocks before it are null, as in
        align mode), then ``free_blocks``: the writer lets go and the cached block joins
        the tail of the free queue as the most recent eviction candidate."""
        opened = self._open.record(reservation, "publish")
        if reservation.state is ReservationState.CANCELLED:
            self._open.close(reservation, ReservationState.ABORTED)
            self._pool.free_blocks([opened.block])
            return False
        index = reservation.key.tokens // self._block_size - 1
        self._pool.cache_full_blocks(
            request=opened.request,
            blocks=[self._pool.null_block] * index + [opened.block],
            num_cached_blocks=index,
            num_full_blocks=index + 1,
            block_size=self._block_size,
            kv_cache_group_id=GROUP,
        )
        self._open.close(reservation, ReservationState.PUBLISHED)
        self._pool.free_blocks([opened.block])
        return True

    def abort(self, reservation: Reservation) -> None:
        """``free_blocks`` of the uncached block: vLLM prepends it to the free queue
        ("LIFO reuse of non-cached blocks"), as for a request freed before caching."""
        opened = self._open.record(reservation, "abort")
        self._open.close(reservation, ReservationState.ABORTED)
        self._pool.free_blocks([opened.block])

    # --- pins ---------------------------------------------------------------------------

    def pin(self, slot: int) -> int:
        """``touch``: ``ref_cnt + 1``, and out of the free queue (not evictable)."""
        block = self._block(slot)
        state = self.slot_state(slot)
        if state is not SlotState.PUBLISHED:
            raise SlotStateError(
                f"cannot pin slot {slot}: it is {state.value}; pin only a slot returned by "
                "lookup, before anything invalidates it"
            )
        self._pool.touch([block])
        return int(block.ref_cnt)

    def unpin(self, slot: int) -> int:
        """``free_blocks``: at ``ref_cnt == 0`` a cached block joins the queue's tail, an
        invalidated (uncached) one its head."""
        block = self._block(slot)
        if self.pins(slot) == 0:
            raise PinUnderflowError(
                f"unpin of slot {slot} would take its pin count below zero; call unpin once "
                "per successful pin"
            )
        self._pool.free_blocks([block])
        return int(block.ref_cnt)

    # --- invalidate / clear -------------------------------------------------------------

    def invalidate(self, key: CheckpointKey) -> bool:
        """``evict_blocks`` of the block cached under ``key`` (a held block keeps its
        references and is freed by its last ``free_blocks``); an open reservation of the
        key is cancelled (adapter: vLLM has none)."""
        if not isinstance(key, CheckpointKey):
            raise InvalidConfigError(
                f"invalidate needs a CheckpointKey, got {key!r} ({type(key).__name__}); "
                "build it with make_key(namespace, prompt, tokens, extras)"
            )
        if self._open.cancel(key):
            return True
        if not key.digest or key.tokens % self._block_size:
            return False
        cached = self._pool.get_cached_block(key.digest, [GROUP])
        if not cached:
            return False
        self._pool.evict_blocks({cached[0].block_id})
        return True

    def clear(self) -> None:
        """``reset_prefix_cache``. vLLM resets only when no block is held (no pin, no
        open reservation); otherwise it logs a warning, returns ``False`` and changes
        nothing, and so does this ``clear``."""
        self._pool.reset_prefix_cache()

    # --- internals ----------------------------------------------------------------------

    def _block(self, slot: int) -> Any:
        self._check_slot(slot)
        return self._pool.blocks[slot - self._first + 1]

    def _slot(self, block: Any) -> int:
        return self._first + int(block.block_id) - 1

    def _use(self, block: Any) -> None:
        """A hit, as a request takes it: ``touch`` then, at the request's end,
        ``free_blocks`` (tail of the free queue when no one else holds it)."""
        self._pool.touch([block])
        self._pool.free_blocks([block])

    def _on_grid(self, tokens: int) -> None:
        if tokens % self._block_size:
            raise CapabilityMissingError(
                f"vLLM keys a prefix only at multiples of its hash_block_size "
                f"({self._block_size} tokens here; CacheConfig.prefix_match_unit): "
                f"{tokens} tokens has no BlockHash; use a multiple of {self._block_size} "
                "(or engines.vllm_adapter:implementation_token_hash, which hashes every token)"
            )

    def _prompt(self, namespace: str, prompt: PromptLike, extras: tuple[str, ...]) -> list[int]:
        if not isinstance(namespace, str):
            raise InvalidConfigError(f"namespace must be a str, got {namespace!r}")
        if not isinstance(extras, tuple) or not all(isinstance(x, str) for x in extras):
            raise InvalidConfigError(f"extras must be a tuple of str, got {extras!r}")
        if isinstance(prompt, HashedPrompt):
            return hashed_prompt(prompt, namespace, extras, self._unit).tokens()
        return _token_ids(prompt)

    def _request(self, namespace: str, extras: tuple[str, ...], ids: list[int]) -> Any:
        """A vLLM ``Request`` of ``ids``; its ``block_hasher`` computes ``block_hashes``
        (one per full hash block) when it is built, as ``EngineCore`` sets it up."""
        return self._code.request(
            request_id=f"hyckpt-{next(_requests)}",
            prompt_token_ids=ids,
            sampling_params=self._code.sampling_params,
            pooling_params=None,
            cache_salt=json.dumps([namespace, *extras]),
            block_hasher=self._hasher,
        )


def make_index(
    capacity: int,
    *,
    first_slot: int = 0,
    eviction: object = "lru",
    hash_unit: int = 16,
    bytes_per_slot: int = 1,
    hash_block: int | str = "unit",
    **eviction_params: object,
) -> VllmIndex:
    """A :class:`VllmIndex` (``Implementation.make_index``); options as the reference's.

    ``bytes_per_slot`` is checked and unused (vLLM's blocks are one size; its LRU does not
    price them). ``eviction`` must be ``"lru"`` without parameters.

    Raises:
        InvalidConfigError: a count is not an int in range, ``hash_block`` is neither
            ``"unit"`` nor ``1``, or eviction parameters are given (lru takes none).
        UnknownPolicyError: ``eviction`` is not ``"lru"``.
        AllocationTooLargeError: ``capacity`` above :data:`MAX_CAPACITY`.
    """
    check_index_counts(capacity, first_slot, hash_unit, bytes_per_slot)
    if not isinstance(eviction, str) or eviction not in EVICTION_POLICIES:
        if not isinstance(eviction, str):
            raise InvalidConfigError(
                f"eviction must be a policy name, got {eviction!r}: vLLM's eviction order "
                "is its free block queue's (lru) and takes no policy object"
            )
        close = difflib.get_close_matches(eviction, EVICTION_POLICIES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownPolicyError(
            f"unknown eviction policy {eviction!r}; known: {', '.join(EVICTION_POLICIES)} "
            f"(vLLM's FreeKVCacheBlockQueue is LRU only){hint}"
        )
    if eviction_params:
        raise InvalidConfigError(
            f"eviction policy 'lru' takes no parameters, got {dict(eviction_params)!r}"
        )
    if capacity > MAX_CAPACITY:
        raise AllocationTooLargeError(
            f"capacity={capacity} blocks exceeds the vLLM adapter's limit of {MAX_CAPACITY} "
            "(BlockPool builds every KVCacheBlock up front); use fewer slots"
        )
    if hash_block == "unit":
        block = hash_unit
    elif hash_block == 1 and not isinstance(hash_block, bool):
        block = 1
    else:
        raise InvalidConfigError(f"hash_block must be 'unit' or 1, got {hash_block!r}")
    return VllmIndex(
        load_index_code(), capacity, first_slot=first_slot, hash_unit=hash_unit, hash_block=block
    )
