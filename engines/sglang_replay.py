"""SGLang 0.5.23's own radix cache, replayed request by request (a fidelity oracle).

hyckpt's ``engine = "sglang-no-buffer"`` preset (docs/SIMULATION.md, "Engine presets") was derived
by reading SGLang's code. This module *runs* that code: it builds SGLang's real
``UnifiedRadixCache`` with FULL and MAMBA components over CPU pools sized as SGLang sizes
them for a Mamba2 + attention model at a given memory budget, serves a list of requests
through it one at a time, the way SGLang's scheduler serves a request that is alone in the
engine with the ``no_buffer`` Mamba strategy, and reports each request's prefix-cache hit.
``engines.sglang_fidelity`` compares those hits with hyckpt's cache-only replay. Every
SGLang path below is under ``sglang/srt/``.

What is SGLang's own code and what stands in for it, step by step:

1. **State and KV sizes.** ``Mamba2StateShape.create`` and ``Mamba2CacheParams``
   (``configs/mamba_utils.py``, as ``NemotronHConfig.mamba2_cache_params`` in
   ``configs/nemotron_h.py`` builds them) give ``mamba_cache_per_req``; the SSM-state dtype
   is hyckpt's model's unless asked for SGLang's default (``mamba2_state_dtype``: float32
   unless the config names one), the conv dtype bfloat16 (``SGLANG_MAMBA_CONV_DTYPE``
   unset). The KV bytes per token are ``DefaultPoolConfigurator._compute_cell_size``'s
   formula ``kv_heads * (head_dim + v_head_dim) * attention_layers * dtype bytes``
   (``model_executor/pool_configurator.py``; written out here, it needs a model config).
2. **Pool sizes.** ``KVCacheConfigurator._handle_max_mamba_cache``
   (``mem_cache/kv_cache_configurator.py``) runs for real on a stand-in ``self`` holding the
   fields it reads (no pipeline parallelism, no speculative decoding, no ReplaySSM): with
   the default ``mamba_full_memory_ratio`` 0.9 it sets ``max_mamba_cache_size`` to
   ``int((budget * r / (1 + r) - per_req) // per_req)`` and returns what is left after
   ``(max_mamba_cache_size + 1) * per_req``; ``DefaultPoolConfigurator.calculate_pool_sizes``
   runs (unbound, on a stand-in) to turn that into ``max_total_num_tokens`` at page size 1.
   The budget is what SGLang calls the rest memory: what weights and activations leave.
3. **Pools and cache.** ``HybridReqToTokenPool`` (its ``MambaPool`` and
   ``MambaSlotAllocator`` with ``max_mamba_cache_size`` slots; one tiny Mamba2 layer, since
   only the slot count matters), ``HybridLinearKVPool`` (one attention layer of one head of
   dimension 1) and ``TokenToKVPoolAllocator`` with ``max_total_num_tokens`` slots, all
   ``device="cpu"``, ``page_size=1``; ``UnifiedRadixCache`` with ``(FULL, MAMBA)``, no
   extra buffer, the published ``radix_eviction_policy`` (``lru``) and
   ``chunked_prefill_size``, as ``mem_cache/kv_cache_builder.py`` builds it. The server
   config is a published ``ServerArgs`` with its defaults (``runtime_context.publish``),
   ``page_size=1``, ``chunked_prefill_size`` = hyckpt's token budget.
4. **Requests.** ``managers/schedule_batch.py`` ``Req`` with ``SamplingParams(max_new_tokens
   = len(output))``, normalized without a tokenizer (no stop strings; the request ends by
   length, so ``update_finish_state`` finishes it after exactly ``len(output)`` tokens).
5. **Scheduling (the stand-in).** :meth:`SglangCacheReplay.serve` is the part of
   ``Scheduler.get_new_batch_prefill`` / ``ScheduleBatch.prepare_for_extend`` /
   ``process_batch_result_prefill`` / ``prepare_for_decode`` / ``process_batch_result_decode``
   a lone request goes through, and only that:

   - admission (``managers/scheduler.py`` ``get_new_batch_prefill``):
     ``mamba_allocator.alloc_group_begin(1)``, ``Req.init_next_round_input(tree_cache)``
     (real: ``match_kv_cache`` with ``cow_mamba=True``, limit ``len - 1``; the hit is
     ``req.prefix_len``), ``alloc_group_end()``; ``PrefillAdder._commit_prefill_admission``'s
     two lines: ``extend_end = prefix_len + min(rest, chunk)`` and ``req.lock =
     tree_cache.lock(req.last_node)`` (the budget checks pass for a lone request that fits);
   - each chunk (``mem_cache/allocation.py`` ``alloc_for_extend``): the real
     ``alloc_req_slots`` (``ensure_mamba_capacity``, ``HybridReqToTokenPool.alloc``) and
     ``alloc_token_slots`` (``evict_from_tree_cache``, then ``alloc``); the row write is
     ``write_cache_indices``'s non-Triton branch (``req_to_token_pool.write`` of the prefix
     and of the new slots); ``kv_allocated_len = kv_committed_len = extend_end``; the
     forward pass consumes the deferred copy-on-write (``_collect_deferred_mamba_cow_and_clear``
     clears ``mamba_cow_src_index`` / ``mamba_needs_clear``);
   - after a middle chunk: ``Scheduler.stash_chunked_request`` -> the real
     ``checkpoint_kv_cache(req, tree_cache)`` (``mem_cache/common.py``), then
     ``init_next_round_input()`` and ``add_chunked_req``'s ``extend_end``;
   - after the last chunk (``scheduler_components/batch_result_processor.py``): one output
     token appended, the real ``Req.update_finish_state``; finished -> the real
     ``release_kv_cache(req, tree_cache, checkpoint=True)``, else ``checkpoint_kv_cache``;
   - each decode step (``alloc_for_decode_default``): the real ``alloc_token_slots(tree_cache,
     1)``, the row write, ``kv_allocated_len``/``kv_committed_len`` + 1, the next output
     token, ``update_finish_state``; finished -> ``release_kv_cache(..., checkpoint=True)``.

Nothing of batching, overlap scheduling, retraction, HiCache, sessions, speculative
decoding or the forward pass is modelled: with one request at a time and no model, none of
it changes which prefix the cache returns. The Mamba states and KV hold no values.

6. **``extra_buffer``** (``strategy="extra_buffer"``; SGLang 0.5.23's default for NemotronH:
   ``arg_groups/overrides.py`` ``_mamba_radix_cache_resolution`` resolves ``auto`` to
   ``extra_buffer`` when the overlap scheduler is on, the default, and the architecture is
   in ``_MAMBA_EXTRA_BUFFER_ARCHS`` with ``linear_attn_backend == "triton"``, the default).
   What changes against steps 1-5:

   - config: ``mamba_radix_cache_strategy="extra_buffer"``, ``disable_overlap_schedule=False``,
     page size 1: on Hopper (H100/H200) the default attention backend is ``fa3``
     (``arg_groups/model_override_base.py`` ``get_default_attn_backend``) and
     ``overrides.py`` ``_page_size_default`` gives 1; on sm100 (B200) the default
     ``trtllm_mha`` backend makes ``_mla_backend_page_constraints`` raise it to 64, which
     this driver does not model (its pools and tree are page size 1),
     ``mamba_track_interval`` 256 and no lazy buffer (``arg_groups/fields/exec_.py``);
     ``_mamba_cache_chunk_size = max(mamba_chunk_size, page_size)``
     (``overrides.mamba_cache_chunk_size``, pre-seeded: there is no HF config), so the
     checkpoint grid ``lcm(it, page)`` and the decode track grid ``lcm(grid, 256)``
     (``runtime_context.mamba_checkpoint_grid`` / ``mamba_track_grid``) are SGLang's;
   - pools: the same ``max_mamba_cache_size`` (``_handle_max_mamba_cache`` does not depend
     on the strategy); ``HybridReqToTokenPool`` and ``UnifiedRadixCache`` built with
     ``enable_mamba_extra_buffer=True`` and the overlap flag, so each running request's
     ``alloc`` takes two ping-pong track slots (``_alloc_ping_pong_buffer``,
     ``get_mamba_tracking_slots``) from the same ``MambaSlotAllocator``;
   - each chunk: after ``alloc_for_extend``, the real
     ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` (on a stand-in batch
     holding ``model_config.hf_text_config.mamba_chunk_size``, ``tree_cache``,
     ``req_to_token_pool``) decides the tracked seqlen (``mamba_last_track_seqlen``) and
     swaps the ping-pong index; a middle chunk's ``checkpoint_kv_cache`` then inserts at
     that seqlen (``MambaComponent.prepare_for_caching_req`` donates the ping-pong slot);
   - decode: the stand-in ``prepare_for_decode`` does what the real one does for one
     request (``alloc_for_decode_default``'s slot and row write, ``kv_committed_len`` + 1,
     ``decode_batch_idx`` + 1, ``mamba_track_mask_cpu = seq_len % track grid == 0``, the
     overlap's ``mamba_track_mask_next_cpu``, the ping-pong position
     ``set_mamba_track_indices_from_reqs`` reads); each step's result goes through the
     real ``SchedulerBatchResultProcessor._handle_finish_state_updated_req`` (on a
     stand-in holding the tree and no-op hooks for experts, indexer, customized output),
     which updates ``mamba_last_track_seqlen`` / ``mamba_prev_track_seqlen`` via the real
     ``_mamba_prefix_cache_update`` and, at the finish, calls the real
     ``release_kv_cache(checkpoint=True)`` (``_select_finished_checkpoint``);
   - the overlap scheduler's one-step lag is modelled, not assumed away: the next decode
     step is prepared (KV slot, ``decode_batch_idx``) before the previous step's result is
     processed, so the processor sees ``lookahead = 1`` as on a GPU, and the prefill's
     result is processed after the first decode step is prepared. At the finish the lag
     does not apply: ``event_loop_overlap`` sets ``enable_skip_finishing_decode`` and
     ``Scheduler._reqs_finishing_inflight`` keeps a request whose queued result commits
     its last output by length (every request here) out of the next step, so no decode
     step runs past the finish and ``release_kv_cache`` sees the same ``kv_committed_len``
     as without overlap. (It could not change what is cached anyway: a finished request
     inserts at its last *completed* track boundary, ``mamba_last_track_seqlen``, which
     only a completed step's result sets.) Middle-chunk checkpoints happen in
     ``get_new_batch_prefill``'s ``stash_chunked_request`` before the next chunk is
     prepared, under overlap too, and read nothing a forward produces;
   - the forward pass stands in: it writes the states the track indices name (values
     only), so it cannot change which positions are tracked or inserted.
"""

from __future__ import annotations

import importlib
import logging
import time
import types
import warnings
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engines.replay_common import ReplayRequest, longest_request, mamba2_model_fields
from engines.sglang_adapter import stub_torchvision

#: The SGLang release this driver was written against.
SGLANG_VERSION = "0.5.23"
#: ``ServerArgs.mamba_full_memory_ratio``'s default (``arg_groups/fields/schedule.py``).
MAMBA_FULL_MEMORY_RATIO = 0.9
#: SGLang's default SSM-state dtype (``configs/mamba_utils.py`` ``mamba2_state_dtype``).
SGLANG_SSM_DTYPE = "float32"
#: The conv-window dtype SGLang uses unless ``SGLANG_MAMBA_CONV_DTYPE`` says otherwise.
SGLANG_CONV_DTYPE = "bfloat16"
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: The Mamba radix-cache strategies the driver serves (``exec.mamba.mamba_radix_cache_strategy``).
STRATEGIES = ("no_buffer", "extra_buffer")
#: ``mamba_chunk_size`` of nemotron-h-8b's ``config.json`` (its legacy ``chunk_size`` key,
#: which ``NemotronHConfig._resolve_mamba_chunk_size`` maps); the config is not in hyckpt,
#: so this is an input: ``mamba_cache_chunk_size = max(it, page_size)``
#: (``arg_groups/overrides.py`` ``mamba_cache_chunk_size``). SGLang's own fallback, when a
#: config names none, is ``configs/nemotron_h.py``'s ``DEFAULT_MAMBA_CHUNK_SIZE`` (256).
NEMOTRON_H_MAMBA_CHUNK_SIZE = 128


#: The SGLang modules the driver calls, imported once by :func:`import_sglang`.
_MODULES = (
    "sglang.srt.server_args",
    "sglang.srt.runtime_context",
    "sglang.srt.configs.mamba_utils",
    "sglang.srt.mem_cache.kv_cache_configurator",
    "sglang.srt.model_executor.pool_configurator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.unified_cache.components",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.common",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.scheduler_components.batch_result_processor",
    "sglang.srt.sampling.sampling_params",
)


def import_sglang() -> types.ModuleType:
    """Import SGLang and the modules the driver calls (``torchvision`` stubbed when
    absent: :func:`engines.sglang_adapter.stub_torchvision`), quietly: import-time
    ``UserWarning``s about GPU-only kernels are dropped and
    ``sglang.srt.runtime_context``'s notice that a re-publish drops the previous pool size
    is silenced unless its logger was configured.

    Raises:
        ImportError: SGLang is not installed, or not release :data:`SGLANG_VERSION`.
    """
    import sglang

    version = str(getattr(sglang, "__version__", "unknown"))
    if version != SGLANG_VERSION:
        raise ImportError(f"engines.sglang_replay needs sglang {SGLANG_VERSION}, found {version}")
    stub_torchvision()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for name in _MODULES:
            importlib.import_module(name)
    context_logger = logging.getLogger("sglang.srt.runtime_context")
    if context_logger.level == logging.NOTSET:
        context_logger.setLevel(logging.ERROR)
    return sglang


@dataclass(frozen=True)
class HybridModel:
    """A Mamba2 + full-attention model, in the fields SGLang reads.

    Attributes:
        name: for reports.
        attention_layers, mamba_layers: layer counts.
        num_kv_heads, head_dim: attention geometry (``v_head_dim = head_dim``).
        dtype: KV dtype name.
        mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size, conv_kernel: Mamba2
            fields of the model's ``config.json``.
        ssm_state_dtype, conv_dtype: the state dtypes the Mamba pool stores.
    """

    name: str
    attention_layers: int
    mamba_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    mamba_num_heads: int
    mamba_head_dim: int
    n_groups: int
    ssm_state_size: int
    conv_kernel: int
    ssm_state_dtype: str
    conv_dtype: str = SGLANG_CONV_DTYPE

    @classmethod
    def from_hyckpt(cls, model: Any, ssm_dtype: str = "model") -> HybridModel:
        """From a :class:`reference.sizes.ModelSizes` (Mamba2 + full attention only).

        ``ssm_dtype``: ``"model"`` keeps hyckpt's SSM-state dtype (and its conv dtype,
        which must then be the model dtype), ``"sglang"`` takes SGLang's default
        (float32; the conv window stays bfloat16).

        Raises:
            ValueError: the model has other recurrent or attention layers, or an unknown
                ``ssm_dtype``.
        """
        others = (model.mamba1_layers, model.gdn_layers, model.sliding_window_layers)
        if any(others) or not model.mamba2_layers or not model.full_attention_layers:
            raise ValueError(f"{model.name}: the driver models Mamba2 + full attention only")
        if ssm_dtype not in ("model", "sglang"):
            raise ValueError(f"ssm_dtype must be 'model' or 'sglang', got {ssm_dtype!r}")
        return cls(
            **mamba2_model_fields(model),
            head_dim=model.head_dim,
            ssm_state_dtype=model.ssm_state_dtype if ssm_dtype == "model" else SGLANG_SSM_DTYPE,
            conv_dtype=model.dtype if ssm_dtype == "model" else SGLANG_CONV_DTYPE,
        )

    def cache_params(self) -> Any:
        """SGLang's ``Mamba2CacheParams`` for the full model (TP 1), as
        ``NemotronHConfig.mamba2_cache_params`` builds it."""
        import torch
        from sglang.srt.configs.mamba_utils import (
            Mamba2CacheParams,
            Mamba2StateDType,
            Mamba2StateShape,
        )

        shape = Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=self.mamba_num_heads * self.mamba_head_dim,
            n_groups=self.n_groups,
            num_heads=self.mamba_num_heads,
            head_dim=self.mamba_head_dim,
            state_size=self.ssm_state_size,
            conv_kernel=self.conv_kernel,
        )
        dtype = Mamba2StateDType(
            conv=getattr(torch, self.conv_dtype), temporal=getattr(torch, self.ssm_state_dtype)
        )
        return Mamba2CacheParams(shape=shape, layers=list(range(self.mamba_layers)), dtype=dtype)

    def cell_size(self) -> int:
        """KV bytes per token: ``DefaultPoolConfigurator._compute_cell_size``'s MHA branch
        (``kv_heads * (head_dim + v_head_dim) * layers * dtype bytes``)."""
        return (
            self.num_kv_heads * 2 * self.head_dim * self.attention_layers * _DTYPE_BYTES[self.dtype]
        )


@dataclass(frozen=True)
class PoolPlan:
    """How SGLang divides a budget.

    Attributes:
        budget_bytes: the rest memory (KV cache + Mamba pool).
        per_req_bytes: ``mamba_cache_per_req``: one state of every Mamba layer.
        cell_size: KV bytes per token.
        max_mamba_cache_size: Mamba pool slots (running requests' states and cached ones).
        max_total_num_tokens: KV token slots.
        ssm_state_dtype: the SSM-state dtype priced.
    """

    budget_bytes: int
    per_req_bytes: int
    cell_size: int
    max_mamba_cache_size: int
    max_total_num_tokens: int
    ssm_state_dtype: str


def publish_server_args(
    chunked_prefill_size: int,
    strategy: str = "no_buffer",
    mamba_chunk_size: int = NEMOTRON_H_MAMBA_CHUNK_SIZE,
) -> Any:
    """Publish a fresh default ``ServerArgs`` (page size 1, the chunk size) as the
    scheduler's config (``runtime_context.publish``); returns it.

    ``strategy="no_buffer"``: the strategy stays ``auto`` unresolved (no extra buffer), and
    ``_mamba_cache_chunk_size`` is pre-seeded with 64 (``arg_groups/overrides.py``'s
    FLA fallback; it only sets ``mamba_branching_seqlen``, which ``no_buffer`` ignores).
    ``strategy="extra_buffer"``: ``mamba_radix_cache_strategy="extra_buffer"`` (what
    ``_mamba_radix_cache_resolution`` resolves ``auto`` to for NemotronH with the default
    overlap scheduler), overlap on (``disable_overlap_schedule=False``, the default), and
    ``_mamba_cache_chunk_size = max(mamba_chunk_size, page_size)`` as
    ``overrides.mamba_cache_chunk_size`` computes it from the model's HF config.
    """
    import_sglang()
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "extra_buffer":
        server_args = ServerArgs(
            model_path="dummy",
            page_size=1,
            chunked_prefill_size=chunked_prefill_size,
            mamba_radix_cache_strategy="extra_buffer",
            disable_overlap_schedule=False,
        )
        server_args._mamba_cache_chunk_size = max(mamba_chunk_size, 1)
    else:
        server_args = ServerArgs(
            model_path="dummy", page_size=1, chunked_prefill_size=chunked_prefill_size
        )
        server_args._mamba_cache_chunk_size = 64  # FLA_CHUNK_SIZE, overrides.py's fallback
    runtime_context.publish(server_args, role="scheduler")
    return server_args


def plan_pools(model: HybridModel, budget_bytes: int) -> PoolPlan:
    """SGLang's pool sizes for ``model`` in ``budget_bytes`` (module docstring, step 2).

    Publishes a fresh ``ServerArgs`` first: ``_handle_max_mamba_cache`` stores its result in
    the published config and takes a size already there as given.
    """
    publish_server_args(8192)
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator
    from sglang.srt.runtime_context import get_schedule

    params = model.cache_params()
    if get_schedule().mamba_full_memory_ratio != MAMBA_FULL_MEMORY_RATIO:
        raise RuntimeError("SGLang's default mamba_full_memory_ratio is not 0.9 any more")
    configurator = types.SimpleNamespace(
        mambaish_config=types.SimpleNamespace(mamba2_cache_params=params),
        pp_size=1,
        fused_entry_bytes=lambda kind: None,
        spec_algorithm=types.SimpleNamespace(is_none=lambda: True),
        hybrid_gdn_config=None,
        hybrid_kda_config=None,
        extra_mamba_cache_bytes_per_req=0,
        attn_dp_size=1,
    )
    rest_gb = KVCacheConfigurator._handle_max_mamba_cache(configurator, budget_bytes / (1 << 30))
    slots = int(get_schedule().max_mamba_cache_size)
    cell = model.cell_size()
    pools = types.SimpleNamespace(_fixed_overhead_bytes=0, _cell_size=cell, _zero_kv_max_tokens=0)
    config = DefaultPoolConfigurator.calculate_pool_sizes(pools, int(rest_gb * (1 << 30)), 1)  # type: ignore[arg-type]
    return PoolPlan(
        budget_bytes=budget_bytes,
        per_req_bytes=int(params.mamba_cache_per_req),
        cell_size=cell,
        max_mamba_cache_size=slots,
        max_total_num_tokens=int(config.max_total_num_tokens),
        ssm_state_dtype=model.ssm_state_dtype,
    )


@dataclass
class RequestHit:
    """What one request got from SGLang's radix cache.

    Attributes:
        request_id: the request.
        prompt_tokens: its prompt length.
        hit_tokens: ``req.prefix_len`` after ``init_next_round_input`` (the device hit).
        full_kv_hit: how far the tree's KV alone matched ``prompt[:-1]`` before the lookup
            (``tree_core.match_full_device_prefix``, read-only).
        chunks: the prefill chunks (tokens each).
        mamba_evictable: Mamba states in the tree after the request (``mamba_evictable_size``).
        mamba_inserts: the key lengths at which the request handed a Mamba state to the
            tree, in order (after middle chunks, after the prefill, at the finish): what
            ``MambaComponent.prepare_for_caching_req`` returned whenever it returned a
            positive length with a state (an insert whose node already held a state keeps
            that one).
        kv_in_tree: after the finish, how many tokens of ``prompt + output`` the tree's KV
            holds (``match_full_device_prefix``, read-only).
    """

    request_id: str
    prompt_tokens: int
    hit_tokens: int
    full_kv_hit: int = 0
    chunks: tuple[int, ...] = ()
    mamba_evictable: int = 0
    mamba_inserts: tuple[int, ...] = ()
    kv_in_tree: int = 0


class SglangCacheReplay:
    """SGLang's ``UnifiedRadixCache`` for ``model`` in ``plan``'s pools, served one request
    at a time (module docstring: what is SGLang's code, what stands in).

    Args:
        model: the hybrid model.
        plan: the pool sizes (:func:`plan_pools`).
        chunk_size: ``chunked_prefill_size`` (hyckpt's token budget).
        max_context_len: longest request (prompt + output), for the request-to-token rows.
        tree_core: ``"rust"`` (SGLang's default) or ``"python"``; ``None``: SGLang's default.
        strategy: ``"no_buffer"`` or ``"extra_buffer"`` (module docstring, step 6).
        mamba_chunk_size: the model's ``mamba_chunk_size`` (``extra_buffer`` only).
        rows: request rows of the pools (requests that may hold slots at once; the
            replay serves one at a time).
    """

    def __init__(
        self,
        model: HybridModel,
        plan: PoolPlan,
        chunk_size: int,
        max_context_len: int,
        tree_core: str | None = None,
        strategy: str = "no_buffer",
        mamba_chunk_size: int = NEMOTRON_H_MAMBA_CHUNK_SIZE,
        rows: int = 1,
    ) -> None:
        publish_server_args(chunk_size, strategy, mamba_chunk_size)
        import torch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.runtime_context import get_exec, get_memory, get_schedule

        extra = strategy == "extra_buffer"
        if bool(get_exec().mamba.enable_mamba_extra_buffer) != extra:
            raise RuntimeError(f"the published ServerArgs do not give the {strategy} strategy")
        if extra and get_exec().mamba.enable_mamba_extra_buffer_lazy:
            raise RuntimeError("the published ServerArgs enable the lazy extra buffer")
        self.model, self.plan, self.chunk_size = model, plan, chunk_size
        self.strategy, self.mamba_chunk_size = strategy, mamba_chunk_size
        self._torch = torch
        # One tiny Mamba2 layer: MambaPool allocates (slots + 1) states per layer.
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

        tiny = Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=2,
            n_groups=1,
            num_heads=1,
            head_dim=2,
            state_size=1,
            conv_kernel=2,
        )
        self.req_to_token_pool = HybridReqToTokenPool(
            size=rows,
            mamba_size=plan.max_mamba_cache_size,
            mamba_spec_state_size=1,
            max_context_len=max_context_len,
            device="cpu",
            enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=tiny, layers=[0]),
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=extra,
            enable_mamba_extra_buffer_lazy=False,
            speculative_num_draft_tokens=None,
            enable_overlap_schedule=not get_schedule().disable_overlap_schedule,
        )
        kv_pool = HybridLinearKVPool(
            size=plan.max_total_num_tokens,
            dtype=torch.float16,
            page_size=1,
            head_num=1,
            head_dim=1,
            full_attention_layer_ids=[1],
            device="cpu",
            enable_memory_saver=False,
            mamba_pool=self.req_to_token_pool.mamba_pool,
        )
        self.allocator = TokenToKVPoolAllocator(
            size=plan.max_total_num_tokens,
            dtype=torch.float16,
            device="cpu",
            kvcache=kv_pool,
            need_sort=False,
        )
        self.tree_cache = UnifiedRadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
                eviction_policy=get_memory().radix_eviction_policy,
                eviction_policy_config=get_memory().radix_eviction_policy_config,
                enable_session_radix_cache=get_memory().enable_session_radix_cache,
                chunked_prefill_size=get_schedule().chunked_prefill_size,
                tree_components=(ComponentType.FULL, ComponentType.MAMBA),
                enable_mamba_extra_buffer=extra,
                enable_mamba_extra_buffer_lazy=False,
                tree_core_backend=tree_core,
            )
        )
        self.tree_core_name = type(self.tree_cache.tree_core).__name__
        self._inserts: list[int] = []
        self._watch_mamba_inserts(ComponentType.MAMBA)
        if extra:
            self._init_extra_buffer()

    def _watch_mamba_inserts(self, mamba_type: Any) -> None:
        """Record what the tree's ``MambaComponent.prepare_for_caching_req`` hands to each
        insert (a wrapper on the instance: the real method runs unchanged)."""
        (component,) = [
            c for c in self.tree_cache._components_tuple if c.component_type == mamba_type
        ]
        real = component.prepare_for_caching_req
        inserts = self._inserts

        def prepare_for_caching_req(req: Any, insert_params: Any, **kwargs: Any) -> Any:
            cache_len = real(req=req, insert_params=insert_params, **kwargs)
            if cache_len and insert_params.mamba_value is not None:
                inserts.append(int(cache_len))
            return cache_len

        component.prepare_for_caching_req = prepare_for_caching_req

    def serve(self, request: ReplayRequest) -> RequestHit:
        """Serve ``request`` alone, from admission to release; its hit and chunks."""
        self._inserts.clear()
        if self.strategy == "extra_buffer":
            hit = self._serve_extra_buffer(request)
        else:
            hit = self._serve_no_buffer(request)
        hit.mamba_inserts = tuple(self._inserts)
        hit.kv_in_tree = self._kv_in_tree(request)
        return hit

    def _kv_in_tree(self, request: ReplayRequest) -> int:
        """How many tokens of ``prompt + output`` the tree's KV holds (read-only walk)."""
        from sglang.srt.mem_cache.radix_cache import RadixKey

        tokens = array("q", request.prompt_token_ids)
        tokens.extend(request.output_token_ids)
        matched, _, _ = self.tree_cache.tree_core.match_full_device_prefix(RadixKey(tokens, None))
        return int(matched)

    def _admit_and_prefill(
        self, request: ReplayRequest, track: bool
    ) -> tuple[Any, RequestHit, list[int]]:
        """Admission and every prefill chunk of ``request`` (steps 5 and 6): the ``Req``,
        its hit (chunks filled in) and its output tokens. ``track``: each chunk's
        ``extra_buffer`` track entry after its allocation, as
        ``ScheduleBatch.prepare_for_extend`` makes it
        (``_mamba_radix_cache_v2_req_prepare_for_extend``)."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.allocation import alloc_req_slots, alloc_token_slots
        from sglang.srt.mem_cache.common import checkpoint_kv_cache
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.sampling.sampling_params import SamplingParams

        prompt = array("q", request.prompt_token_ids)
        outputs = list(request.output_token_ids)
        if not prompt or not outputs:
            raise ValueError(f"{request.request_id}: needs a prompt and an output token")
        tree, pool = self.tree_cache, self.req_to_token_pool
        sampling = SamplingParams(temperature=0, max_new_tokens=len(outputs))
        sampling.normalize(None)  # TokenizerManager does, with its tokenizer
        req = Req(
            rid=request.request_id,
            origin_input_text="",
            origin_input_ids=prompt,
            sampling_params=sampling,
        )
        # Diagnostics only: how far the KV alone matches (a read-only walk, no LRU change).
        full_kv, _, _ = tree.tree_core.match_full_device_prefix(
            RadixKey(prompt[: len(prompt) - 1], None)
        )
        # Scheduler.get_new_batch_prefill: the group pre-allocation, the match, admission.
        pool.mamba_allocator.alloc_group_begin(1)
        req.init_next_round_input(tree)
        pool.mamba_allocator.alloc_group_end()
        hit = RequestHit(request.request_id, len(prompt), int(req.prefix_len))
        hit.full_kv_hit = int(full_kv)
        req.extend_end = req.prefix_len + min(len(prompt) - req.prefix_len, self.chunk_size)
        req.lock = tree.lock(req.last_node)
        chunks = []
        while True:
            # alloc_for_extend (with extra_buffer it also allocates the ping-pong track
            # slots), then the chunk's track entry.
            self._extend(req, alloc_req_slots, alloc_token_slots)
            if track:
                self._prepare_for_extend_track(self._extend_batch, req)
            chunks.append(req.extend_end - req.prefix_len)
            if req.extend_end < len(prompt):
                # A middle chunk: get_new_batch_prefill's stash_chunked_request (under
                # overlap too: it runs before the next chunk is prepared), then
                # add_chunked_req.
                checkpoint_kv_cache(req, tree)
                req.init_next_round_input()
                req.extend_end = req.prefix_len + min(len(prompt) - req.prefix_len, self.chunk_size)
                continue
            break
        hit.chunks = tuple(chunks)
        return req, hit, outputs

    def _serve_no_buffer(self, request: ReplayRequest) -> RequestHit:
        """``no_buffer``: module docstring, step 5."""
        from sglang.srt.mem_cache.allocation import alloc_token_slots
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        req, hit, outputs = self._admit_and_prefill(request, track=False)
        tree = self.tree_cache
        # process_batch_result_prefill: the first output token.
        req.output_ids.append(outputs[0])
        req.update_finish_state()
        if not req.finished():
            checkpoint_kv_cache(req, tree)
        while not req.finished():
            self._decode_step(req, alloc_token_slots)
            req.output_ids.append(outputs[len(req.output_ids)])
            req.update_finish_state()
        if len(req.output_ids) != len(outputs):
            raise RuntimeError(f"{request.request_id}: finished after {len(req.output_ids)} tokens")
        release_kv_cache(req, tree, checkpoint=True)
        hit.mamba_evictable = int(tree.mamba_evictable_size())
        return hit

    def _init_extra_buffer(self) -> None:
        """The stand-ins the ``extra_buffer`` path hands SGLang's own methods (step 6)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.scheduler_components.batch_result_processor import (
            SchedulerBatchResultProcessor as Processor,
        )
        from sglang.srt.runtime_context import get_schedule, mamba_track_grid

        # ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend reads these three.
        self._extend_batch = types.SimpleNamespace(
            model_config=types.SimpleNamespace(
                hf_text_config=types.SimpleNamespace(mamba_chunk_size=self.mamba_chunk_size)
            ),
            tree_cache=self.tree_cache,
            req_to_token_pool=self.req_to_token_pool,
        )
        self._prepare_for_extend_track = ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend
        self.overlap = not get_schedule().disable_overlap_schedule
        self.track_interval = int(mamba_track_grid(self.tree_cache.page_size))

        class ResultProcessor:
            """What ``SchedulerBatchResultProcessor._handle_finish_state_updated_req`` and
            the methods it calls read, for a lone request (no speculative decoding, no
            disaggregation, HiSparse, multimodal inputs or customized logits output)."""

            tree_cache = self.tree_cache
            draft_worker = None
            handle_finish_state_updated_req = Processor._handle_finish_state_updated_req
            _mamba_prefix_cache_update = Processor._mamba_prefix_cache_update
            _mamba_can_cache_finished_req = Processor._mamba_can_cache_finished_req
            _mamba_check_track_boundary = Processor._mamba_check_track_boundary
            _mamba_assert_committed_len_lookahead = staticmethod(
                Processor._mamba_assert_committed_len_lookahead
            )

            def _maybe_collect_routed_experts(self, req: Any) -> None:
                pass

            def _maybe_collect_indexer_topk(self, req: Any) -> None:
                pass

            def _prepare_kv_cache_release(self, req: Any) -> None:
                pass

            def _maybe_collect_customized_info(self, i: int, req: Any, output: Any) -> None:
                pass

        self._processor = ResultProcessor()
        self._decode_result = types.SimpleNamespace(
            num_correct_drafts_per_req_cpu=None, grammar_retained_tokens=None
        )

    def _serve_extra_buffer(self, request: ReplayRequest) -> RequestHit:
        """``extra_buffer`` with the overlap scheduler: module docstring, step 6."""
        from sglang.srt.mem_cache.allocation import alloc_token_slots
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        req, hit, outputs = self._admit_and_prefill(request, track=True)
        tree = self.tree_cache
        # The overlap loop prepares the first decode step before it processes the
        # prefill's result, unless that result commits the last output token
        # (Scheduler._reqs_finishing_inflight, enable_skip_finishing_decode).
        in_flight = self._prepare_decode(req, alloc_token_slots)
        # process_batch_result_prefill: the first output token, then release or checkpoint.
        req.output_ids.append(outputs[0])
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, tree, checkpoint=True)
        else:
            checkpoint_kv_cache(req, tree)
        while not req.finished():
            if in_flight is None:  # the non-overlap loop: prepare, run, process
                in_flight = self._prepare_decode(req, alloc_token_slots, force=True)
            # Overlap: the next step is prepared before this one's result is processed.
            after = self._prepare_decode(req, alloc_token_slots)
            req.output_ids.append(outputs[len(req.output_ids)])
            req.update_finish_state()
            self._processor.handle_finish_state_updated_req(
                req, in_flight, self._decode_result, 0, None
            )
            in_flight = after
        if len(req.output_ids) != len(outputs):
            raise RuntimeError(f"{request.request_id}: finished after {len(req.output_ids)} tokens")
        if in_flight is not None or req.kv.holds_kv:
            raise RuntimeError(f"{request.request_id}: a decode step ran past the finish")
        hit.mamba_evictable = int(tree.mamba_evictable_size())
        return hit

    def _prepare_decode(self, req: Any, alloc_token_slots: Any, force: bool = False) -> Any:
        """``ScheduleBatch.prepare_for_decode`` for the lone request under ``extra_buffer``:
        the KV slot (``alloc_for_decode_default``), ``decode_batch_idx``, the track mask at
        ``mamba_track_grid`` crossings and the ping-pong position
        (``set_mamba_track_indices_from_reqs``). Returns the batch's fields the result
        processor reads, or ``None`` where the scheduler launches no step: the request has
        finished, or (overlap) the queued result commits its last output by length
        (``Scheduler._reqs_finishing_inflight``), or (non-overlap) unless ``force``."""
        if req.finished() or (self.overlap and req.next_output_finishes_by_length()):
            return None
        if not self.overlap and not force:
            return None
        self._decode_step(req, alloc_token_slots)
        req.decode_batch_idx += 1
        seq_len = req.kv.kv_committed_len  # seq_lens_cpu after prepare_for_decode's +1
        remainder = seq_len % self.track_interval
        return types.SimpleNamespace(
            reqs=[req],
            req_to_token_pool=self.req_to_token_pool,
            spec_algorithm=types.SimpleNamespace(is_none=lambda: True),
            mamba_track_mask_cpu=[remainder == 0],
            mamba_track_mask_next_cpu=[remainder == self.track_interval - 1]
            if self.overlap
            else None,
            mamba_decode_batch_idx_cpu=[req.decode_batch_idx],
            mamba_track_buffer_indices=[req.kv.mamba_next_track_idx],
            mamba_lazy_spec_track_positions_cpu=None,
        )

    def _extend(self, req: Any, alloc_req_slots: Any, alloc_token_slots: Any) -> None:
        """``alloc_for_extend`` for one request at page size 1 (module docstring, step 5)."""
        tree, pool = self.tree_cache, self.req_to_token_pool
        prefix_len, seq_len = req.prefix_len, req.extend_end
        if req.kv.holds_kv:  # _prefix_kv_indices: a later chunk reads its own row
            prefix = pool.req_to_token[req.kv.req_pool_idx, :prefix_len].to(self._torch.int64)
        elif prefix_len:
            prefix = tree.prefix_device_indices(req)
        else:
            prefix = self._torch.empty((0,), dtype=self._torch.int64)
        (row,) = alloc_req_slots(pool, [req], tree)
        out_cache_loc = alloc_token_slots(tree, seq_len - prefix_len)
        pool.write((row, slice(0, prefix_len)), prefix)
        pool.write((row, slice(prefix_len, seq_len)), out_cache_loc)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = seq_len
        # The forward pass runs the deferred copy-on-write (and clear) and drops the marks.
        req.kv.mamba_cow_src_index = None
        req.kv.mamba_needs_clear = False

    def _decode_step(self, req: Any, alloc_token_slots: Any) -> None:
        """``alloc_for_decode_default`` for one request at page size 1."""
        location = alloc_token_slots(self.tree_cache, 1)
        seq_len = req.kv.kv_committed_len
        self.req_to_token_pool.write((req.kv.req_pool_idx, seq_len), location.to(self._torch.int32))
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1

    def check(self) -> None:
        """Nothing leaked between requests: every KV and Mamba slot is free or in the tree.

        Raises:
            RuntimeError: a slot is neither.
        """
        tree = self.tree_cache
        kv_free = int(self.allocator.available_size())
        kv_tree = int(tree.full_evictable_size()) + int(tree.full_protected_size())
        if kv_free + kv_tree != self.plan.max_total_num_tokens:
            raise RuntimeError(
                f"KV slots leaked: {kv_free} free + {kv_tree} in the tree != "
                f"{self.plan.max_total_num_tokens}"
            )
        mamba_free = int(self.req_to_token_pool.mamba_allocator.available_size())
        mamba_tree = int(tree.mamba_evictable_size()) + int(tree.mamba_protected_size())
        if mamba_free + mamba_tree != self.plan.max_mamba_cache_size:
            raise RuntimeError(
                f"Mamba slots leaked: {mamba_free} free + {mamba_tree} in the tree != "
                f"{self.plan.max_mamba_cache_size}"
            )


@dataclass
class ReplayResult:
    """A replay's outcome: per-request hits, the pools and the seconds it took."""

    hits: list[RequestHit]
    plan: PoolPlan
    seconds: float
    tree_core: str = ""
    strategy: str = "no_buffer"


def replay(
    model: HybridModel,
    requests: Sequence[ReplayRequest],
    budget_bytes: int,
    chunk_size: int,
    *,
    tree_core: str | None = None,
    check_every: int = 0,
    strategy: str = "no_buffer",
    mamba_chunk_size: int = NEMOTRON_H_MAMBA_CHUNK_SIZE,
) -> ReplayResult:
    """Serve ``requests`` in order through SGLang's radix cache sized for ``budget_bytes``.

    ``check_every``: run :meth:`SglangCacheReplay.check` after every that many requests
    (0: only at the end). ``strategy``: ``"no_buffer"`` or ``"extra_buffer"``;
    ``mamba_chunk_size``: the model's, read by ``extra_buffer`` only.
    """
    import_sglang()
    plan = plan_pools(model, budget_bytes)
    longest = longest_request(requests)
    started = time.perf_counter()
    engine = SglangCacheReplay(
        model,
        plan,
        chunk_size,
        longest + 1,
        tree_core=tree_core,
        strategy=strategy,
        mamba_chunk_size=mamba_chunk_size,
    )
    hits = []
    for i, request in enumerate(requests, 1):
        hits.append(engine.serve(request))
        if check_every and i % check_every == 0:
            engine.check()
    engine.check()
    return ReplayResult(hits, plan, time.perf_counter() - started, engine.tree_core_name, strategy)
