"""Where a finished request's own state is cached (``cache_generated``; SEMANTICS H8).

A request that finished holds KV and recurrent state for ``p = prompt + output - 1``
tokens (its last token was sampled, never fed). With ``generated_state_grid = 0`` its
state is captured at ``p`` (SGLang ``no_buffer``, Marconi). With a grid ``T > 0`` the
engine kept states only where decode crossed the grid, as SGLang's ``extra_buffer``
strategy tracks decode states every ``mamba_track_grid`` tokens into a ping-pong buffer
and donates the latest at the finish (``BatchResultProcessor._handle_finish_state_updated_req``,
``MambaComponent._select_finished_checkpoint``): the state is at ``floor(p / T) * T``
when that lies past the prompt, and there is none otherwise. Decode tracking a state
frees the one the last prefill chunk tracked (the other ping-pong slot), so that chunk
captures nothing when decode will (:func:`decode_supersedes_last_chunk`). All counts are
tokens.
"""

from __future__ import annotations


def answer_state_position(prompt_len: int, computed: int, grid: int) -> int | None:
    """Position of the finished request's state: ``computed`` when ``grid == 0``, else
    ``floor(computed / grid) * grid`` if that exceeds ``prompt_len``, else ``None``."""
    if not grid:
        return computed
    position = computed // grid * grid
    return position if position > prompt_len else None


def decode_supersedes_last_chunk(prompt_len: int, output_tokens: int, grid: int) -> bool:
    """Whether decode will track a state past the prompt (``grid > 0``), so the state the
    last prefill chunk tracked is never cached."""
    computed = prompt_len + output_tokens - 1
    return bool(grid) and answer_state_position(prompt_len, computed, grid) is not None
