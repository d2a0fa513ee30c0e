"""Engine presets: the settings that make a run mirror what one serving engine does.

``[cache] engine = "vllm" | "sglang" | "sglang-no-buffer" | "sglang-extra-buffer" |
"marconi"`` in a scenario sets, for each key the file does not set itself, the value
below; a key the file sets wins (an explicit override). Some values depend on the model
(vLLM's block size, SGLang's default strategy), so a preset is resolved for the run's
model. docs/SIMULATION.md ("Engine presets") cites the engine source each choice follows
and lists what still differs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from reference.sizes import ModelSizes, get_model, kv_bytes_per_token, recurrent_breakdown
from sim.engine.costs import GIB, GpuSpec

#: FlashAttention's kernel block alignment on CUDA (``get_supported_kernel_block_sizes``:
#: ``MultipleOf(16)``), which vLLM's default ``block_size`` 16 equals.
VLLM_KERNEL_BLOCK_ALIGNMENT = 16

#: SGLang's default ``mamba_full_memory_ratio`` (``arg_groups/fields/schedule.py``): the
#: Mamba pool gets ``r / (1 + r)`` of the memory left after weights.
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9


def vllm_block_size(model: ModelSizes) -> int:
    """The attention block size (tokens) vLLM 0.33 picks for a hybrid model, and with
    ``mamba_cache_mode = "align"`` its Mamba block size too.

    ``Platform._align_hybrid_block_size`` (vllm/platforms/interface.py) raises the block
    size to the smallest multiple ``a · ceil(mamba_page / (a · attn_page_1_token))`` of
    the kernel alignment ``a`` whose attention page (one layer, ``B`` tokens) holds one
    layer's Mamba state, then pads the Mamba page to equal it. Mamba2 and Mamba1 layers
    declare no prefill-checkpoint alignment, so ``a`` stays 16. A model without both
    recurrent and full-attention layers keeps 16.
    """
    recurrent_layers = model.mamba1_layers + model.mamba2_layers + model.gdn_layers
    if not recurrent_layers or not model.full_attention_layers:
        return VLLM_KERNEL_BLOCK_ALIGNMENT
    breakdown = recurrent_breakdown(model)
    state_per_layer = -(-(breakdown.conv + breakdown.state) // recurrent_layers)
    kv_per_token_per_layer = kv_bytes_per_token(model) // model.full_attention_layers
    align = VLLM_KERNEL_BLOCK_ALIGNMENT
    return align * -(-state_per_layer // (align * kv_per_token_per_layer))


def _vllm(model: ModelSizes, choose_dtype: bool = True) -> dict[str, object]:
    dtype: dict[str, object] = {}
    default = vllm_ssm_state_dtype(model) if choose_dtype else None
    # The block size follows the state as vLLM stores it (float32 doubles Nemotron-H's).
    block = vllm_block_size(_with_state_dtype(model, dtype, default))
    settings = dtype | {
        "cache.block_size": block,
        "placement.policy": "vllm-retention",
        # hash_unit defaults to the run's hash unit, which is the block size unless set.
        "placement.params": {"retention_interval": 0},
        "placement.workload_hints": False,
        "eviction.policy": "lru",
        "cache.cache_generated": True,
        "cache.generated_state": False,
        # MambaManager.allocate_new_blocks: a retained state is the request's own block.
        "cache.capture_all": True,
        # BlockHashToBlockMap (vllm/v1/core/block_pool.py) keeps every copy of a block.
        "cache.keep_block_copies": True,
        "cache.memory": "unified" if model.full_attention_layers else "split",
    }
    settings |= context_limit(model, "vllm")
    if model.full_attention_layers:
        # BlockPool.__init__ takes block 0 as its null block: the budget has one page less.
        settings["cache.reserved_pages"] = 1
        # MambaManager.remove_skipped_blocks frees a state's old block a step after the
        # state moved to a new one.
        settings["cache.state_handover"] = True
    # Scheduler._mamba_block_aligned_split: chunks end on blocks and at the junction.
    settings["cache.block_aligned_chunks"] = True
    # Align mode: the Mamba kernels read and write states in their cache blocks.
    settings["cache.states_in_place"] = True
    # MambaManager._remove_blocks_in_range frees a request's old states highest first.
    settings["cache.release_recency"] = True
    if model.full_attention_layers:
        # KVCacheCoordinator.free / BlockPool.free_blocks: a step's freed states wait in
        # the free queue one layer group after another.
        settings["cache.interleaved_free"] = True
        # MambaManager.get_num_blocks_to_allocate counts a chunk's checkpoint block with
        # its KV; Scheduler.schedule admits with full_sequence_must_fit
        # (scheduler_reserve_full_isl, on by default).
        settings["cache.required_captures"] = True
        settings["cache.admit_full_prompt"] = True
    return settings


def _sglang(model: ModelSizes, choose_dtype: bool = True) -> dict[str, object]:
    ratio = SGLANG_MAMBA_FULL_MEMORY_RATIO
    dtype: dict[str, object] = {}
    _with_state_dtype(model, dtype, sglang_ssm_state_dtype(model) if choose_dtype else None)
    return (
        dtype
        | {
            # Page size 1: the KV cache holds single tokens (_page_size_default in
            # arg_groups/overrides.py, Hopper's default fa3 attention backend).
            "cache.block_size": 1,
            "placement.policy": "chunk-end",
            "placement.params": {"hash_unit": 1},
            "placement.workload_hints": False,
            "eviction.policy": "lru",
            "cache.cache_generated": True,
            "cache.generated_state": True,
            "cache.memory": "split",
            "cache.checkpoint_share": ratio / (1 + ratio),
            # _handle_max_mamba_cache: int((budget * r / (1 + r) - R) // R) states, KV the rest.
            "cache.checkpoint_share_rule": "sglang",
            # HybridReqToTokenPool.alloc: a running request's own slot of the Mamba pool.
            "cache.running_states": 1,
            # Prefill and decode run in separate batches: a chunk is chunked_prefill_size.
            "cache.decodes_share_budget": False,
            # One radix tree: evicting a leaf's state deletes the leaf with its KV.
            "cache.drop_leaf_kv": True,
            # checkpoint_into_tree frees a request's duplicate KV and repoints it at the tree's.
            "cache.adopt_cached_blocks": True,
            # req.lock: a running request locks the node it has reached (its hit, then
            # its latest chunk's state) until release_kv_cache.
            "cache.hold_latest_checkpoint": True,
            # A chunk's state is copied in stream order and inserted into the tree when
            # the next step is planned (stash_chunked_request): a hit from the next step.
            "cache.captures_in_step": True,
        }
        | context_limit(model, "sglang")
    )


def context_limit(model: ModelSizes, rule: str) -> dict[str, object]:
    """The engine's default context window: vLLM's ``max_model_len`` and SGLang's
    ``context_length`` are the model config's ``max_position_embeddings``
    (``ModelConfig`` / ``_get_and_verify_max_len``, vllm/config/model.py; SGLang's
    ``get_context_length``, srt/utils/hf_transformers/common.py), applied by ``rule``
    (:mod:`sim.engine.length_limits`). Nothing for a model whose description has none."""
    if not model.max_position_embeddings:
        return {}
    return {
        "engine.max_model_len": model.max_position_embeddings,
        "engine.length_limits": rule,
    }


def vllm_ssm_state_dtype(model: ModelSizes) -> str | None:
    """The dtype vLLM 0.33 stores ``model``'s SSM state in by default
    (``--mamba-ssm-cache-dtype auto``), when it is not the model's own: float32 for
    Nemotron-H (``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``,
    ``vllm/model_executor/models/config.py``: the config's ``mamba_ssm_cache_dtype``, else
    float32, "the only one known to have no accuracy issues"); ``None`` (the model's
    dtype, which ``auto`` follows) otherwise. Checked by running vLLM: docs/SIMULATION.md
    §1c."""
    return "float32" if "nemotron-h" in model.hf_id.lower() else None


#: Models whose SGLang 0.5.23 config prices the recurrent state with
#: ``mamba2_state_dtype`` (``srt/configs/mamba_utils.py``: float32 unless the config or
#: ``SGLANG_MAMBA_SSM_DTYPE`` says otherwise): ``srt/configs/nemotron_h.py``,
#: ``falcon_h1.py``, ``qwen3_next.py`` (Hugging Face id fragments, lower case).
SGLANG_FLOAT32_STATE_MODELS = ("nemotron-h", "falcon-h1", "qwen3-next")


def sglang_ssm_state_dtype(model: ModelSizes) -> str | None:
    """The dtype SGLang 0.5.23 stores ``model``'s SSM state in by default, when it is not
    the model's own: float32 for the families of :data:`SGLANG_FLOAT32_STATE_MODELS`
    (assuming, as the shipped descriptions record nothing else, that the checkpoint's
    ``config.json`` names no ``mamba_ssm_dtype``); ``None`` otherwise."""
    hf_id = model.hf_id.lower()
    return "float32" if any(family in hf_id for family in SGLANG_FLOAT32_STATE_MODELS) else None


def _with_state_dtype(
    model: ModelSizes, settings: dict[str, object], dtype: str | None
) -> ModelSizes:
    """``model`` with the engine's state dtype, which ``settings`` then records."""
    if dtype is None or dtype == model.ssm_state_dtype:
        return model
    settings["cache.ssm_state_dtype"] = dtype
    return dataclasses.replace(model, ssm_state_dtype=dtype)


#: SGLang's default ``mamba_track_interval`` (``arg_groups/fields/exec_.py`` ``ExecMamba``):
#: decode tracks a state every this many tokens (rounded up to the checkpoint grid).
SGLANG_MAMBA_TRACK_INTERVAL = 256
#: FLA's chunk size, SGLang's ``mamba_cache_chunk_size`` for a model whose config names no
#: ``mamba_chunk_size`` (``arg_groups/overrides.py`` ``mamba_cache_chunk_size``).
SGLANG_FLA_CHUNK_SIZE = 64
#: The ``mamba_chunk_size`` SGLang reads for the shipped models on its extra-buffer list
#: (Hugging Face id fragment -> tokens), which sets the ``extra_buffer`` checkpoint grid.
#: Nemotron-H: its ``config.json``'s ``chunk_size`` 128 (published copies of the file;
#: ``NemotronHConfig._resolve_mamba_chunk_size`` maps it). Granite-4.0-H: 256 in its
#: ``config.json``, also ``GraniteMoeHybridConfig``'s default. Falcon-H1: 256,
#: ``FalconH1Config``'s default (``srt/configs/falcon_h1.py``), assumed unchanged by the
#: checkpoint. Qwen3-Next's config names none: FLA's 64. No hub access here to check.
SGLANG_MAMBA_CHUNK_SIZES = {"nemotron-h": 128, "granite-4.0-h": 256, "falcon-h1": 256}


def sglang_mamba_chunk_size(model: ModelSizes) -> int:
    """The ``mamba_chunk_size`` SGLang reads for ``model`` (:data:`SGLANG_MAMBA_CHUNK_SIZES`,
    else FLA's 64), tokens."""
    hf_id = model.hf_id.lower()
    return next(
        (size for family, size in SGLANG_MAMBA_CHUNK_SIZES.items() if family in hf_id),
        SGLANG_FLA_CHUNK_SIZE,
    )


def sglang_checkpoint_grids(model: ModelSizes, page_size: int = 1) -> tuple[int, int]:
    """``(G, TG)`` of SGLang 0.5.23's ``extra_buffer`` strategy for ``model`` (tokens).

    ``G = mamba_checkpoint_grid(P) = lcm(max(mamba_chunk_size, P), P)`` and ``TG =
    mamba_track_grid(P) = lcm(G, mamba_track_interval)`` (``runtime_context.py``), at page
    size ``P`` 1: SGLang's default attention backend on Hopper (``fa3``) keeps page size 1.
    """
    chunk = sglang_mamba_chunk_size(model)
    grid = math.lcm(max(chunk, page_size), page_size)
    return grid, math.lcm(grid, SGLANG_MAMBA_TRACK_INTERVAL)


def _sglang_extra_buffer(model: ModelSizes, choose_dtype: bool = True) -> dict[str, object]:
    grid, track_grid = sglang_checkpoint_grids(model)
    return _sglang(model, choose_dtype) | {
        "placement.policy": "chunk-grid",
        "placement.params": {"grid": grid, "hash_unit": 1},
        "cache.generated_state_grid": track_grid,
        "cache.kv_up_to_checkpoint": True,
        # Running requests capped at states // 5 (resolve_max_num_reqs).
        "cache.checkpoint_share_rule": "sglang-extra-buffer",
        # Its own slot and two ping-pong track slots (_alloc_ping_pong_buffer).
        "cache.running_states": 3,
        # The overlap scheduler, on with extra_buffer (no_buffer turns it off,
        # _mamba_radix_cache_resolution): event_loop_overlap plans the next batch before
        # it processes the last one's result, as vLLM's async scheduling does.
        "engine.async_scheduling": True,
    }


#: Models SGLang 0.5.23 runs with ``extra_buffer`` by default: its
#: ``_MAMBA_EXTRA_BUFFER_ARCHS`` (``arg_groups/overrides.py``) as Hugging Face id fragments
#: of hyckpt's shipped models (``NemotronHForCausalLM``, ``Qwen3NextForCausalLM``,
#: ``FalconH1ForCausalLM``, ``GraniteMoeHybridForCausalLM``); ``auto`` resolves to
#: ``no_buffer`` for the others (``_mamba_radix_cache_resolution``).
SGLANG_EXTRA_BUFFER_MODELS = ("nemotron-h", "qwen3-next", "falcon-h1", "granite-4.0-h")


def sglang_default_strategy(model: ModelSizes) -> str:
    """The Mamba strategy SGLang 0.5.23 picks for ``model`` with its defaults (overlap
    scheduling on, the Triton linear-attention backend): ``extra_buffer`` or
    ``no_buffer``."""
    hf_id = model.hf_id.lower()
    extra = any(family in hf_id for family in SGLANG_EXTRA_BUFFER_MODELS)
    return "extra_buffer" if extra else "no_buffer"


def _sglang_default(model: ModelSizes, choose_dtype: bool = True) -> dict[str, object]:
    if sglang_default_strategy(model) == "extra_buffer":
        return _sglang_extra_buffer(model, choose_dtype)
    return _sglang(model, choose_dtype)


def _marconi(model: ModelSizes, choose_dtype: bool = True) -> dict[str, object]:
    # Marconi prices the model's own state: nothing to choose.
    return {
        "placement.policy": "branch",
        "placement.params": {"end_of_input": False},
        "placement.workload_hints": False,
        "eviction.policy": "marconi",
        # Marconi's _delete_leaf frees a leaf node's KV with its state, and evict_v2 prices
        # a node by one state plus the KV of its whole sequence.
        "eviction.params": {
            "free_leaf_kv": True,
            "prefix_kv_bytes_per_token": kv_bytes_per_token(model),
        },
        "cache.cache_generated": True,
        "cache.generated_state": True,
        "cache.memory": "unified" if model.full_attention_layers else "split",
    }


def vllm_scheduling(gpu: GpuSpec, spec_tokens: int = 0) -> dict[str, object]:
    """What ``vllm serve`` schedules per step and runs at most on ``gpu`` by default:
    ``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``, vLLM 0.33) for the
    OpenAI server: ``max_num_batched_tokens`` / ``max_num_seqs`` 16384 / 1024 from 160 GiB
    of device memory, 8192 / 1024 from 70 GiB on a GPU that is not an A100 (H100, H200),
    2048 / 256 otherwise (A100: "setting large max_num_batched_tokens for A100 reduces
    throughput"). And what a running request holds of the block pool: its own state
    block in each Mamba group plus ``num_speculative_blocks`` = ``spec_tokens`` more with
    speculative decoding (``MambaBase.get_kv_cache_spec``,
    ``vllm/model_executor/layers/mamba/abstract.py``, ReplaySSM off as by default;
    ``MambaManager.get_num_blocks_to_allocate`` adds them in align mode). And that it
    schedules asynchronously (SEMANTICS H9f)."""
    memory = gpu.memory_bytes
    if memory >= 160 * GIB:
        budget, running = 16384, 1024
    elif memory >= 70 * GIB and "a100" not in gpu.name:
        budget, running = 8192, 1024
    else:
        budget, running = 2048, 256
    return {
        "cache.token_budget": budget,
        "engine.max_num_seqs": running,
        "cache.running_states": 1 + spec_tokens,
        # VllmConfig turns async scheduling on unless something rules it out
        # (vllm/config/vllm.py): EngineCore.step_with_batch_queue.
        "engine.async_scheduling": True,
        # A preempted request keeps its output: Request.num_tokens is prompt + output,
        # and Scheduler._mamba_block_aligned_split treats the replay of its output as
        # prefill (vllm/v1/core/sched/scheduler.py).
        "engine.preemption": "resume",
        # Scheduler.schedule schedules the waiting queue only `if not preempted_reqs`.
        "engine.admit_after_preemption": False,
    }


def sglang_scheduling(gpu: GpuSpec, spec_tokens: int = 0) -> dict[str, object]:
    """SGLang 0.5.23's default ``chunked_prefill_size`` on ``gpu``, its prefill chunk
    (``arg_groups/memory_hook.py``, the GPU-memory tiers: under 20 GiB 2048, under 60 GiB
    4096, under 160 GiB 8192 (H100, A100 80 GB, H200), else 16384). Its running requests
    are capped by the Mamba pool (``SimConfig.sglang_running_cap``), not set here, and
    what each holds of it is the strategy's (``cache.running_states``); speculative
    decoding's Mamba slots are not modelled. Its retraction (``preemption_policy``,
    ``preemption``, ``admit_after_preemption``): docs/SIMULATION.md §1b."""
    memory = gpu.memory_bytes
    if memory < 20 * GIB:
        chunk = 2048
    elif memory < 60 * GIB:
        chunk = 4096
    elif memory < 160 * GIB:
        chunk = 8192
    else:
        chunk = 16384
    return {
        "cache.token_budget": chunk,
        # reset_for_retract keeps output_ids: a retracted request prefills prompt + output.
        "engine.preemption": "resume",
        # ScheduleBatch.retract_decode: decoding requests only, fewest outputs first,
        # requeued at the back (Scheduler._add_request_to_queue); chunks never retract.
        "engine.preemption_policy": "sglang",
        # A step that retracts is a decode batch (update_running_batch runs only when
        # get_new_batch_prefill found nothing): it admits no one.
        "engine.admit_after_preemption": False,
        # get_next_batch_to_run: a prefill batch if one can be formed, else decode.
        "engine.mixed_batches": False,
        # PrefillAdder: admission leaves room for the running requests' future output.
        "engine.decode_reservation": "sglang",
        # SchedulePolicy._touch_waiting_prefixes: the waiting requests' prefixes stay warm.
        "engine.refresh_waiting_prefixes": True,
        # batch_is_full: after a NO_TOKEN refusal, no admission until a request leaves.
        "engine.pause_after_refusal": True,
        # prepare_for_extend allocates the batch's KV once PrefillAdder locked its hits.
        "engine.allocate_after_lookups": True,
        # Req.init_next_round_input matches (and stamps) before add_one_req decides.
        "engine.lookup_refreshes_prefix": True,
    }


def _no_scheduling(gpu: GpuSpec, spec_tokens: int = 0) -> dict[str, object]:
    return {}  # Marconi's simulator has no scheduler


@dataclass(frozen=True)
class EnginePreset:
    """One engine's settings, resolved for a model.

    Attributes:
        name: the scenario-file name.
        describe: a one-line summary (for docs and ``--help``).
        build: the dotted scenario keys (``"placement.policy"``) and their values for a
            model, and whether the preset chooses the engine's state dtype (``False``:
            the file set it, and the model already carries it).
        schedule: the engine's settings that depend on the deployment: on a GPU (its
            prefill chunk or step budget, ``cache.token_budget``, its running-request
            limit, ``engine.max_num_seqs``, which depend on the GPU's memory) serving
            ``spec_tokens`` speculative tokens (vLLM's running states).
    """

    name: str
    describe: str
    build: Callable[[ModelSizes, bool], dict[str, object]]
    schedule: Callable[[GpuSpec, int], dict[str, object]]

    def settings(
        self, model: str | ModelSizes, state_dtype: str | None = None, *, fixed: object = None
    ) -> Mapping[str, object]:
        """The preset's dotted keys and values for ``model`` (a shipped model's name, or a
        model; for a deployment over several GPUs, one GPU's share of it, as an engine
        sizes its pages per worker). ``fixed`` (the file's ``cache.ssm_state_dtype``, when
        it sets one) keeps the preset from choosing the engine's default state dtype;
        ``state_dtype`` is then the dtype the settings are computed for (``None``: the
        model's own)."""
        sizes = get_model(model) if isinstance(model, str) else model
        if fixed is not None and state_dtype is not None:
            sizes = dataclasses.replace(sizes, ssm_state_dtype=state_dtype)
        return self.build(sizes, fixed is None)

    def scheduling(self, gpu: GpuSpec, spec_tokens: int = 0) -> Mapping[str, object]:
        """The preset's deployment-dependent keys for ``gpu`` and ``spec_tokens``
        (``schedule``)."""
        return self.schedule(gpu, spec_tokens)


PRESETS: dict[str, EnginePreset] = {
    preset.name: preset
    for preset in (
        EnginePreset(
            "vllm",
            "vLLM 0.33 align mode: Mamba state kept at each prompt's last block boundary "
            "and at shared-prefix junctions, decoded KV cached, one block pool, LRU",
            _vllm,
            vllm_scheduling,
        ),
        EnginePreset(
            "sglang",
            "SGLang 0.5.23 as it runs the model by default: sglang-extra-buffer for the "
            "models on its extra-buffer list (Nemotron-H, Qwen3-Next, Falcon-H1, "
            "Granite-4.0-H), sglang-no-buffer for the others",
            _sglang_default,
            sglang_scheduling,
        ),
        EnginePreset(
            "sglang-no-buffer",
            "SGLang 0.5.23 no_buffer: state at the end of every chunk and of every finished "
            "request, a Mamba pool of its own (ratio 0.9), LRU",
            _sglang,
            sglang_scheduling,
        ),
        EnginePreset(
            "sglang-extra-buffer",
            "SGLang 0.5.23 extra_buffer (its default for Nemotron-H and the other models on "
            "its list): one state per chunk on a grid, the last decode-tracked state of "
            "every finished request, KV cached up to the state, LRU",
            _sglang_extra_buffer,
            sglang_scheduling,
        ),
        EnginePreset(
            "marconi",
            "Marconi: states at branch-off points and at the end of each sequence, one "
            "byte capacity, its FLOP-aware eviction with alpha tuned by bootstrap replay",
            _marconi,
            _no_scheduling,
        ),
    )
}

#: The names a scenario's ``cache.engine`` may take ("none": no preset).
PRESET_NAMES = ("none", *PRESETS)
