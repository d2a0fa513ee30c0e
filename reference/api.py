"""Shared vocabulary of hyckpt: value types and the Protocols every implementation satisfies.

An *implementation* (the reference, the GPU layer, or an engine under test) is a bundle
of factories (:class:`Implementation`) returned by a zero-argument ``module:factory``
callable; see :mod:`reference.loading`. Conformance tests are written against these
Protocols only, so they run unchanged for every implementation.

Units: every count below is in tokens unless it says bytes; slots and pages are integer
indices into preallocated pools.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from reference.errors import InvalidTokenCountError
from reference.hashing import HashedPrompt

if TYPE_CHECKING:
    import torch

#: A prompt: token ids, or a :class:`~reference.hashing.HashedPrompt` that already
#: carries its chained prefix hashes (so a request hashes its prompt once).
PromptLike = Sequence[int] | HashedPrompt


def check_count(name: str, value: object, *, minimum: int = 0) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) ``>= minimum``, else raise.

    Raises:
        InvalidTokenCountError: naming ``name``, the value found and what was expected.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTokenCountError(
            f"{name} must be an integer number of tokens, got {value!r} "
            f"({type(value).__name__}); pass an int"
        )
    if value < minimum:
        raise InvalidTokenCountError(f"{name} must be >= {minimum}, got {value}")
    return value


# --- placement -------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillChunk:
    """One prefill chunk of one request: it computes tokens ``[start, end)`` of the prompt.

    Attributes:
        start: tokens already in the sequence's state before the chunk (vLLM ``query_start``).
        end: tokens in the state after the chunk (vLLM ``seq_len``); ``start < end``.
        prompt_len: length of the whole prompt; ``end <= prompt_len``.
        turn_starts: positions where user turns begin (hint for the ``turns`` policy).
        branch_points: positions where this prompt leaves a cached prefix, as seen at
            lookup (hint for the ``branch`` policy).
    """

    start: int
    end: int
    prompt_len: int
    turn_starts: tuple[int, ...] = ()
    branch_points: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_count("start", self.start)
        check_count("end", self.end, minimum=1)
        check_count("prompt_len", self.prompt_len, minimum=1)
        if not self.start < self.end <= self.prompt_len:
            raise InvalidTokenCountError(
                f"a chunk needs start < end <= prompt_len, got start={self.start}, "
                f"end={self.end}, prompt_len={self.prompt_len}"
            )
        for name in ("turn_starts", "branch_points"):
            for value in getattr(self, name):
                check_count(f"{name} entry", value)

    @property
    def query_len(self) -> int:
        """Tokens computed by this chunk (``end - start``)."""
        return self.end - self.start


@runtime_checkable
class PlacementPolicy(Protocol):
    """Where checkpoints are captured inside a prefill chunk. A pure function of the chunk."""

    name: str

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        """Sorted, distinct positions ``p`` captured while computing ``chunk``.

        A checkpoint at ``p`` is the state after tokens ``[0, p)``. Each returned
        position satisfies ``chunk.start < p <= chunk.end`` (the ``vllm-align`` policy
        is stricter: ``p < chunk.end``).
        """
        ...


# --- index -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointKey:
    """Identity of a checkpoint: ``(namespace, extras, digest of prompt[:tokens], tokens)``.

    ``namespace`` is the model/deployment identity, ``extras`` adapter ids or salts.
    ``digest`` is implementation-defined; build keys with the index's ``make_key``.
    """

    namespace: str
    extras: tuple[str, ...]
    digest: bytes
    tokens: int


class LookupHit(NamedTuple):
    """A published checkpoint found by ``lookup``: compares equal to ``(tokens, slot)``."""

    tokens: int
    slot: int


@dataclass(frozen=True)
class EntryCost:
    """What an entry is worth to a cost-aware eviction policy.

    Attributes:
        tokens: prefix length the checkpoint covers.
        bytes: device bytes the entry occupies (every slab of its slot).
        flops_saved: FLOPs a hit avoids recomputing (0 when unknown).
    """

    tokens: int
    bytes: int = 1
    flops_saved: float = 0.0


class ReservationState(enum.Enum):
    """Life cycle of a reservation handle."""

    OPEN = "open"  # slot handed out, write in progress
    PUBLISHED = "published"  # write completed, key visible to lookup
    ABORTED = "aborted"  # write failed, slot returned
    CANCELLED = "cancelled"  # invalidated/cleared while open: publish will not expose it


@dataclass(eq=False)
class Reservation:
    """A slot handed out for writing one checkpoint. Pass it to ``publish`` or ``abort``.

    The issuing index updates ``state``; treat the handle as read-only.
    """

    key: CheckpointKey
    slot: int
    owner: int = field(repr=False)
    state: ReservationState = ReservationState.OPEN

    @property
    def tokens(self) -> int:
        """Prefix length of the checkpoint being written."""
        return self.key.tokens


@dataclass(frozen=True)
class AlreadyCached:
    """``reserve`` outcome: the key already owns ``slot`` (published, or being written)."""

    slot: int
    published: bool


@dataclass(frozen=True)
class NoSlot:
    """``reserve`` outcome: no free slot and nothing evictable. A normal outcome."""

    reason: str


ReserveOutcome = Reservation | AlreadyCached | NoSlot


class SlotState(enum.Enum):
    """State of one snapshot slot as the index sees it."""

    FREE = "free"
    RESERVED = "reserved"  # handed to a writer, not visible to lookup
    PUBLISHED = "published"  # visible to lookup (unless hidden by invalidate while pinned)
    DOOMED = "doomed"  # invalidated while pinned or reserved: freed when the last user lets go


@runtime_checkable
class EvictionPolicy(Protocol):
    """Chooses which published, unpinned entry gives up its slot.

    The index tells the policy about every published entry (``insert``), every lookup
    hit (``touch``) and every entry that leaves (``remove``); ``victim`` picks among the
    entries for which ``evictable(slot)`` is true without removing it.
    """

    name: str

    def insert(self, slot: int, cost: EntryCost, now: int) -> None: ...

    def touch(self, slot: int, now: int) -> None: ...

    def remove(self, slot: int) -> None: ...

    def victim(self, evictable: Callable[[int], bool]) -> int | None: ...


@runtime_checkable
class CheckpointIndex(Protocol):
    """Key → snapshot slot map with two-phase publication, pins and eviction (DESIGN §3)."""

    @property
    def first_slot(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    def make_key(
        self, namespace: str, prompt: PromptLike, tokens: int, extras: tuple[str, ...] = ()
    ) -> CheckpointKey: ...

    def lookup(
        self,
        namespace: str,
        prompt: PromptLike,
        minimum: int,
        maximum: int,
        extras: tuple[str, ...] = (),
    ) -> LookupHit | None: ...

    def reserve(
        self,
        namespace: str,
        prompt: PromptLike,
        tokens: int,
        extras: tuple[str, ...] = (),
        cost: EntryCost | None = None,
    ) -> ReserveOutcome: ...

    def publish(self, reservation: Reservation) -> bool: ...

    def abort(self, reservation: Reservation) -> None: ...

    def pin(self, slot: int) -> int: ...

    def unpin(self, slot: int) -> int: ...

    def pins(self, slot: int) -> int: ...

    def slot_state(self, slot: int) -> SlotState: ...

    def invalidate(self, key: CheckpointKey) -> bool: ...

    def clear(self) -> None: ...

    def free_count(self) -> int: ...


# --- storage and exporter (implemented by the storage issue) ---------------------------


@runtime_checkable
class SnapshotStorage(Protocol):
    """Preallocated slabs with one leading snapshot-slot index per axis (DESIGN §4).

    Axes: *recurrent* (every recurrent layer's conv window ``[conv_dim, d_conv-1]`` and
    state — Mamba2 ``[H, P, N]``, DeltaNet ``[HV, dk, dv]`` —, every sliding-window ring,
    and the boundary hidden row ``[hidden]`` when configured) and *partial KV* (one
    page ``[B, kv_heads, head_dim]`` per full-attention layer for K and V, plus the
    paired draft page when a draft pool is configured). ``stream`` is a CUDA stream on
    the GPU layer and ignored by the reference.
    """

    def recurrent_slot_count(self) -> int: ...

    def partial_kv_slot_count(self) -> int: ...

    def boundary_hidden_dim(self) -> int: ...

    def recurrent_bytes_per_slot(self) -> int: ...

    def partial_kv_bytes_per_slot(self) -> int: ...

    def zero_recurrent(self, batch_slot: int, stream: object | None = None) -> None: ...

    def capture_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None: ...

    def restore_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None: ...

    def capture_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None: ...

    def restore_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None: ...

    def capture_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None: ...

    def restore_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None: ...

    def capture_boundary_hidden(
        self,
        snapshot_slot: int,
        hidden: torch.Tensor,
        batch_slot: int,
        position: int,
        stream: object | None = None,
    ) -> None:
        """Save ``hidden[batch_slot, position, :]`` (``hidden`` is ``[batch, seq, d]``)."""
        ...

    def restore_boundary_hidden(
        self,
        snapshot_slot: int,
        hidden: torch.Tensor,
        batch_slot: int,
        position: int,
        stream: object | None = None,
    ) -> None:
        """Write the saved row into ``hidden[batch_slot, position, :]``."""
        ...


@runtime_checkable
class PrefillExporter(Protocol):
    """Stores checkpoints emitted inside a prefill batch in one pass (DESIGN §5).

    Shapes: ``raw_inputs [total_tokens, conv_dim]`` (conv inputs of the packed batch),
    ``cu_seqlens [rows + 1]`` (int64), ``initial_conv [rows, conv_dim, d_conv - 1]``,
    ``emitted_states [rows, *state_shape]``, ``offsets [rows]`` (0 = none),
    ``destinations [rows]`` (-1 = none), ``conv_slab [slots, conv_dim, d_conv - 1]``,
    ``state_slab [slots, *state_shape]``.
    """

    def export(
        self,
        *,
        raw_inputs: torch.Tensor,
        cu_seqlens: torch.Tensor,
        initial_conv: torch.Tensor,
        emitted_states: torch.Tensor,
        offsets: torch.Tensor,
        destinations: torch.Tensor,
        conv_slab: torch.Tensor,
        state_slab: torch.Tensor,
        stream: object | None = None,
    ) -> None: ...


# --- implementation bundle -------------------------------------------------------------


@dataclass(frozen=True)
class Implementation:
    """What a ``module:factory`` returns: factories for each layer plus capabilities.

    Attributes:
        name: shown in test ids and reports.
        make_placement: ``(policy_name, **params) -> PlacementPolicy``.
        make_index: ``(capacity, *, first_slot=0, eviction="lru", **options)
            -> CheckpointIndex``.
        placement_policies: names ``make_placement`` accepts.
        eviction_policies: names ``make_index(eviction=...)`` accepts.
        capabilities: feature flags such as ``"two-phase-publish"``, ``"pin"``,
            ``"draft-pairing"``; tests of a missing feature skip with a reason.
        make_storage, make_exporter: ``None`` until the implementation provides them.
    """

    name: str
    make_placement: Callable[..., PlacementPolicy]
    make_index: Callable[..., CheckpointIndex]
    placement_policies: frozenset[str]
    eviction_policies: frozenset[str]
    capabilities: frozenset[str] = frozenset()
    make_storage: Callable[..., SnapshotStorage] | None = None
    make_exporter: Callable[..., PrefillExporter] | None = None
