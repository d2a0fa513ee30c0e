"""Shared vocabulary of hyckpt: value types and the Protocols every implementation satisfies.

An *implementation* (the reference, the GPU layer, or an engine under test) is a bundle
of factories (:class:`Implementation`) returned by a zero-argument ``module:factory``
callable; see :mod:`reference.conformance.loading`. Conformance tests are written against these
Protocols only, so they run unchanged for every implementation.

The typed errors every implementation raises live in :mod:`reference.errors`.

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

    Both hints are sequences of ints; a list is stored as a tuple (the chunk stays
    hashable). Anything else (``None``, a bare int, a string) is an
    :class:`~reference.errors.InvalidTokenCountError`, as are bad counts.
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
            hints = getattr(self, name)
            if type(hints) is not tuple and (
                isinstance(hints, str | bytes) or not isinstance(hints, Sequence)
            ):
                raise InvalidTokenCountError(
                    f"{name} must be a sequence of token positions (a tuple or list of "
                    f"ints), got {hints!r} ({type(hints).__name__}); pass () for no hints"
                )
            for value in hints:
                if type(value) is not int or value < 0:  # else check_count passes it
                    check_count(f"{name} entry", value)
            if not isinstance(hints, tuple):
                object.__setattr__(self, name, tuple(hints))  # keep the chunk hashable

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


# --- storage and exporter --------------------------------------------------------------


@runtime_checkable
class SnapshotStorage(Protocol):
    """Preallocated slabs with one leading snapshot-slot index per axis (DESIGN §4).

    Built by ``Implementation.make_storage(live, recurrent_slots, partial_kv_slots, *,
    boundary_hidden_dim=0, boundary_hidden_dtype=torch.float64)`` from a
    :class:`~reference.state.LiveState`, whose tensors it copies from and to.

    Axes and slab groups (``slab(group, name)``; every slab is ``[slots, *per_slot]``):

    - *recurrent* axis, ``recurrent_slot_count()`` slots: group ``"recurrent"`` holds one
      slab per ``live.recurrent`` name (conv window ``[conv_dim, d_conv-1]``, Mamba2
      state ``[H, P, N]``, DeltaNet state ``[HV, dk, dv]``, sliding-window ring
      ``[W-1, kv_heads, head_dim]``), and group ``"boundary_hidden"`` the slab
      ``"hidden"`` ``[slots, boundary_hidden_dim]`` when ``boundary_hidden_dim > 0``;
    - *partial-KV* axis, ``partial_kv_slot_count()`` slots: group ``"kv"`` holds one page
      ``[B, kv_heads, head_dim]`` per ``live.kv_pages`` name, and group ``"draft_kv"``
      one per ``live.draft_kv_pages`` name when a draft pool is configured (the paired
      draft page rides on the base page's slot).

    Rules: a capture copies the live bytes and nothing else; a partial-KV capture copies
    rows ``[0, valid)`` and a restore writes only rows ``[0, valid)`` of the destination
    page; ``0 <= valid <= B``. Restoring from a slot never captured (for the boundary
    hidden row: never captured with ``capture_boundary_hidden``; for a paired restore:
    never captured paired), or more rows than the slot holds, is an error. Every misuse
    raises a typed error of :mod:`reference.errors` and leaves the slabs, the capture
    records and the live tensors unchanged. ``stream`` is a CUDA stream on the GPU layer
    and ignored by the reference. Every index is a Python ``int`` (not ``bool``).
    """

    def recurrent_slot_count(self) -> int: ...

    def partial_kv_slot_count(self) -> int: ...

    def boundary_hidden_dim(self) -> int: ...

    def has_draft(self) -> bool:
        """Whether a draft pool is configured (paired partial-KV operations allowed)."""
        ...

    def recurrent_bytes_per_slot(self) -> int:
        """Bytes of one recurrent slot: every ``"recurrent"`` slab's slot plus the boundary
        hidden row."""
        ...

    def partial_kv_bytes_per_slot(self) -> int:
        """Bytes of one partial-KV slot: every ``"kv"`` and ``"draft_kv"`` page."""
        ...

    def slab(self, group: str, name: str) -> torch.Tensor:
        """The slab ``[slots, *per_slot]`` of ``name`` in ``group`` (``"recurrent"``,
        ``"boundary_hidden"``, ``"kv"``, ``"draft_kv"``), for writers such as the exporter."""
        ...

    def slabs(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every slab: group → name → slab. All four groups are present; a group that is
        not configured maps to an empty dict."""
        ...

    def is_recurrent_captured(self, snapshot_slot: int) -> bool:
        """Whether ``restore_recurrent`` from this slot is allowed."""
        ...

    def is_boundary_hidden_captured(self, snapshot_slot: int) -> bool:
        """Whether ``restore_boundary_hidden`` from this slot is allowed."""
        ...

    def partial_kv_rows(self, snapshot_slot: int) -> int | None:
        """Rows the last partial-KV capture of this slot copied, ``None`` if never captured."""
        ...

    def partial_kv_paired(self, snapshot_slot: int) -> bool:
        """Whether the last partial-KV capture of this slot included the draft page."""
        ...

    def mark_recurrent_captured(self, snapshot_slot: int) -> None:
        """Record that every ``"recurrent"`` slab of this slot was written through
        :meth:`slab` (e.g. by the prefill exporter), so it may be restored."""
        ...

    def discard(self, snapshot_slot: int) -> None:
        """Forget what the slot holds: every record of it (recurrent, boundary row, partial
        KV) returns to never captured; no byte changes. Call it when the index hands the
        slot out for a new checkpoint, so that a part the new checkpoint does not write is
        refused on restore instead of copying the previous checkpoint's bytes."""
        ...

    def zero_recurrent(self, batch_slot: int, stream: object | None = None) -> None:
        """Zero every live recurrent tensor at ``batch_slot`` (a sequence with no prefix)."""
        ...

    def capture_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        """Copy every live recurrent tensor's ``[batch_slot]`` into the slot (not the
        boundary hidden row)."""
        ...

    def restore_recurrent(
        self, snapshot_slot: int, batch_slot: int, stream: object | None = None
    ) -> None:
        """Copy the slot into every live recurrent tensor's ``[batch_slot]``."""
        ...

    def capture_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        """Copy rows ``[0, valid)`` of base page ``page`` of every full-attention tensor."""
        ...

    def restore_partial_kv(
        self, snapshot_slot: int, page: int, valid: int, stream: object | None = None
    ) -> None:
        """Write rows ``[0, valid)`` of base page ``page``; rows ``>= valid`` untouched."""
        ...

    def capture_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        """Capture rows ``[0, valid)`` of the base page and of the draft page into one slot."""
        ...

    def restore_partial_kv_paired(
        self,
        snapshot_slot: int,
        base_page: int,
        draft_page: int,
        valid: int,
        stream: object | None = None,
    ) -> None:
        """Restore rows ``[0, valid)`` of both pages from a slot captured paired."""
        ...

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

    Built by ``Implementation.make_exporter()``. One call handles one recurrent layer of a
    packed batch of ``rows`` sequences; row ``i`` computed tokens
    ``raw_inputs[cu_seqlens[i]:cu_seqlens[i+1]]``.

    Shapes (``W = d_conv - 1``; ``slots`` = snapshot slots of the slabs):
    ``raw_inputs [total_tokens, conv_dim]`` (raw conv inputs of the chunk),
    ``cu_seqlens [rows + 1]`` (int32/int64, ``cu_seqlens[0] == 0``, non-decreasing,
    ``cu_seqlens[-1] <= total_tokens``), ``initial_conv [rows, conv_dim, W]`` (each row's
    conv window before the chunk), ``emitted_states [rows, *state_shape]`` (the state at
    each row's offset; ``[emitted, *state_shape]`` with ``recurrent_rows``),
    ``offsets [rows]`` (0 = none), ``destinations [rows]`` (-1 = none),
    ``conv_slab [slots, conv_dim, W]``, ``state_slab [slots, *state_shape]``,
    ``recurrent_rows [rows]`` (optional: row ``i``'s state is
    ``emitted_states[recurrent_rows[i]]``; -1 allowed for rows without a checkpoint).

    Row ``i`` has a checkpoint when ``offsets[i] > 0`` and ``destinations[i] != -1``; then
    ``conv_slab[d]`` receives the last ``W`` raw inputs before the offset, oldest first
    (the oldest from ``initial_conv[i]`` when ``offsets[i] < W``) and ``state_slab[d]``
    the emitted state. Nothing else is written. Every argument is validated before
    anything is written; a bad one raises a typed error of :mod:`reference.errors`.
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
        recurrent_rows: torch.Tensor | None = None,
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
            -> CheckpointIndex``. The conformance suite passes ``hash_unit`` (tokens per
            prefix-hash unit; not an ``int >= 1``: ``InvalidConfigError``) and may pass
            ``bytes_per_slot`` and eviction parameters such as ``alpha``.
        placement_policies: names ``make_placement`` accepts.
        eviction_policies: names ``make_index(eviction=...)`` accepts.
        capabilities: feature flags such as ``"two-phase-publish"``, ``"pin"``,
            ``"draft-pairing"``; tests of a missing feature skip with a reason.
        make_storage: ``(live, recurrent_slots, partial_kv_slots, *,
            boundary_hidden_dim=0, boundary_hidden_dtype=torch.float64) -> SnapshotStorage``
            (``live`` is a :class:`~reference.state.LiveState`); ``None`` if not provided.
        make_exporter: ``() -> PrefillExporter``; ``None`` if not provided.
    """

    name: str
    make_placement: Callable[..., PlacementPolicy]
    make_index: Callable[..., CheckpointIndex]
    placement_policies: frozenset[str]
    eviction_policies: frozenset[str]
    capabilities: frozenset[str] = frozenset()
    make_storage: Callable[..., SnapshotStorage] | None = None
    make_exporter: Callable[..., PrefillExporter] | None = None

    def __repr__(self) -> str:
        # A falsifying example or a failure message shows the implementation by name:
        # the dataclass repr would spell out every factory (15 lines).
        return f"<implementation {self.name!r}>"
