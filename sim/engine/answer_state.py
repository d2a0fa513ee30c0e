"""Where a finished request's own state is cached (``cache_generated``; SEMANTICS H8a).

A request that finished holds KV and recurrent state for ``p = prompt + output - 1``
tokens (its last token was sampled, never fed). With ``generated_state_grid = 0`` its
state is captured at ``p`` (SGLang ``no_buffer``, Marconi). With a grid ``T > 0`` the
engine kept states only where decode reached the grid, as SGLang's ``extra_buffer``
strategy tracks a decode state every ``mamba_track_grid`` tokens and donates the latest at
the finish (``BatchResultProcessor._handle_finish_state_updated_req``,
``MambaComponent._select_finished_checkpoint``): the state is at ``floor(p / T) * T``
when that lies past the prompt, and there is none otherwise (the prompt's chunks keep
their own). All counts are tokens.
"""

from __future__ import annotations


def answer_state_position(prompt_len: int, computed: int, grid: int) -> int | None:
    """Position of the finished request's state: ``computed`` when ``grid == 0``, else
    ``floor(computed / grid) * grid`` if that exceeds ``prompt_len``, else ``None``."""
    if not grid:
        return computed
    position = computed // grid * grid
    return position if position > prompt_len else None
