"""Placement policies: where prefill checkpoints are captured (DESIGN §2).

A placement policy is a pure function from one prefill chunk (:class:`PrefillChunk`) to
the positions captured while that chunk is computed. A checkpoint *at p* is the state
after prompt tokens ``[0, p)``. Every count and position here is in **tokens**.

Two families:

* **Target-set policies** (``block-floor``, ``interval``, ``turns``, ``branch``,
  ``vllm-retention``) define a set of positions for the whole prompt, which depends only
  on the prompt length and the chunk's hints. A chunk ``[start, end)`` captures the
  targets ``p`` with ``start < p <= end``: a target on a chunk boundary is the live state
  right after the chunk that ends there, so every chunking of a prompt captures exactly
  the same set.
* **Chunk-dependent policies** (``vllm-align``, ``chunk-end``, ``chunk-grid``): the position is a
  function of the chunk itself, so a different chunking captures different positions.
  ``vllm-align`` reproduces vLLM's align-mode prefill checkpointing: the position is a
  function of the chunk end (vLLM's ``seq_len``), and a chunk keeps it only under vLLM's
  validity rules, which include the strict ``p < end``. ``chunk-end`` reproduces
  SGLang's ``no_buffer`` Mamba radix cache: one state at the end of every chunk;
  ``chunk-grid`` its ``extra_buffer`` strategy: one state per chunk on a grid counted
  from the chunk's start.

Build policies by scenario-file name with :func:`make_placement`; :data:`POLICIES` is the
registry. Bad names raise :class:`~reference.errors.UnknownPolicyError`, bad parameters
:class:`~reference.errors.InvalidConfigError`, bad token counts
:class:`~reference.errors.InvalidTokenCountError`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from reference.api import PlacementPolicy, PrefillChunk, check_count
from reference.errors import InvalidConfigError, InvalidTokenCountError, UnknownPolicyError

__all__ = [
    "POLICIES",
    "BlockFloor",
    "Branch",
    "ChunkEnd",
    "ChunkGrid",
    "Interval",
    "TargetSetPolicy",
    "Turns",
    "VllmAlign",
    "VllmRetention",
    "batch_offsets",
    "block_floor_position",
    "cdiv",
    "make_placement",
    "snap_down",
    "vllm_align_batch",
    "vllm_align_position",
    "vllm_align_valid",
]


# --- small arithmetic helpers ----------------------------------------------------------


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division of integers (``denominator > 0``)."""
    return -(-numerator // denominator)


def snap_down(position: int, unit: int) -> int:
    """Largest multiple of ``unit`` (tokens, ``> 0``) that is ``<= position`` (tokens)."""
    return position // unit * unit


# --- parameter validation --------------------------------------------------------------


def _config_int(policy: str, param: str, value: object, *, minimum: int) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) ``>= minimum``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConfigError(
            f"placement policy {policy!r}: parameter {param!r} must be an integer number "
            f"of tokens >= {minimum}, got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise InvalidConfigError(
            f"placement policy {policy!r}: parameter {param!r} must be >= {minimum} tokens, "
            f"got {value}"
        )
    return value


def _config_bool(policy: str, param: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidConfigError(
            f"placement policy {policy!r}: parameter {param!r} must be True or False, "
            f"got {value!r} ({type(value).__name__})"
        )
    return value


def _config_offsets(policy: str, param: str, value: object) -> tuple[int, ...]:
    """Normalize a sequence of non-negative token offsets to a tuple."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidConfigError(
            f"placement policy {policy!r}: parameter {param!r} must be a sequence of "
            f"non-negative integer token offsets, got {value!r} ({type(value).__name__})"
        )
    return tuple(
        _config_int(policy, f"{param}[{i}]", item, minimum=0) for i, item in enumerate(value)
    )


def _check_hash_unit(policy: str, hash_unit: object) -> int:
    return _config_int(policy, "hash_unit", hash_unit, minimum=1)


# --- target-set policies ---------------------------------------------------------------


class TargetSetPolicy:
    """Base of the policies defined by a per-prompt target set.

    Subclasses implement :meth:`targets`; :meth:`positions` is the targets ``p`` with
    ``chunk.start < p <= chunk.end``.
    """

    name: str = ""

    def targets(self, chunk: PrefillChunk) -> tuple[int, ...]:
        """Sorted, distinct target positions (tokens) for the whole prompt of ``chunk``.

        Depends only on ``chunk.prompt_len`` and the hints, never on ``start``/``end``.
        Every target lies in ``1..prompt_len``.
        """
        raise NotImplementedError

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        """Targets ``p`` (tokens) with ``chunk.start < p <= chunk.end``, ascending."""
        return tuple(p for p in self.targets(chunk) if chunk.start < p <= chunk.end)


def _keep(candidates: Iterable[int], prompt_len: int) -> tuple[int, ...]:
    """Sorted, distinct candidates in ``1..prompt_len`` (anything else is dropped)."""
    return tuple(sorted({p for p in candidates if 0 < p <= prompt_len}))


def block_floor_position(end: int, block_size: int) -> int:
    """Block-floor checkpoint position for a sequence of ``end`` tokens; 0 means none.

    ``floor((end - B) / B) * B`` for block size ``B`` tokens: the last block boundary
    that lies at least ``B`` tokens before ``end``. ``B == 0`` disables it (0), and a
    result ``<= 0`` is reported as 0.

    Raises:
        InvalidTokenCountError: ``end`` or ``block_size`` is negative or not an ``int``.
    """
    check_count("end", end)
    check_count("block_size", block_size)
    if block_size == 0:
        return 0
    return max((end - block_size) // block_size * block_size, 0)


@dataclass(frozen=True)
class BlockFloor(TargetSetPolicy):
    """``block-floor``: one checkpoint at ``block_floor_position(prompt_len, block_size)``.

    Attributes:
        block_size: KV block size ``B`` in tokens; 0 disables the policy (no positions).
        hash_unit: optional hash unit in tokens; when given it must divide ``block_size``
            (positions are multiples of ``B``, hence of the hash unit).
    """

    name = "block-floor"

    block_size: int
    hash_unit: int | None = None

    def __post_init__(self) -> None:
        block_size = _config_int(self.name, "block_size", self.block_size, minimum=0)
        if self.hash_unit is not None:
            hash_unit = _check_hash_unit(self.name, self.hash_unit)
            if block_size % hash_unit != 0:
                raise InvalidConfigError(
                    f"placement policy {self.name!r}: parameter 'hash_unit'={hash_unit} must "
                    f"divide 'block_size'={block_size} (positions are multiples of the block "
                    "size)"
                )

    def targets(self, chunk: PrefillChunk) -> tuple[int, ...]:
        return _keep([block_floor_position(chunk.prompt_len, self.block_size)], chunk.prompt_len)


@dataclass(frozen=True)
class Interval(TargetSetPolicy):
    """``interval``: every ``every`` tokens, plus explicit offsets from the start and end.

    Attributes:
        hash_unit: hash unit ``h`` in tokens (``> 0``); every position is a multiple of it.
        every: period in tokens, a multiple of ``h``; 0 means no periodic positions.
        from_start: offsets ``o`` (tokens) giving positions ``floor(o/h)*h``.
        from_end: offsets ``o`` (tokens) giving positions ``floor((prompt_len - o)/h)*h``.

    Positions ``<= 0`` or ``> prompt_len`` are dropped.
    """

    name = "interval"

    hash_unit: int
    every: int = 0
    from_start: tuple[int, ...] = ()
    from_end: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        hash_unit = _check_hash_unit(self.name, self.hash_unit)
        every = _config_int(self.name, "every", self.every, minimum=0)
        if every % hash_unit != 0:
            raise InvalidConfigError(
                f"placement policy {self.name!r}: parameter 'every'={every} must be a "
                f"multiple of 'hash_unit'={hash_unit} (or 0 for no periodic checkpoints)"
            )
        object.__setattr__(
            self, "from_start", _config_offsets(self.name, "from_start", self.from_start)
        )
        object.__setattr__(self, "from_end", _config_offsets(self.name, "from_end", self.from_end))

    def targets(self, chunk: PrefillChunk) -> tuple[int, ...]:
        n, h = chunk.prompt_len, self.hash_unit
        candidates: list[int] = []
        if self.every:
            candidates.extend(range(self.every, n + 1, self.every))
        candidates.extend(snap_down(o, h) for o in self.from_start)
        candidates.extend(snap_down(n - o, h) for o in self.from_end)
        return _keep(candidates, n)


@dataclass(frozen=True)
class Turns(TargetSetPolicy):
    """``turns``: at the start of each user turn and ``margin`` tokens before the end.

    Attributes:
        hash_unit: hash unit ``h`` in tokens (``> 0``).
        margin: tokens kept before the prompt end (``>= 0``); position
            ``floor((prompt_len - margin)/h)*h``.

    Each ``chunk.turn_starts`` entry ``t`` gives ``floor(t/h)*h``. Positions ``<= 0`` or
    ``> prompt_len`` are dropped.
    """

    name = "turns"

    hash_unit: int
    margin: int = 0

    def __post_init__(self) -> None:
        _check_hash_unit(self.name, self.hash_unit)
        _config_int(self.name, "margin", self.margin, minimum=0)

    def targets(self, chunk: PrefillChunk) -> tuple[int, ...]:
        n, h = chunk.prompt_len, self.hash_unit
        candidates = [snap_down(t, h) for t in chunk.turn_starts]
        candidates.append(snap_down(n - self.margin, h))
        return _keep(candidates, n)


@dataclass(frozen=True)
class Branch(TargetSetPolicy):
    """``branch``: at prefix-tree branch points and, optionally, at the end of input.

    Attributes:
        hash_unit: hash unit ``h`` in tokens (``> 0``).
        end_of_input: whether the end of input ``floor(prompt_len/h)*h`` is a target
            (default ``True``). ``False`` keeps only the branch points, as Marconi's
            simulator does (ruipeterpan/marconi ``radix_cache_hybrid.py``): it stores a
            state at the branch-off node and at the end of the whole sequence including
            the output, never at the end of the input alone (the end of the answer is
            cached separately, outside prefill placement).

    Each ``chunk.branch_points`` entry ``b`` gives ``floor(b/h)*h``. Positions ``<= 0`` or
    ``> prompt_len`` are dropped.
    """

    name = "branch"

    hash_unit: int
    end_of_input: bool = True

    def __post_init__(self) -> None:
        _check_hash_unit(self.name, self.hash_unit)
        _config_bool(self.name, "end_of_input", self.end_of_input)

    def targets(self, chunk: PrefillChunk) -> tuple[int, ...]:
        n, h = chunk.prompt_len, self.hash_unit
        candidates = [snap_down(b, h) for b in chunk.branch_points]
        if self.end_of_input:
            candidates.append(snap_down(n, h))
        return _keep(candidates, n)


@dataclass(frozen=True)
class VllmRetention(TargetSetPolicy):
    """``vllm-retention``: the prefill states vLLM's sparse Mamba retention keeps.

    Attributes:
        hash_unit: cache-hit alignment ``h`` in tokens (``> 0``); every target is snapped
            down to a multiple of it.
        retention_interval: segment length in tokens, a multiple of ``h``; ``0`` (the
            default) means no periodic states.

    Targets for a prompt of ``n`` tokens:

    * ``floor((n - 1)/h)*h``, the replay boundary: a resend of the same prompt is capped
      at ``n - 1`` tokens (its last token is recomputed for logits);
    * ``floor(b/h)*h`` for each ``chunk.branch_points`` entry ``b``, the shared-prefix
      junction (where the full-attention hit went beyond the hybrid hit, seen at lookup);
    * every multiple of ``retention_interval`` (when ``> 0``).

    Positions ``<= 0`` or ``> n`` are dropped.

    Mirrors vLLM 0.33 with ``CacheConfig.prefix_cache_retention_interval`` (default 0,
    ``vllm/config/cache.py``): ``MambaManager.reachable_block_mask``
    (``vllm/v1/core/single_type_kv_cache_manager.py``) keeps only the states at
    ``reachable_boundaries`` = ``replay_boundaries(num_prompt_tokens)`` =
    ``(num_prompt_tokens - 1,)`` (``vllm/v1/core/kv_cache_coordinator.py``) plus
    ``request.shared_prefix_boundary``, each aligned down (``aligned = boundary_tokens //
    alignment_tokens * alignment_tokens``); a positive interval also keeps one state per
    interval-sized segment. EAGLE's shifted boundaries (``use_eagle``: the block below the
    resend and extension boundaries) are not modelled.
    """

    name = "vllm-retention"

    hash_unit: int
    retention_interval: int = 0

    def __post_init__(self) -> None:
        hash_unit = _check_hash_unit(self.name, self.hash_unit)
        interval = _config_int(self.name, "retention_interval", self.retention_interval, minimum=0)
        if interval % hash_unit != 0:
            raise InvalidConfigError(
                f"placement policy {self.name!r}: parameter 'retention_interval'={interval} "
                f"must be a multiple of 'hash_unit'={hash_unit} (or 0 for no periodic "
                "states)"
            )

    def targets(self, chunk: PrefillChunk) -> tuple[int, ...]:
        n, h = chunk.prompt_len, self.hash_unit
        candidates = [snap_down(n - 1, h)]
        candidates.extend(snap_down(b, h) for b in chunk.branch_points)
        if self.retention_interval:
            candidates.extend(range(self.retention_interval, n + 1, self.retention_interval))
        return _keep(candidates, n)


# --- chunk-end -------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkEnd:
    """``chunk-end``: one checkpoint at the end of every prefill chunk (SGLang-style).

    Attributes:
        hash_unit: hash unit ``h`` in tokens (``> 0``, default 1).

    A chunk ``[start, end)`` captures ``p = floor(end/h)*h`` when ``start < p <= end``,
    else nothing. Not a target-set policy: the positions depend on the chunking.

    Mirrors SGLang 0.5.23's Mamba radix cache with the ``no_buffer`` strategy (page size
    1): ``checkpoint_kv_cache`` (``mem_cache/common.py``) calls
    ``tree_cache.checkpoint(req, up_to=req.extend_end)`` after every prefill chunk,
    including the last, and ``MambaComponent.prepare_for_caching_req``
    (``mem_cache/unified_cache/components/mamba.py``) copies the live state into a new
    slot at exactly that length.
    """

    name = "chunk-end"

    hash_unit: int = 1

    def __post_init__(self) -> None:
        _check_hash_unit(self.name, self.hash_unit)

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        """``(floor(end/h)*h,)`` (tokens) when it lies in ``(start, end]``, else ``()``."""
        p = snap_down(chunk.end, self.hash_unit)
        return (p,) if chunk.start < p <= chunk.end else ()


# --- chunk-grid ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkGrid:
    """``chunk-grid``: one checkpoint per prefill chunk, on a grid counted from the chunk's
    start (SGLang's ``extra_buffer`` Mamba strategy).

    Attributes:
        grid: checkpoint grid ``G`` in tokens (``> 0``; SGLang's ``mamba_checkpoint_grid``).
        hash_unit: hash unit ``h`` in tokens (``> 0``, divides ``grid``; default ``grid``).

    A chunk ``[start, end)`` with ``end - start >= G`` captures one position: a branch
    point ``b`` of the chunk snapped down to the grid (``floor(b/G)*G``) when
    ``start < b < end`` and ``(b - start) % G == 0`` (the largest such), else
    ``start + floor((end - start)/G)*G``. A shorter chunk captures nothing. Positions are
    then snapped down to ``h`` (a no-op when ``start`` is on ``h``'s grid, as every hit
    and chunk end of a run whose token budget is a multiple of ``h`` is). Not a target-set
    policy: the positions depend on the chunking.

    Mirrors SGLang 0.5.23 with ``extra_buffer`` (page size ``P``, no decode context
    parallelism): ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``
    (``managers/schedule_batch.py``) tracks the state at ``prefix_len + (extend_len //
    G) * G`` when ``extend_len >= G``, where ``G = mamba_checkpoint_grid(P) = lcm(
    mamba_cache_chunk_size, P)`` (``runtime_context.py``), or at the request's
    ``mamba_branching_seqlen`` when that lies inside the chunk on the same grid; the
    lookup sets ``mamba_branching_seqlen`` to the full-KV hit snapped down to ``G`` when it
    lies beyond the Mamba hit (``MambaComponent.finalize_match_result_in_tree_core``,
    ``mem_cache/unified_cache/components/mamba.py``). Which tracked states the tree keeps
    (a middle chunk's at once, the last chunk's only when decode tracks no later one) is
    the engine's rule, not the policy's (docs/SEMANTICS.md H8).
    """

    name = "chunk-grid"

    grid: int
    hash_unit: int | None = None

    def __post_init__(self) -> None:
        grid = _config_int(self.name, "grid", self.grid, minimum=1)
        unit = grid if self.hash_unit is None else _check_hash_unit(self.name, self.hash_unit)
        if grid % unit:
            raise InvalidConfigError(
                f"placement policy {self.name!r}: parameter 'grid'={grid} must be a multiple "
                f"of 'hash_unit'={unit}"
            )
        object.__setattr__(self, "hash_unit", unit)

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        """The chunk's one grid position (tokens), or ``()`` for a chunk shorter than ``G``."""
        start, end, grid = chunk.start, chunk.end, self.grid
        length = end - start
        if length < grid:
            return ()
        position = start + length // grid * grid
        branches = [
            b
            for b in (snap_down(point, grid) for point in chunk.branch_points)
            if start < b < end and (b - start) % grid == 0
        ]
        if branches:
            position = max(branches)
        assert self.hash_unit is not None  # set by __post_init__
        position = snap_down(position, self.hash_unit)
        return (position,) if start < position <= end else ()


# --- vllm-align ------------------------------------------------------------------------


def vllm_align_position(n: int, hit_alignment: int, drop: bool = False, lookahead: int = 0) -> int:
    """vLLM align-mode checkpoint position for a chunk ending at ``n`` tokens; 0 = none.

    ``limit = n if drop else n - max(1, lookahead)``; ``p = floor(limit/h)*h`` with
    ``h = hit_alignment``; ``p -= h`` when ``drop`` (the draft model's block is dropped);
    the result is ``max(p, 0)``.

    Args:
        n: chunk end (vLLM ``seq_len``), tokens, ``>= 0``.
        hit_alignment: granularity of prefix-cache hits ``h``, tokens, ``> 0``.
        drop: whether the EAGLE/MTP draft block is dropped.
        lookahead: speculative lookahead tokens ``L`` (``>= 0``).

    Raises:
        InvalidTokenCountError: a count is negative (``hit_alignment`` not positive) or not
            an ``int``.
        InvalidConfigError: ``drop`` is not a ``bool``.
    """
    check_count("n (seq_len)", n)
    h = check_count("hit_alignment", hit_alignment, minimum=1)
    check_count("lookahead", lookahead)
    if not isinstance(drop, bool):
        raise InvalidConfigError(f"drop must be True or False, got {drop!r}")
    limit = n if drop else n - max(1, lookahead)
    p = snap_down(limit, h)
    if drop:
        p -= h
    return max(p, 0)


def vllm_align_valid(
    query_start: int,
    query_end: int,
    position: int,
    *,
    hash_unit: int,
    block_size: int,
    alignment: int | None,
) -> bool:
    """Whether chunk ``[query_start, query_end)`` may hold a checkpoint at ``position``.

    All arguments are tokens. The rules (vLLM ``is_mamba_prefill_checkpoint_valid``):
    ``query_start % hash_unit == 0``; ``cdiv(query_end, B) - 2 > (query_start - 1) // B``
    (the capture column lies past the chunk's first block); ``query_start + hash_unit <=
    position``; ``query_start < position < query_end``; ``(position - query_start) %
    alignment == 0``. ``alignment is None`` means never valid.
    """
    if alignment is None:
        return False
    return (
        query_start % hash_unit == 0
        and cdiv(query_end, block_size) - 2 > (query_start - 1) // block_size
        and query_start + hash_unit <= position
        and query_start < position < query_end
        and (position - query_start) % alignment == 0
    )


@dataclass(frozen=True)
class VllmAlign:
    """``vllm-align``: vLLM's align-mode prefill checkpoint, one per chunk at most.

    Attributes:
        block_size: block size ``B`` of the recurrent cache, tokens (``> 0``).
        hash_unit: prefix-hash block size, tokens (``> 0``, divides ``block_size``).
        hit_alignment: cache-hit alignment ``h``, tokens; defaults to ``hash_unit`` and
            must be a multiple of it.
        alignment: required alignment of the query offset ``p - start``, tokens, or
            ``None`` (then no chunk ever holds a checkpoint).
        drop_draft_block: vLLM's ``use_eagle_block_drop()``.
        lookahead: speculative lookahead tokens ``L`` (``>= 0``).

    The position is :func:`vllm_align_position` of the chunk end; the chunk keeps it only
    when :func:`vllm_align_valid` holds. Positions satisfy ``start < p < end`` (strict).
    """

    name = "vllm-align"

    block_size: int
    hash_unit: int
    hit_alignment: int | None = None
    alignment: int | None = None
    drop_draft_block: bool = False
    lookahead: int = 0

    def __post_init__(self) -> None:
        block_size = _config_int(self.name, "block_size", self.block_size, minimum=1)
        hash_unit = _check_hash_unit(self.name, self.hash_unit)
        if block_size % hash_unit != 0:
            raise InvalidConfigError(
                f"placement policy {self.name!r}: parameter 'hash_unit'={hash_unit} must "
                f"divide 'block_size'={block_size}"
            )
        if self.hit_alignment is None:
            object.__setattr__(self, "hit_alignment", hash_unit)
        else:
            hit = _config_int(self.name, "hit_alignment", self.hit_alignment, minimum=1)
            if hit % hash_unit != 0:
                raise InvalidConfigError(
                    f"placement policy {self.name!r}: parameter 'hit_alignment'={hit} must "
                    f"be a multiple of 'hash_unit'={hash_unit}"
                )
        if self.alignment is not None:
            _config_int(self.name, "alignment", self.alignment, minimum=1)
        _config_bool(self.name, "drop_draft_block", self.drop_draft_block)
        _config_int(self.name, "lookahead", self.lookahead, minimum=0)

    @property
    def hit_unit(self) -> int:
        """The effective cache-hit alignment ``h`` in tokens."""
        return self.hash_unit if self.hit_alignment is None else self.hit_alignment

    def position(self, seq_len: int) -> int:
        """Candidate position (tokens) for a chunk ending at ``seq_len``; 0 means none."""
        return vllm_align_position(
            seq_len, self.hit_unit, drop=self.drop_draft_block, lookahead=self.lookahead
        )

    def locate(self, query_start: int, query_end: int) -> tuple[int, int]:
        """``(query offset, block-table column)`` of the chunk's checkpoint, or ``(0, -1)``.

        The offset is ``p - query_start`` tokens; the column is ``cdiv(query_end, B) - 2``.
        """
        p = self.position(query_end)
        valid = vllm_align_valid(
            query_start,
            query_end,
            p,
            hash_unit=self.hash_unit,
            block_size=self.block_size,
            alignment=self.alignment,
        )
        if not valid:
            return 0, -1
        return p - query_start, cdiv(query_end, self.block_size) - 2

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        """``(p,)`` when the chunk holds a checkpoint (``start < p < end``), else ``()``."""
        offset, column = self.locate(chunk.start, chunk.end)
        return (chunk.start + offset,) if column >= 0 else ()


def vllm_align_batch(
    seq_lens: Sequence[int], query_lens: Sequence[int], policy: VllmAlign
) -> tuple[list[int], list[int]]:
    """Batch form of ``vllm-align``: per-row query offsets and block-table columns.

    Row ``i`` computes tokens ``[seq_lens[i] - query_lens[i], seq_lens[i])``. Returns
    ``(offsets, columns)``; a row without a checkpoint has offset 0 and column -1.

    Raises:
        InvalidTokenCountError: a count is not an ``int``, ``seq_len < 1``,
            ``query_len < 1``, ``query_len > seq_len``, or the lists differ in length.
        InvalidConfigError: ``policy`` is not a :class:`VllmAlign`.
    """
    if not isinstance(policy, VllmAlign):
        raise InvalidConfigError(
            f"vllm_align_batch needs a VllmAlign policy, got {type(policy).__name__}"
        )
    if len(seq_lens) != len(query_lens):
        raise InvalidTokenCountError(
            f"seq_lens and query_lens must have one entry per row, got {len(seq_lens)} "
            f"and {len(query_lens)} entries"
        )
    offsets: list[int] = []
    columns: list[int] = []
    for row, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        check_count(f"seq_lens[{row}]", seq_len, minimum=1)
        check_count(f"query_lens[{row}]", query_len, minimum=1)
        if query_len > seq_len:
            raise InvalidTokenCountError(
                f"row {row}: query_len={query_len} exceeds seq_len={seq_len}; a chunk cannot "
                "compute more tokens than the sequence holds"
            )
        offset, column = policy.locate(seq_len - query_len, seq_len)
        offsets.append(offset)
        columns.append(column)
    return offsets, columns


def batch_offsets(policy: PlacementPolicy, chunks: Sequence[PrefillChunk]) -> list[tuple[int, ...]]:
    """Per-row query offsets ``p - chunk.start`` (tokens) of ``policy.positions(chunk)``."""
    return [tuple(p - chunk.start for p in policy.positions(chunk)) for chunk in chunks]


# --- registry --------------------------------------------------------------------------

#: Placement policies by scenario-file name.
POLICIES: dict[str, Callable[..., PlacementPolicy]] = {
    VllmAlign.name: VllmAlign,
    BlockFloor.name: BlockFloor,
    Interval.name: Interval,
    Turns.name: Turns,
    Branch.name: Branch,
    VllmRetention.name: VllmRetention,
    ChunkEnd.name: ChunkEnd,
    ChunkGrid.name: ChunkGrid,
}


def _unknown_name_message(kind: str, name: object, known: Iterable[str]) -> str:
    known_sorted = sorted(known)
    message = f"unknown {kind} {name!r}"
    if isinstance(name, str):
        close = difflib.get_close_matches(name, known_sorted, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
    return message + f" (known: {', '.join(known_sorted)})"


def _check_params(
    name: str, factory: Callable[..., PlacementPolicy], params: dict[str, Any]
) -> None:
    """Reject unknown or missing keyword parameters with an :class:`InvalidConfigError`."""
    signature = inspect.signature(factory)
    accepted = {
        p.name: p
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    listing = ", ".join(accepted) or "none"
    if not takes_any:
        for param in params:
            if param not in accepted:
                close = difflib.get_close_matches(param, list(accepted), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise InvalidConfigError(
                    f"placement policy {name!r} has no parameter {param!r}{hint} "
                    f"(parameters: {listing})"
                )
    missing = [
        p
        for p, spec in accepted.items()
        if spec.default is inspect.Parameter.empty and p not in params
    ]
    if missing:
        raise InvalidConfigError(
            f"placement policy {name!r} needs parameter(s) {', '.join(map(repr, missing))} "
            f"(parameters: {listing})"
        )


def make_placement(name: str, **params: Any) -> PlacementPolicy:
    """Build the placement policy registered as ``name`` with keyword ``params``.

    Raises:
        UnknownPolicyError: ``name`` is not in :data:`POLICIES` (the message lists the
            known names and a near miss).
        InvalidConfigError: a parameter is unknown, missing, or has a bad value.
    """
    factory = POLICIES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise UnknownPolicyError(_unknown_name_message("placement policy", name, POLICIES))
    _check_params(name, factory, params)
    return factory(**params)
