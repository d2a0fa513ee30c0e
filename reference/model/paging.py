"""Reading and writing rows of a paged KV pool through a block table.

A pool is ``[num_pages, block_size, kv_heads, head_dim]``; a sequence's position ``t``
lives in page ``block_table[t // block_size]`` at row ``t % block_size``.
"""

from __future__ import annotations

import torch

__all__ = ["read_rows", "write_row", "write_rows"]


def write_row(
    pool: torch.Tensor, block_table: torch.Tensor, position: int, row: torch.Tensor
) -> None:
    """Store ``row [kv_heads, head_dim]`` for ``position`` (in place)."""
    block = pool.shape[1]
    page = int(block_table[position // block])
    pool[page, position % block].copy_(row)


def write_rows(
    pool: torch.Tensor, block_table: torch.Tensor, start: int, rows: torch.Tensor
) -> None:
    """Store ``rows [T, kv_heads, head_dim]`` for positions ``start .. start + T - 1``."""
    block = pool.shape[1]
    positions = torch.arange(start, start + rows.shape[0])
    pool[block_table[positions // block], positions % block] = rows


def read_rows(pool: torch.Tensor, block_table: torch.Tensor, count: int) -> torch.Tensor:
    """Rows of positions ``0 .. count - 1`` in position order, ``[count, kv_heads, head_dim]``.

    The result is a fresh contiguous tensor (its bits do not depend on which pages hold
    the rows).
    """
    block = pool.shape[1]
    pages = -(-count // block)
    gathered = pool.index_select(0, block_table[:pages])
    return gathered.reshape(pages * block, *pool.shape[2:])[:count].clone()
