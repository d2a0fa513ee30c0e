"""vLLM 0.33's own prefix-cache manager, replayed request by request (a fidelity oracle).

hyckpt's ``engine = "vllm"`` preset (docs/SIMULATION.md, "Engine presets") was derived by
reading vLLM's code. This module *runs* that code: it builds vLLM's real
:class:`vllm.v1.core.kv_cache_manager.KVCacheManager` for a hybrid Mamba2 + attention
model and serves a list of requests through it one at a time, the way vLLM's scheduler
serves a request that is alone in the engine, and reports each request's prefix-cache
hit. ``engines.fidelity`` compares those hits with hyckpt's cache-only replay.

What is vLLM's own code and what stands in for it, step by step:

1. **Specs.** The Mamba2 state shapes and dtypes come from
   ``NemotronHForCausalLM.get_mamba_state_shape_from_config`` /
   ``get_mamba_state_dtype_from_config`` (``vllm/model_executor/models/nemotron_h.py``),
   called with a minimal config object that carries the model's ``config.json`` fields.
   vLLM's default SSM-state dtype for Nemotron-H is applied by
   ``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``
   (``vllm/model_executor/models/config.py``) unless a dtype is given. The layer specs
   are built as ``Attention.get_kv_cache_spec`` (``FullAttentionSpec``,
   ``vllm/model_executor/layers/attention/attention.py``) and ``MambaBase`` /
   ``MambaMixer2.get_kv_cache_spec`` (``MambaSpec`` with one prefill-checkpoint block,
   alignment 1; ``vllm/model_executor/layers/mamba/{abstract,mamba_mixer2}.py``) build them.
2. **Block size.** ``Platform._align_hybrid_block_size`` (``vllm/platforms/interface.py``)
   runs for real; the attention backend it consults is a stand-in declaring what
   FlashAttention declares on CUDA (``get_supported_kernel_block_sizes`` =
   ``[MultipleOf(16)]``, ``customize_spec`` the identity,
   ``vllm/v1/attention/backends/flash_attn.py``).
3. **Groups and pool size.** ``get_kv_cache_groups`` and
   ``get_kv_cache_config_from_groups`` (``vllm/v1/core/kv_cache_planning.py``) group the
   layers (here 4 attention layers -> 1 full-attention group, 24 Mamba layers -> 6 Mamba
   groups of 4) and turn the byte budget into ``num_blocks`` exactly as vLLM turns the
   memory left after profiling into blocks; ``resolve_kv_cache_block_sizes``
   (``vllm/v1/core/kv_cache_utils.py``) gives the scheduler and hash block sizes.
4. **Manager.** ``KVCacheManager`` with the arguments ``Scheduler.__init__``
   (``vllm/v1/core/sched/scheduler.py``) passes (prefix caching on, no EAGLE, no
   connector, ``prefix_cache_retention_interval = 0`` from ``CacheConfig``).
5. **Requests.** ``vllm.v1.request.Request`` with the block hasher of
   ``get_request_block_hasher`` (sha256, ``init_none_hash``), as ``EngineCore`` makes it.
6. **Scheduling (the stand-in).** :meth:`VllmCacheReplay.serve` is the part of
   ``Scheduler.schedule`` / ``update_from_output`` a lone request goes through, and only
   that: ``new_step_starts``; on admission ``KVCacheManager.get_computed_blocks`` (the hit,
   and ``request.shared_prefix_boundary``), the chunk ``min(num_tokens - hit,
   max_num_batched_tokens)`` clipped by the real ``Scheduler._mamba_block_aligned_split``
   (called on a stand-in ``self`` holding the attributes ``Scheduler.__init__`` derives),
   ``allocate_slots`` with the waiting-queue arguments (``full_sequence_must_fit`` =
   ``scheduler_reserve_full_isl``); later steps the running-queue call
   ``allocate_slots(request, n)``; after a step that reaches the end of the known tokens
   one output token is appended (``Request.append_output_token_ids``) and
   ``check_stop`` (``vllm/v1/core/sched/utils.py``) decides the end; then
   ``KVCacheManager.free``. Decode is stepped one token at a time, as vLLM does: at each
   block crossing the align-mode Mamba manager moves the running state to a new block
   and frees the one before (``MambaManager.allocate_new_blocks``,
   ``remove_skipped_blocks``), so for a step it holds two blocks per Mamba group. One
   ``allocate_slots`` for the whole answer gave the same hits on the engine-presets
   workload (600 requests, 2 and 5 GiB) in a twentieth of the time, but holds the pool
   differently, so the faithful per-step path is the one used.

Nothing of the scheduler's batching, preemption, connectors, encoder inputs, speculative
decoding or async scheduling is modelled: with one request at a time none of it applies.
"""

from __future__ import annotations

import os
import time
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.replay_common import ReplayRequest, longest_request, mamba2_model_fields

#: The vLLM release this driver was written against.
VLLM_VERSION = "0.33"
#: FlashAttention's kernel block alignment on CUDA: ``get_supported_kernel_block_sizes``.
FLASH_ATTN_KERNEL_ALIGNMENT = 16
#: The default attention-layout preference (``_DEFAULT_LAYOUT_PREFERENCE``,
#: ``vllm/v1/attention/backends/utils.py``); FlashAttention declares none.
DEFAULT_KV_CACHE_LAYOUT = "LBNHC"


def import_vllm() -> types.ModuleType:
    """Import vLLM quietly (its logger at ERROR unless the caller set a level).

    Raises:
        ImportError: vLLM is not installed, or not a 0.33.x release.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    if not version.startswith(VLLM_VERSION + "."):
        raise ImportError(f"engines.vllm_replay needs vllm {VLLM_VERSION}.x, found {version}")
    return vllm


@dataclass(frozen=True)
class HybridModel:
    """The hybrid Mamba2 + full-attention model, in the fields vLLM reads.

    Attributes:
        name: for reports.
        attention_layers: full-attention layers.
        mamba_layers: Mamba2 layers.
        num_kv_heads, head_size: attention geometry (``config.json``).
        dtype: activation and KV dtype (``torch`` name, e.g. ``"bfloat16"``).
        mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size, conv_kernel: the
            Mamba2 fields of a Nemotron-H ``config.json``.
        ssm_state_dtype: the SSM-state dtype; ``None`` lets vLLM choose
            (``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``: float32).
    """

    name: str
    attention_layers: int
    mamba_layers: int
    num_kv_heads: int
    head_size: int
    dtype: str
    mamba_num_heads: int
    mamba_head_dim: int
    n_groups: int
    ssm_state_size: int
    conv_kernel: int
    ssm_state_dtype: str | None = None

    @classmethod
    def from_hyckpt(cls, model: Any, ssm_state_dtype: str | None = "model") -> HybridModel:
        """From a :class:`reference.sizes.ModelSizes` (Mamba2 + full attention only).

        ``ssm_state_dtype``: ``"model"`` keeps hyckpt's dtype, ``None`` lets vLLM pick its
        default, anything else is a ``torch`` dtype name.

        Raises:
            ValueError: the model has other recurrent or attention layers.
        """
        others = (model.mamba1_layers, model.gdn_layers, model.sliding_window_layers)
        if any(others) or not model.mamba2_layers or not model.full_attention_layers:
            raise ValueError(
                f"{model.name}: the driver models Mamba2 + full attention only "
                f"(mamba1={model.mamba1_layers}, gdn={model.gdn_layers}, "
                f"swa={model.sliding_window_layers}, mamba2={model.mamba2_layers}, "
                f"attention={model.full_attention_layers})"
            )
        state = model.ssm_state_dtype if ssm_state_dtype == "model" else ssm_state_dtype
        return cls(**mamba2_model_fields(model), head_size=model.head_dim, ssm_state_dtype=state)


@dataclass
class RequestHit:
    """What one request got from vLLM's prefix cache.

    Attributes:
        request_id: the request.
        prompt_tokens: its prompt length.
        hit_tokens: ``num_new_local_computed_tokens`` of ``get_computed_blocks``.
        shared_prefix_boundary: the junction ``get_computed_blocks`` reported (0: none).
        chunks: the prefill chunks the scheduler made (tokens each).
        admitted: ``False`` when ``allocate_slots`` refused the lone request.
    """

    request_id: str
    prompt_tokens: int
    hit_tokens: int
    shared_prefix_boundary: int = 0
    chunks: tuple[int, ...] = ()
    admitted: bool = True


@dataclass
class PoolPlan:
    """How vLLM laid out the budget.

    Attributes:
        block_size: attention (and align-mode Mamba) block size, tokens.
        hash_block_size: ``Request.block_hashes`` granularity, tokens.
        scheduler_block_size: LCM of the groups' block sizes, tokens.
        num_blocks: blocks of the shared pool (block 0 is the null block).
        bytes_per_block: bytes one block id takes across all groups.
        groups: one line per KV-cache group.
        mamba_page_size_padded: the padded Mamba page, bytes.
        ssm_state_dtype: the SSM-state dtype used.
    """

    block_size: int
    hash_block_size: int
    scheduler_block_size: int
    num_blocks: int
    bytes_per_block: int
    groups: list[str] = field(default_factory=list)
    mamba_page_size_padded: int | None = None
    ssm_state_dtype: str = ""


class _FlashAttentionStandIn:
    """What ``Platform._align_hybrid_block_size`` asks of FlashAttention on CUDA."""

    @staticmethod
    def customize_spec(spec: Any) -> Any:
        return spec

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        from vllm.v1.attention.backend import MultipleOf

        return [MultipleOf(FLASH_ATTN_KERNEL_ALIGNMENT)]

    @staticmethod
    def is_ssm() -> bool:
        return False


def _model_stand_in(model: HybridModel, cache_config: Any) -> types.SimpleNamespace:
    """A minimal ``VllmConfig`` for the model-class helpers and the block-size alignment:
    only the fields they read (``config.json`` fields, dtypes, TP 1, no drafts)."""
    import torch

    hf_config = types.SimpleNamespace(
        mamba_num_heads=model.mamba_num_heads,
        mamba_head_dim=model.mamba_head_dim,
        n_groups=model.n_groups,
        ssm_state_size=model.ssm_state_size,
        conv_kernel=model.conv_kernel,
    )
    model_config = types.SimpleNamespace(
        hf_config=hf_config,
        dtype=getattr(torch, model.dtype),
        use_mla=False,
        architecture="NemotronHForCausalLM",
        model_impl="auto",
        convert_type="none",
        get_num_kv_heads=lambda parallel_config: model.num_kv_heads,
        get_head_size=lambda: model.head_size,
    )
    return types.SimpleNamespace(
        cache_config=cache_config,
        model_config=model_config,
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
        compilation_config=types.SimpleNamespace(static_forward_context={}),
        num_speculative_tokens=0,
    )


class VllmCacheReplay:
    """vLLM's ``KVCacheManager`` for ``model`` in ``budget_bytes``, served one request at a
    time (module docstring: what is vLLM's code, what stands in).

    Args:
        model: the hybrid model.
        budget_bytes: memory for the KV cache (what vLLM has left after profiling).
        token_budget: ``max_num_batched_tokens`` (chunk size).
        max_model_len: longest request (prompt + output); vLLM's ``max_model_len``.
    """

    def __init__(
        self,
        model: HybridModel,
        budget_bytes: int,
        token_budget: int = 8192,
        max_model_len: int = 1 << 20,
    ) -> None:
        import_vllm()
        import torch
        from vllm.config import CacheConfig, DeviceConfig, VllmConfig
        from vllm.model_executor.models.config import NemotronHForCausalLMConfig
        from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
        from vllm.platforms.interface import Platform
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_planning import (
            get_kv_cache_config_from_groups,
            get_kv_cache_groups,
        )
        from vllm.v1.core.kv_cache_utils import (
            get_request_block_hasher,
            init_none_hash,
            resolve_kv_cache_block_sizes,
        )
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

        self.model = model
        self.token_budget = token_budget
        self.max_model_len = max_model_len
        # CacheConfig as `vllm serve --enable-prefix-caching` on a hybrid model leaves it:
        # mamba_cache_mode "align" (the only mode with prefix caching), retention 0.
        cache_config = CacheConfig(
            block_size=FLASH_ATTN_KERNEL_ALIGNMENT,
            enable_prefix_caching=True,
            mamba_cache_mode="align",
            mamba_ssm_cache_dtype=model.ssm_state_dtype or "auto",
        )
        # vllm/model_executor/models/config.py: NemotronH's default SSM dtype (float32).
        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(
            cache_config=cache_config, hf_config=types.SimpleNamespace()
        )
        stand_in = _model_stand_in(model, cache_config)

        class _Platform(Platform):
            @classmethod
            def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
                return [_FlashAttentionStandIn]

        # vllm/platforms/interface.py: raises block_size until an attention page holds a
        # Mamba state; in align mode mamba_block_size = block_size; pads the Mamba page.
        align = _Platform._align_hybrid_block_size
        align(stand_in, _FlashAttentionStandIn)
        block_size = cache_config.block_size
        dtype = getattr(torch, model.dtype)
        attention = FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=model.num_kv_heads,
            head_size=model.head_size,
            dtype=dtype,
        )
        mamba = MambaSpec(
            shapes=tuple(NemotronHForCausalLM.get_mamba_state_shape_from_config(stand_in)),
            dtypes=NemotronHForCausalLM.get_mamba_state_dtype_from_config(stand_in),
            block_size=cache_config.mamba_block_size,
            page_size_padded=cache_config.mamba_page_size_padded,
            mamba_cache_mode="align",
            num_speculative_blocks=0,
            # MambaMixer2.get_kv_cache_spec: the block-boundary state is exported from
            # inside the forward pass.
            num_prefill_checkpoint_blocks=1,
            prefill_checkpoint_alignment=1,
        )
        layers = model.attention_layers + model.mamba_layers
        # Which layer is which does not matter to the cache: attention layers first.
        specs: dict[str, Any] = {
            f"model.layers.{i}.mixer": attention if i < model.attention_layers else mamba
            for i in range(layers)
        }
        vllm_config = VllmConfig(cache_config=cache_config, device_config=DeviceConfig("cpu"))
        cache_config.kv_cache_layout = DEFAULT_KV_CACHE_LAYOUT
        # VllmConfig.__post_init__ turns the hybrid KV-cache manager off only on platforms
        # without it (this CPU machine); on CUDA it stays on, as for a served model.
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False
        groups = get_kv_cache_groups(vllm_config, specs)
        kv_cache_config = get_kv_cache_config_from_groups(vllm_config, groups, budget_bytes)
        # EngineCore._initialize_kv_caches: the block sizes the scheduler gets.
        vllm_config.cache_config.enable_prefix_caching = True
        scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(
            kv_cache_config, vllm_config
        )
        kv_cache_config.hash_block_size = hash_block_size
        self.kv_cache_config = kv_cache_config
        # What vLLM's start-up memory check reads (check_enough_kv_cache_memory).
        self.vllm_config, self.kv_cache_specs = vllm_config, specs
        self.plan = PoolPlan(
            block_size=block_size,
            hash_block_size=hash_block_size,
            scheduler_block_size=scheduler_block_size,
            num_blocks=kv_cache_config.num_blocks,
            bytes_per_block=budget_bytes // max(kv_cache_config.num_blocks, 1)
            if not kv_cache_config.kv_cache_tensors
            else kv_cache_config.kv_cache_tensors[0].size // kv_cache_config.num_blocks,
            groups=[
                f"{type(g.kv_cache_spec).__name__}(block_size={g.kv_cache_spec.block_size}, "
                f"page={g.kv_cache_spec.page_size_bytes}) x{len(g.layer_names)} layers"
                for g in kv_cache_config.kv_cache_groups
            ],
            mamba_page_size_padded=cache_config.mamba_page_size_padded,
            ssm_state_dtype=str(cache_config.mamba_ssm_cache_dtype),
        )
        scheduler_config = vllm_config.scheduler_config
        # Scheduler.__init__: the manager's arguments (no EAGLE, no MTP, no connector).
        self.manager = KVCacheManager(
            kv_cache_config=kv_cache_config,
            max_model_len=max_model_len,
            max_in_flight_tokens=token_budget,
            enable_caching=True,
            use_eagle=False,
            num_hash_lookahead_tokens=0,
            num_prefill_lookahead=0,
            log_stats=False,
            enable_kv_cache_events=False,
            dcp_world_size=1,
            pcp_world_size=1,
            scheduler_block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            watermark=scheduler_config.watermark,
            enable_mamba_shared_prefix_checkpoint=(
                cache_config.enable_mamba_shared_prefix_checkpoint
            ),
        )
        self.scheduler_reserve_full_isl = scheduler_config.scheduler_reserve_full_isl
        self._split_self = self._scheduler_stand_in(
            cache_config, scheduler_config, kv_cache_config, scheduler_block_size, hash_block_size
        )
        # EngineCore.__init__: the request block hasher.
        hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(hash_block_size, hash_fn, 0)
        self.steps = 0

    def _scheduler_stand_in(
        self,
        cache_config: Any,
        scheduler_config: Any,
        kv_cache_config: Any,
        scheduler_block_size: int,
        hash_block_size: int,
    ) -> types.SimpleNamespace:
        """The attributes ``Scheduler._mamba_block_aligned_split`` reads, derived as
        ``Scheduler.__init__`` derives them (no EAGLE, no lookahead hashes)."""
        from vllm.v1.kv_cache_interface import MambaSpec

        mamba_specs = [
            g.kv_cache_spec
            for g in kv_cache_config.kv_cache_groups
            if isinstance(g.kv_cache_spec, MambaSpec)
        ]
        partial_hit = (
            hash_block_size < scheduler_block_size
            and self.manager.coordinator.enable_partial_hash_hits
        )
        return types.SimpleNamespace(
            cache_config=cache_config,
            scheduler_config=scheduler_config,
            block_size=scheduler_block_size,
            hash_block_size=hash_block_size,
            max_num_scheduled_tokens=self.token_budget,
            use_eagle_block_drop=False,
            num_hash_lookahead_tokens=0,
            mamba_partial_cache_hit=partial_hit,
            mamba_prefill_checkpoint_alignment=mamba_specs[0].prefill_checkpoint_alignment,
            mamba_has_prefill_checkpoint_blocks=all(
                s.num_prefill_checkpoint_blocks > 0 for s in mamba_specs
            ),
            mamba_shared_prefix_checkpoint=(
                partial_hit and self.manager.mamba_shared_prefix_checkpoint
            ),
        )

    def _split(self, request: Any, num_new_tokens: int, num_new_local_computed: int = 0) -> int:
        """``Scheduler._mamba_block_aligned_split`` (the real method, on the stand-in)."""
        from vllm.v1.core.sched.scheduler import Scheduler

        split = Scheduler._mamba_block_aligned_split
        return int(split(self._split_self, request, num_new_tokens, num_new_local_computed, 0))

    def _make_request(self, item: ReplayRequest) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        return Request(
            request_id=item.request_id,
            prompt_token_ids=list(item.prompt_token_ids),
            sampling_params=SamplingParams(max_tokens=len(item.output_token_ids)),
            pooling_params=None,
            block_hasher=self._hasher,
        )

    def serve(self, item: ReplayRequest) -> RequestHit:
        """Serve ``item`` alone, from admission to ``free``; its hit (module docstring, 6)."""
        from vllm.v1.core.sched.utils import check_stop
        from vllm.v1.request import RequestStatus

        if not item.output_token_ids:
            raise ValueError(f"{item.request_id}: a request generates at least one token")
        manager = self.manager
        request = self._make_request(item)
        # Scheduler.schedule, waiting queue: the local prefix-cache lookup.
        manager.new_step_starts()
        self.steps += 1
        blocks, hit, request.shared_prefix_boundary = manager.get_computed_blocks(request)
        result = RequestHit(
            item.request_id, request.num_prompt_tokens, hit, request.shared_prefix_boundary
        )
        num_new = min(request.num_tokens - hit, self.token_budget)
        num_new = self._split(request, num_new, hit)
        new_blocks = None
        if num_new > 0:
            new_blocks = manager.allocate_slots(
                request,
                num_new,
                num_new_computed_tokens=hit,
                new_computed_blocks=blocks,
                num_lookahead_tokens=0,
                num_external_computed_tokens=0,
                full_sequence_must_fit=self.scheduler_reserve_full_isl,
                has_scheduled_reqs=False,
            )
        if new_blocks is None:  # a lone request that never fits: vLLM would wait forever
            result.admitted = False
            return result
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = hit
        chunks: list[int] = []
        outputs = iter(item.output_token_ids)
        while True:
            if request.num_computed_tokens < request.num_prompt_tokens:
                chunks.append(num_new)  # a prefill chunk (the last one may sample)
            # Scheduler._update_after_schedule, then update_from_output (synchronous).
            request.num_computed_tokens += num_new
            if request.num_computed_tokens >= request.num_tokens:  # a token is sampled
                request.append_output_token_ids(next(outputs))
                if check_stop(request, self.max_model_len):
                    break
            # Scheduler.schedule, running queue: the next chunk or decode step.
            manager.new_step_starts()
            self.steps += 1
            num_new = request.num_tokens_with_spec - request.num_computed_tokens
            num_new = min(num_new, self.token_budget)
            num_new = min(num_new, self.max_model_len - request.num_computed_tokens - 1)
            num_new = self._split(request, num_new)
            if num_new <= 0 or manager.allocate_slots(request, num_new) is None:
                raise RuntimeError(
                    f"{item.request_id}: vLLM cannot continue a lone request "
                    f"({num_new} tokens at {request.num_computed_tokens}); pool too small"
                )
        # Scheduler._free_request -> _free_blocks -> KVCacheManager.free.
        manager.free(request)
        result.chunks = tuple(chunks)
        return result

    def run(self, requests: Iterable[ReplayRequest]) -> list[RequestHit]:
        """Serve ``requests`` in order; one :class:`RequestHit` each."""
        return [self.serve(item) for item in requests]

    def free_blocks(self) -> int:
        """Blocks in the free queue (cached ones included)."""
        return int(self.manager.block_pool.get_num_free_blocks())


def hit_rate(hits: Sequence[RequestHit]) -> float:
    """Total hit tokens over total prompt tokens (0 for no prompt tokens)."""
    prompt = sum(h.prompt_tokens for h in hits)
    return sum(h.hit_tokens for h in hits) / prompt if prompt else 0.0


def replay(
    model: HybridModel,
    requests: Sequence[ReplayRequest],
    budget_bytes: int,
    token_budget: int = 8192,
) -> tuple[list[RequestHit], PoolPlan, float]:
    """Build the manager, serve ``requests``; their hits, the pool plan, seconds taken."""
    longest = longest_request(requests)
    started = time.perf_counter()
    engine = VllmCacheReplay(model, budget_bytes, token_budget, max_model_len=max(longest, 1) * 2)
    hits = engine.run(requests)
    return hits, engine.plan, time.perf_counter() - started


__all__ = [
    "HybridModel",
    "PoolPlan",
    "ReplayRequest",
    "RequestHit",
    "VllmCacheReplay",
    "hit_rate",
    "import_vllm",
    "replay",
]
