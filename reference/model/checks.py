"""Argument checks of the model API: each raises a typed error from :mod:`reference.errors`.

- token ids outside ``[0, vocab)``, negative positions, a ``start`` or ``emit_at``
  inconsistent with the call, a block table too short for the positions written:
  :class:`~reference.errors.InvalidTokenCountError`;
- a batch slot or page id outside its pool: :class:`~reference.errors.SlotOutOfRangeError`;
- a state whose tensors do not match the model (names, shapes, dtype), a block table
  that maps two positions to one page, a hidden row of the wrong width:
  :class:`~reference.errors.LayoutMismatchError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from reference.api import check_count
from reference.errors import InvalidTokenCountError, LayoutMismatchError, SlotOutOfRangeError
from reference.model.init import DTYPE

__all__ = [
    "check_batch_slot",
    "check_block_table",
    "check_emit_at",
    "check_hidden",
    "check_layout",
    "check_tokens",
]


def check_tokens(tokens: Iterable[object], vocab_size: int, what: str = "tokens") -> list[int]:
    """Token ids as a list of ``int``; each must be an ``int`` in ``[0, vocab_size)``."""
    ids: list[int] = []
    for index, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int):
            raise InvalidTokenCountError(
                f"{what}[{index}] must be an int token id, got {token!r} ({type(token).__name__})"
            )
        if not 0 <= token < vocab_size:
            raise InvalidTokenCountError(
                f"{what}[{index}] = {token} is outside the vocabulary [0, {vocab_size})"
            )
        ids.append(token)
    return ids


def check_batch_slot(batch_slot: object, batch_slots: int) -> int:
    """``batch_slot`` as an ``int`` in ``[0, batch_slots)`` (any ``>= 0`` when there is no
    recurrent state, ``batch_slots == 0``)."""
    if isinstance(batch_slot, bool) or not isinstance(batch_slot, int):
        raise SlotOutOfRangeError(f"batch_slot must be an int, got {batch_slot!r}")
    if batch_slot < 0 or (batch_slots and batch_slot >= batch_slots):
        raise SlotOutOfRangeError(
            f"batch_slot {batch_slot} is outside the live pool [0, {batch_slots}); "
            "allocate the state with more batch_slots"
        )
    return batch_slot


def check_emit_at(emit_at: Iterable[object], start: int, end: int) -> frozenset[int]:
    """Emit positions, each an ``int`` with ``start < p <= end``."""
    positions: set[int] = set()
    for value in emit_at:
        position = check_count("emit_at entry", value)
        if not start < position <= end:
            raise InvalidTokenCountError(
                f"emit_at position {position} is outside ({start}, {end}]: a call over "
                f"tokens [{start}, {end}) can only emit the states after positions it computes"
            )
        positions.add(position)
    return frozenset(positions)


def check_block_table(
    block_table: Sequence[object], num_pages: int, block_size: int, end: int
) -> torch.Tensor:
    """The block table as an int64 tensor, checked for positions ``0 .. end - 1``.

    Every entry must be a page id in ``[0, num_pages)``; the table must cover
    ``ceil(end / block_size)`` pages, with no page twice among them.
    """
    pages: list[int] = []
    for index, page in enumerate(block_table):
        if isinstance(page, bool) or not isinstance(page, int):
            raise SlotOutOfRangeError(f"block_table[{index}] must be an int page id, got {page!r}")
        if not 0 <= page < num_pages:
            raise SlotOutOfRangeError(
                f"block_table[{index}] = {page} is outside the page pool [0, {num_pages})"
            )
        pages.append(page)
    needed = -(-end // block_size) if block_size else 0
    if len(pages) < needed:
        raise InvalidTokenCountError(
            f"positions up to {end} need {needed} pages of {block_size} tokens, but the "
            f"block table has {len(pages)}; extend the block table"
        )
    if len(set(pages[:needed])) != needed:
        raise LayoutMismatchError(
            f"block table {pages[:needed]} maps two blocks of one sequence to the same page"
        )
    return torch.tensor(pages, dtype=torch.long)


def check_layout(
    kind: str,
    tensors: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple[int, ...]],
    leading: int,
) -> None:
    """``tensors`` has exactly the names of ``expected``, float64, with each trailing shape
    equal to the expected one after ``leading`` leading dims."""
    if set(tensors) != set(expected):
        raise LayoutMismatchError(
            f"state.{kind} has tensors {sorted(tensors)}, the model needs {sorted(expected)}; "
            "build the state with this model's new_state()"
        )
    for name, shape in expected.items():
        tensor = tensors[name]
        if tensor.dtype != DTYPE or tuple(tensor.shape[leading:]) != shape:
            raise LayoutMismatchError(
                f"state.{kind}[{name!r}] is {tensor.dtype} {tuple(tensor.shape)}; the model "
                f"needs {DTYPE} with trailing shape {shape}"
            )


def check_hidden(hidden: torch.Tensor, rows: int | None, d_model: int) -> None:
    """``hidden`` is float64 ``[rows, d_model]`` (``[d_model]`` when ``rows`` is None)."""
    expected: tuple[int, ...] = (d_model,) if rows is None else (rows, d_model)
    if not isinstance(hidden, torch.Tensor):
        raise LayoutMismatchError(
            f"hidden must be a {DTYPE} tensor of shape {expected}, got {type(hidden).__name__}"
        )
    if hidden.dtype != DTYPE or tuple(hidden.shape) != expected:
        raise LayoutMismatchError(
            f"hidden is {hidden.dtype} {tuple(hidden.shape)}, expected {DTYPE} {expected}"
        )
