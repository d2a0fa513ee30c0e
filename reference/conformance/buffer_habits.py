"""Buffer habits of real serving engines, for the exactness harness.

A clean harness hands storage and exporter dense, freshly allocated tensors and one
sequence per exporter call. Real engines do not, and bugs hide in the difference
(docs/SEMANTICS.md ST3, EX1-EX3, EX5). :class:`BufferHabits` switches each habit on for
:func:`reference.conformance.exactness.play`:

- **padded pools**: every live pool is a non-contiguous view into a larger buffer, as when
  a hybrid allocator carves recurrent and KV pools out of one padded cache; so are the
  hidden-state buffers the boundary row is captured from and restored into. The padding
  holds NaN, so code that addresses a pool as if it were dense reads NaN.
- **reallocation**: the engine replaces every live tensor with a new one of the same
  layout holding the same values (a cache resize, a CUDA-graph re-capture), once after
  building the storage and once between the two requests (the simulation: after building
  the storage, then the recurrent pools before every request). The retired tensors are
  filled with NaN, so a storage that kept them captures or restores NaN.
- **shared export**: the checkpointed sequence shares each exporter call with two
  neighbour sequences that have no checkpoint (destination -1), one before and one after
  it. The emitted states are picked by ``recurrent_rows`` from a tensor that does not
  follow the row order, and the token buffer ends in CUDA-graph padding. The neighbours'
  values are random, so writing them anywhere shows.
- **sliced inputs**: the raw conv inputs are a column slice of a wider input projection
  (NaN in the other columns), as in engines that split one ``in_proj`` output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.api import PrefillExporter, SnapshotStorage
from reference.conformance.habits import CLEAN as CLEAN
from reference.conformance.habits import HABIT_NAMES as HABIT_NAMES
from reference.conformance.habits import BufferHabits as BufferHabits
from reference.conformance.habits import habits_named as habits_named
from reference.state import LiveState

#: Extra elements per innermost row of a padded pool, and extra columns of a sliced input.
PAD = 3
#: Tokens of each neighbour sequence in a shared export, and of the graph padding after them.
NEIGHBOUR_TOKENS = 3
GRAPH_PADDING = 2


def padded(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` as a view into a NaN-filled buffer with :data:`PAD` extra
    elements after every innermost row: same shape and values, not contiguous."""
    if tensor.dim() == 0:
        return tensor.clone()
    buffer = torch.full((*tensor.shape[:-1], tensor.shape[-1] + PAD), torch.nan, dtype=tensor.dtype)
    view = buffer[..., : tensor.shape[-1]]
    view.copy_(tensor)
    return view


def _groups(live: LiveState) -> tuple[dict[str, torch.Tensor], ...]:
    return (live.recurrent, live.kv_pages, live.draft_kv_pages)


def pad_pools(live: LiveState) -> None:
    """Replace every live tensor of ``live`` with a :func:`padded` copy, in place."""
    for tensors in _groups(live):
        for name, tensor in tensors.items():
            tensors[name] = padded(tensor)


def reallocate(live: LiveState, habits: BufferHabits, *, pages: bool = True) -> None:
    """Move every live tensor of ``live`` into a new tensor of the same layout (padded
    when ``habits.padded_pools``) and fill the retired one with NaN. With ``pages=False``
    only the recurrent pools move (the KV page pools of a large cache are costly to copy)."""
    for tensors in _groups(live) if pages else (live.recurrent,):
        for name, old in tensors.items():
            tensors[name] = padded(old) if habits.padded_pools else old.clone()
            old.fill_(torch.nan)


def sliced(raw: torch.Tensor) -> torch.Tensor:
    """``raw [tokens, conv_dim]`` as columns ``[1, 1 + conv_dim)`` of a NaN-filled
    ``[tokens, conv_dim + PAD]`` projection."""
    projection = torch.full((raw.shape[0], raw.shape[1] + PAD), torch.nan, dtype=raw.dtype)
    view = projection[:, 1 : 1 + raw.shape[1]]
    view.copy_(raw)
    return view


@dataclass(frozen=True)
class ExportBatch:
    """One exporter call's per-row arguments for a layer (shapes as in
    :class:`~reference.api.PrefillExporter`)."""

    raw_inputs: torch.Tensor  # [total_tokens, conv_dim]
    cu_seqlens: torch.Tensor  # [rows + 1]
    initial_conv: torch.Tensor  # [rows, conv_dim, W]
    emitted_states: torch.Tensor  # [states, *state_shape]
    offsets: torch.Tensor  # [rows]
    destinations: torch.Tensor  # [rows]
    recurrent_rows: torch.Tensor | None  # [rows], or None: state i is row i's

    def arguments(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of ``PrefillExporter.export`` but the two slabs
        (``recurrent_rows`` only when set)."""
        found = {
            "raw_inputs": self.raw_inputs,
            "cu_seqlens": self.cu_seqlens,
            "initial_conv": self.initial_conv,
            "emitted_states": self.emitted_states,
            "offsets": self.offsets,
            "destinations": self.destinations,
        }
        if self.recurrent_rows is not None:
            found["recurrent_rows"] = self.recurrent_rows
        return found


def export_batch(
    habits: BufferHabits,
    raw: torch.Tensor,
    initial_conv: torch.Tensor,
    emitted_state: torch.Tensor,
    offset: int,
    destination: int,
    seed: int,
) -> ExportBatch:
    """The exporter arguments that store one sequence's checkpoint under ``habits``.

    Args:
        raw: the sequence's raw conv inputs of the chunk, ``[tokens, conv_dim]``.
        initial_conv: its conv window before the chunk, ``[conv_dim, W]``.
        emitted_state: its state at the checkpoint, ``[*state_shape]``.
        offset: tokens of the chunk before the checkpoint (``>= 1``).
        destination: the snapshot slot.
        seed: seeds the neighbours' random values.
    """
    if not habits.shared_export:
        raw_inputs = sliced(raw) if habits.sliced_inputs else raw
        return ExportBatch(
            raw_inputs=raw_inputs,
            cu_seqlens=torch.tensor([0, raw.shape[0]]),
            initial_conv=initial_conv[None],
            emitted_states=emitted_state[None],
            offsets=torch.tensor([offset]),
            destinations=torch.tensor([destination]),
            recurrent_rows=None,
        )
    gen = torch.Generator().manual_seed(seed)

    def noise(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=raw.dtype)

    conv_dim, n = raw.shape[1], NEIGHBOUR_TOKENS
    tokens = torch.cat(
        [noise(n, conv_dim), raw, noise(n, conv_dim), noise(GRAPH_PADDING, conv_dim)]
    )
    before = torch.stack([noise(*initial_conv.shape), initial_conv, noise(*initial_conv.shape)])
    # Rows: neighbour, the sequence, neighbour. States are stored sequence first, so a
    # state taken by row number (ignoring recurrent_rows) is the neighbour's.
    states = torch.stack([emitted_state, noise(*emitted_state.shape)])
    return ExportBatch(
        raw_inputs=sliced(tokens) if habits.sliced_inputs else tokens,
        cu_seqlens=torch.tensor([0, n, n + raw.shape[0], 2 * n + raw.shape[0]]),
        initial_conv=before,
        emitted_states=states,
        offsets=torch.tensor([n, offset, n]),
        destinations=torch.tensor([-1, destination, -1]),
        recurrent_rows=torch.tensor([-1, 0, 1]),
    )


def export_inside_chunk(
    storage: SnapshotStorage,
    exporter: PrefillExporter,
    habits: BufferHabits,
    snap: int,
    offset: int,
    raw_inputs: dict[str, torch.Tensor],
    initial_conv: dict[str, torch.Tensor],
    emitted: dict[str, torch.Tensor],
) -> None:
    """Store one sequence's recurrent checkpoint at a position strictly inside a chunk,
    as a serving engine does: every recurrent layer's conv window and state by the
    exporter (called the way ``habits`` say), the sliding-window rings by a copy, then
    :meth:`~reference.api.SnapshotStorage.mark_recurrent_captured`.

    Args:
        snap: the snapshot slot.
        offset: tokens of the chunk before the checkpoint (``>= 1``).
        raw_inputs: layer index (``"0"``) → the chunk's raw conv inputs ``[tokens, conv_dim]``.
        initial_conv: ``"<layer>.conv"`` → the conv window before the chunk ``[conv_dim, W]``.
        emitted: live-state name → its value at the checkpoint (the prefill's ``emitted``).
    """
    names = list(emitted)
    for name in names:
        layer, part = name.split(".")
        if part == "conv":
            state_name = next(n for n in names if n.startswith(f"{layer}.") and n != name)
            batch = export_batch(
                habits,
                raw_inputs[layer],
                initial_conv[name],
                emitted[state_name],
                offset=offset,
                destination=snap,
                seed=offset,
            )
            exporter.export(
                **batch.arguments(),
                conv_slab=storage.slab("recurrent", name),
                state_slab=storage.slab("recurrent", state_name),
            )
        elif part.startswith("ring"):  # sliding-window rings ride on the recurrent axis
            storage.slab("recurrent", name)[snap].copy_(emitted[name])
    storage.mark_recurrent_captured(snap)
