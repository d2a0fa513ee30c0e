"""A model's context window as an engine enforces it: which prompts it refuses on
arrival and where a request's output stops (``SimConfig.max_model_len``).

Both engines take the limit from the model's ``config.json`` by default
(``max_position_embeddings``, :attr:`reference.sizes.ModelSizes.max_position_embeddings`),
and apply it a little differently:

- **vLLM 0.33** (``length_limits = "vllm"``): ``InputProcessor`` refuses a prompt longer
  than ``max_model_len``, and one exactly that long since the output needs a token
  (``vllm/v1/engine/input_processor.py``); ``check_stop`` ends a request once
  ``num_tokens >= max_model_len`` (``FINISHED_LENGTH_CAPPED``,
  ``vllm/v1/core/sched/utils.py``). A prompt of ``p < L`` tokens gets at most ``L - p``
  output tokens.
- **SGLang 0.5.23** (``length_limits = "sglang"``): ``max_req_len = context_len - 1`` and
  ``max_req_input_len = max_req_len - 5`` (``TpModelWorker``, ``srt/managers/
  tp_worker.py``; the KV pool's size bounds both too, which the pool rule of
  :mod:`sim.engine.progress_guard` covers); ``validate_input_length`` refuses a prompt of
  ``max_req_input_len`` tokens or more (``srt/managers/utils.py``, without
  ``--allow-auto-truncate``), and ``Scheduler.init_req_max_new_tokens`` caps
  ``max_new_tokens`` at ``max_req_len - p - 1``. So a prompt of ``p < L - 6`` tokens gets
  at most ``L - 2 - p``.

A refused request counts in ``requests.rejected``; a request whose output the limit cut
counts in ``requests.length_capped`` (present in the result only when a limit is set).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.config import SimConfig

#: SGLang's margins below ``context_len``: ``max_req_len = context_len - 1``, prompts
#: below ``max_req_len - 5``, sequences up to ``max_req_len - 1``.
SGLANG_PROMPT_MARGIN = 6
SGLANG_SEQUENCE_MARGIN = 2


@dataclass(frozen=True, slots=True)
class LengthLimits:
    """What ``max_model_len`` allows, in tokens.

    Attributes:
        prompt_limit: a prompt of this many tokens or more is refused.
        sequence_limit: a request's prompt and output together stop at this many.
    """

    prompt_limit: int
    sequence_limit: int

    @classmethod
    def of(cls, config: SimConfig) -> LengthLimits | None:
        """The limits of ``config`` (``None`` without ``max_model_len``)."""
        limit = config.max_model_len
        if limit is None:
            return None
        if config.length_limits == "sglang":
            return cls(limit - SGLANG_PROMPT_MARGIN, limit - SGLANG_SEQUENCE_MARGIN)
        return cls(limit, limit)

    def refuses(self, prompt_tokens: int) -> bool:
        """Whether a prompt of ``prompt_tokens`` is refused on arrival."""
        return prompt_tokens >= self.prompt_limit

    def output_room(self, prompt_tokens: int) -> int:
        """The most output tokens a request of ``prompt_tokens`` (not refused) gets."""
        return self.sequence_limit - prompt_tokens
