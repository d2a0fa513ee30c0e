"""The shipped models: :data:`MODELS`, each read from its published configuration.

Every value's source is in the model's ``source`` field and in ``docs/SIZES.md``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from reference.errors import InvalidConfigError
from reference.model_sizes import ModelSizes

# --- the registry ----------------------------------------------------------------------


def _count(items: Iterable[str], item: str) -> int:
    return sum(1 for x in items if x == item)


# nvidia/Nemotron-H-8B-Base-8K config.json: hybrid_override_pattern (M Mamba2, * attention,
# - MLP), 52 characters == num_hidden_layers.
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
# ai21labs/Jamba-v0.1: attention where i % attn_layer_period == attn_layer_offset (8, 4).
JAMBA_V01_LAYERS = tuple("attention" if i % 8 == 4 else "mamba" for i in range(32))
# Qwen3-Next: full attention every full_attention_interval (4) layers, at (i + 1) % 4 == 0.
QWEN3_NEXT_LAYERS = tuple(
    "linear_attention" if (i + 1) % 4 else "full_attention" for i in range(48)
)
# granite-4.0-h-micro / -tiny config.json layer_types: attention at layers 5, 15, 25, 35.
GRANITE_4_H_LAYERS = tuple("attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40))


def _gpt_oss_layers(n: int) -> tuple[str, ...]:
    # GptOssConfig: "sliding_attention" if (i + 1) % 2 else "full_attention".
    return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n))


GPT_OSS_20B_LAYERS = _gpt_oss_layers(24)
GPT_OSS_120B_LAYERS = _gpt_oss_layers(36)

_MAMBA_SSM_DEFAULTS = (
    "mamba_ssm.modules.mamba2.Mamba2 defaults d_state=128, d_conv=4, expand=2, headdim=64, "
    "ngroups=1 (github.com/state-spaces/mamba, mamba_ssm/modules/mamba2.py)"
)

MODELS: dict[str, ModelSizes] = {
    m.name: m
    for m in (
        ModelSizes(
            name="mamba2-2.7b",
            hf_id="state-spaces/mamba2-2.7b",
            source=(
                "config.json: d_model=2560, n_layer=64, vocab_size=50277, "
                "ssm_cfg={'layer': 'Mamba2'} (no other SSM field); the rest are "
                + _MAMBA_SSM_DEFAULTS
            ),
            hidden_size=2560,
            vocab_size=50277,
            num_hidden_layers=64,
            mamba2_layers=64,
            mamba_d_inner=2 * 2560,
            mamba_num_heads=2 * 2560 // 64,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=1,
            mamba_d_conv=4,
            total_params=2_700_000_000,
            active_params=2_700_000_000,
            params_source="nominal, from the model name (2.7B)",
            notes="pure SSM: no attention, so no partial-KV axis and no draft geometry",
        ),
        ModelSizes(
            name="nemotron-h-8b",
            hf_id="nvidia/Nemotron-H-8B-Base-8K",
            source=(
                "config.json: hidden_size=4096, num_hidden_layers=52, hybrid_override_pattern="
                f"{NEMOTRON_H_8B_PATTERN!r}, mamba_num_heads=128, mamba_head_dim=64, "
                "ssm_state_size=128, n_groups=8, conv_kernel=4, expand=2, "
                "num_attention_heads=32, num_key_value_heads=8, attention_head_dim=128, "
                "vocab_size=131072, max_position_embeddings=8192 (as reproduced in "
                "NVIDIA-NeMo/Megatron-Bridge "
                "tests/unit_tests/models/nemotronh/test_nemotron_h_bridge.py); "
                "intermediate_size (ffn_hidden_size)=21504 with squared-ReLU MLPs (NVIDIA "
                "Model-Optimizer's pruning docs and Megatron configs of the 8B)"
            ),
            hidden_size=4096,
            vocab_size=131072,
            num_hidden_layers=len(NEMOTRON_H_8B_PATTERN),
            mamba2_layers=NEMOTRON_H_8B_PATTERN.count("M"),
            full_attention_layers=NEMOTRON_H_8B_PATTERN.count("*"),
            mlp_only_layers=NEMOTRON_H_8B_PATTERN.count("-"),
            mamba_d_inner=128 * 64,
            mamba_num_heads=128,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=8,
            mamba_d_conv=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            ffn_layers=NEMOTRON_H_8B_PATTERN.count("-"),
            intermediate_size=21504,
            mlp_gated=False,
            max_position_embeddings=8192,
            total_params=8_000_000_000,
            active_params=8_000_000_000,
            params_source="nominal, from the model name and the Nemotron-H paper (8B)",
        ),
        ModelSizes(
            name="jamba-v0.1",
            hf_id="ai21labs/Jamba-v0.1",
            source=(
                "config.json (= transformers JambaConfig defaults, which the class docstring "
                "ties to ai21labs/Jamba-v0.1): hidden_size=4096, num_hidden_layers=32, "
                "attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16, mamba_d_conv=4, "
                "mamba_expand=2, num_attention_heads=32, num_key_value_heads=8, "
                "vocab_size=65536, num_experts=16, num_experts_per_tok=2"
            ),
            hidden_size=4096,
            vocab_size=65536,
            num_hidden_layers=len(JAMBA_V01_LAYERS),
            mamba1_layers=_count(JAMBA_V01_LAYERS, "mamba"),
            full_attention_layers=_count(JAMBA_V01_LAYERS, "attention"),
            mamba_d_inner=2 * 4096,
            mamba_d_state=16,
            mamba_d_conv=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=4096 // 32,
            ffn_layers=len(JAMBA_V01_LAYERS),
            moe_layers=16,
            total_params=52_000_000_000,
            active_params=12_000_000_000,
            num_experts=16,
            experts_per_token=2,
            params_source="model card: 12B active of 52B total",
            notes="Mamba1 layers: state [d_inner, d_state], conv over d_inner channels only",
        ),
        ModelSizes(
            name="qwen3-next-80b-a3b",
            hf_id="Qwen/Qwen3-Next-80B-A3B-Instruct",
            source=(
                "config.json (= transformers Qwen3NextConfig defaults, documented against "
                "Qwen/Qwen3-Next-80B-A3B-Instruct): hidden_size=2048, num_hidden_layers=48, "
                "full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, "
                "head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, "
                "linear_key_head_dim=128, linear_value_head_dim=128, "
                "linear_conv_kernel_dim=4, vocab_size=151936, num_experts=512, "
                "num_experts_per_tok=10 (plus one shared expert); MTP: one full-attention "
                "decoder layer (vLLM qwen3_next_mtp.py, num_nextn_predict_layers default 1); "
                "max_position_embeddings=262144 (the checkpoint's config.json as reproduced "
                "in public model notes, not transformers' default 32768; 262,144 tokens is "
                "the model card's native context)"
            ),
            hidden_size=2048,
            vocab_size=151936,
            num_hidden_layers=len(QWEN3_NEXT_LAYERS),
            gdn_layers=_count(QWEN3_NEXT_LAYERS, "linear_attention"),
            full_attention_layers=_count(QWEN3_NEXT_LAYERS, "full_attention"),
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            mtp_layers=1,
            max_position_embeddings=262144,
            ffn_layers=len(QWEN3_NEXT_LAYERS),
            moe_layers=len(QWEN3_NEXT_LAYERS),
            total_params=80_000_000_000,
            active_params=3_000_000_000,
            num_experts=512,
            experts_per_token=10,
            params_source="model card: 80B total, 3B activated",
            unconfirmed=(
                "mtp_layers=1: from vLLM's default (num_nextn_predict_layers=1) and the "
                "model card's 'Multi-Token Prediction'; the config.json field was not seen",
            ),
        ),
        ModelSizes(
            name="granite-4.0-h-micro",
            hf_id="ibm-granite/granite-4.0-h-micro",
            source=(
                "config.json: hidden_size=2048, num_hidden_layers=40, layer_types with "
                "attention at 5/15/25/35, num_attention_heads=32, num_key_value_heads=8, "
                "mamba_n_heads=64, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, "
                "mamba_d_conv=4, mamba_expand=2 (quoted in a third-party test of the raw "
                "config); model card table: embedding 2048, 4 attention / 36 Mamba2, "
                "attention head size 64, 32 heads, 8 KV heads, Mamba2 state 128, 64 Mamba2 "
                "heads, 3B parameters"
            ),
            hidden_size=2048,
            vocab_size=100352,
            num_hidden_layers=len(GRANITE_4_H_LAYERS),
            mamba2_layers=_count(GRANITE_4_H_LAYERS, "mamba"),
            full_attention_layers=_count(GRANITE_4_H_LAYERS, "attention"),
            mamba_d_inner=64 * 64,
            mamba_num_heads=64,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=1,
            mamba_d_conv=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=2048 // 32,
            ffn_layers=len(GRANITE_4_H_LAYERS),
            total_params=3_000_000_000,
            active_params=3_000_000_000,
            params_source="model card: 3B parameters, 3B active",
            unconfirmed=(
                "vocab_size=100352: the Granite 4.0 family value (seen for -h-tiny and the "
                "dense 4.0 models); not seen in -h-micro's own config.json",
            ),
        ),
        ModelSizes(
            name="granite-4.0-h-tiny",
            hf_id="ibm-granite/granite-4.0-h-tiny",
            source=(
                "config.json: hidden_size=1536, num_hidden_layers=40, layer_types with "
                "attention at 5/15/25/35, num_attention_heads=12, num_key_value_heads=4, "
                "mamba_n_heads=48, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, "
                "mamba_d_conv=4, mamba_expand=2, vocab_size=100352, num_local_experts=64, "
                "num_experts_per_tok=6 (quoted in third-party tests); model card table: "
                "attention head size 128, 48 Mamba2 heads, 7B parameters / 1B active"
            ),
            hidden_size=1536,
            vocab_size=100352,
            num_hidden_layers=len(GRANITE_4_H_LAYERS),
            mamba2_layers=_count(GRANITE_4_H_LAYERS, "mamba"),
            full_attention_layers=_count(GRANITE_4_H_LAYERS, "attention"),
            mamba_d_inner=48 * 64,
            mamba_num_heads=48,
            mamba_head_dim=64,
            mamba_d_state=128,
            mamba_n_groups=1,
            mamba_d_conv=4,
            num_attention_heads=12,
            num_key_value_heads=4,
            head_dim=1536 // 12,
            ffn_layers=len(GRANITE_4_H_LAYERS),
            moe_layers=len(GRANITE_4_H_LAYERS),
            total_params=7_000_000_000,
            active_params=1_000_000_000,
            num_experts=64,
            experts_per_token=6,
            params_source="model card: 7B parameters, 1B active",
            unconfirmed=(
                "num_experts=64, experts_per_token=6: quoted in third-party tests; the "
                "config.json itself was not seen",
            ),
        ),
        ModelSizes(
            name="falcon-h1-7b",
            hf_id="tiiuae/Falcon-H1-7B-Base",
            source=(
                "config.json: hidden_size=3072, num_hidden_layers=44, num_attention_heads=12, "
                "num_key_value_heads=2, head_dim=128, mamba_d_ssm=3072, mamba_n_heads=24, "
                "mamba_d_head=128, mamba_d_state=256, mamba_n_groups=1, mamba_d_conv=4, "
                "vocab_size=130048 (quoted in two third-party tests from the 7B configs); "
                "transformers FalconH1 docs table: H1 7B depth 44, dim 3072, 12 attention "
                "heads, 2 KV, 24 Mamba heads, d_head 128/128, d_state 256"
            ),
            hidden_size=3072,
            vocab_size=130048,
            num_hidden_layers=44,
            parallel_hybrid=True,
            mamba2_layers=44,
            full_attention_layers=44,
            mamba_d_inner=3072,
            mamba_num_heads=24,
            mamba_head_dim=128,
            mamba_d_state=256,
            mamba_n_groups=1,
            mamba_d_conv=4,
            num_attention_heads=12,
            num_key_value_heads=2,
            head_dim=128,
            ffn_layers=44,
            total_params=7_000_000_000,
            active_params=7_000_000_000,
            params_source="nominal, from the model name (7B)",
            notes="attention and Mamba2 run in parallel in every layer",
        ),
        ModelSizes(
            name="gpt-oss-20b",
            hf_id="openai/gpt-oss-20b",
            source=(
                "config.json: hidden_size=2880, num_hidden_layers=24, layer_types alternating "
                "sliding_attention/full_attention, sliding_window=128, num_attention_heads=64, "
                "num_key_value_heads=8, head_dim=64, vocab_size=201088, num_local_experts=32, "
                "experts_per_token=4, max_position_embeddings=131072 (transformers "
                "GptOssConfig, checkpoint openai/gpt-oss-20b; layer count from the "
                "repository config)"
            ),
            hidden_size=2880,
            vocab_size=201088,
            num_hidden_layers=len(GPT_OSS_20B_LAYERS),
            sliding_window_layers=_count(GPT_OSS_20B_LAYERS, "sliding_attention"),
            full_attention_layers=_count(GPT_OSS_20B_LAYERS, "full_attention"),
            sliding_window=128,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            max_position_embeddings=131072,
            ffn_layers=len(GPT_OSS_20B_LAYERS),
            moe_layers=len(GPT_OSS_20B_LAYERS),
            total_params=20_900_000_000,
            active_params=3_600_000_000,
            num_experts=32,
            experts_per_token=4,
            weight_bytes=int(12.8 * 2**30),
            params_source=(
                "OpenAI gpt-oss model card: 20.9B total, 3.6B active; checkpoint 12.8 GiB "
                "(MXFP4 MoE weights, the rest bfloat16)"
            ),
            unconfirmed=(
                "weight_bytes: the model card's checkpoint size as quoted by third parties; "
                "the card itself was not read here",
            ),
            notes="no recurrent layers: the recurrent axis is the sliding-window rings",
        ),
        ModelSizes(
            name="gpt-oss-120b",
            hf_id="openai/gpt-oss-120b",
            source=(
                "config.json (= transformers GptOssConfig defaults): hidden_size=2880, "
                "num_hidden_layers=36, alternating sliding_attention/full_attention, "
                "sliding_window=128, num_attention_heads=64, num_key_value_heads=8, "
                "head_dim=64, vocab_size=201088, num_local_experts=128, experts_per_token=4, "
                "max_position_embeddings=131072"
            ),
            hidden_size=2880,
            vocab_size=201088,
            num_hidden_layers=len(GPT_OSS_120B_LAYERS),
            sliding_window_layers=_count(GPT_OSS_120B_LAYERS, "sliding_attention"),
            full_attention_layers=_count(GPT_OSS_120B_LAYERS, "full_attention"),
            sliding_window=128,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            max_position_embeddings=131072,
            ffn_layers=len(GPT_OSS_120B_LAYERS),
            moe_layers=len(GPT_OSS_120B_LAYERS),
            total_params=116_800_000_000,
            active_params=5_100_000_000,
            num_experts=128,
            experts_per_token=4,
            weight_bytes=int(60.8 * 2**30),
            params_source=(
                "OpenAI gpt-oss model card: 116.8B total, 5.1B active; checkpoint 60.8 GiB "
                "(MXFP4 MoE weights, the rest bfloat16)"
            ),
            unconfirmed=(
                "weight_bytes: the model card's checkpoint size as quoted by third parties; "
                "the card itself was not read here",
            ),
            notes="no recurrent layers: the recurrent axis is the sliding-window rings",
        ),
    )
}
"""Every known model, by short name."""


def model_names() -> list[str]:
    """The registry's model names, in registry order."""
    return list(MODELS)


def get_model(name: str) -> ModelSizes:
    """The model called ``name`` in :data:`MODELS`.

    Raises:
        InvalidConfigError: for an unknown name; the message lists the known names and
            suggests the closest one.
    """
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        pass
    message = f"unknown model {name!r}; known models: {', '.join(MODELS)}"
    close = difflib.get_close_matches(str(name).lower(), list(MODELS), n=1, cutoff=0.5)
    if close:
        message += f"; did you mean {close[0]!r}?"
    raise InvalidConfigError(message)
