"""What the two engine replays (:mod:`engines.vllm_replay`, :mod:`engines.sglang_replay`)
share: the request they serve and the model fields they read off hyckpt's model.

Both serve a list of requests one at a time through the engine's real cache code and
report each request's hit; what a request is, and which ``config.json`` fields of a
Mamba2 + full-attention model both engines read, does not depend on the engine. Standard
library only, like the replays' module level (they import their engine when they run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplayRequest:
    """One request as the engine sees it: prompt token ids and the tokens it generates.

    Attributes:
        request_id: unique id.
        prompt_token_ids: the prompt.
        output_token_ids: the tokens the model generates (at least one), in order; the
            last one is sampled but never fed back (it has no KV and no state).
    """

    request_id: str
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


def longest_request(requests: Sequence[ReplayRequest]) -> int:
    """Tokens of the longest request, prompt and output (1 when there is none): what the
    replays size the engine's context length from."""
    return max((len(r.prompt_token_ids) + len(r.output_token_ids) for r in requests), default=1)


def mamba2_model_fields(model: Any) -> dict[str, Any]:
    """The fields both replays' ``HybridModel`` take from a
    :class:`reference.sizes.ModelSizes` under the same names: layer counts, KV heads,
    the activation dtype and the Mamba2 ``config.json`` fields (the head size, named
    differently by each engine, and the state dtypes are the caller's)."""
    return {
        "name": model.name,
        "attention_layers": model.full_attention_layers,
        "mamba_layers": model.mamba2_layers,
        "num_kv_heads": model.num_key_value_heads,
        "dtype": model.dtype,
        "mamba_num_heads": model.mamba_num_heads,
        "mamba_head_dim": model.mamba_head_dim,
        "n_groups": model.mamba_n_groups,
        "ssm_state_size": model.mamba_d_state,
        "conv_kernel": model.mamba_d_conv,
    }
