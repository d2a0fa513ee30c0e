"""SGLang 0.5.23's own radix cache, replayed request by request (a fidelity oracle).

hyckpt's ``engine = "sglang"`` preset (docs/SIMULATION.md, "Engine presets") was derived
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


def publish_server_args(chunked_prefill_size: int) -> Any:
    """Publish a fresh default ``ServerArgs`` (page size 1, the chunk size) as the
    scheduler's config (``runtime_context.publish``); returns it.

    ``_mamba_cache_chunk_size`` is pre-seeded (``arg_groups/overrides.py`` would read the
    model's HF config); it only sets ``mamba_branching_seqlen``, which ``no_buffer`` ignores.
    """
    import_sglang()
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

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
    """

    request_id: str
    prompt_tokens: int
    hit_tokens: int
    full_kv_hit: int = 0
    chunks: tuple[int, ...] = ()
    mamba_evictable: int = 0


class SglangCacheReplay:
    """SGLang's ``UnifiedRadixCache`` for ``model`` in ``plan``'s pools, served one request
    at a time (module docstring: what is SGLang's code, what stands in).

    Args:
        model: the hybrid model.
        plan: the pool sizes (:func:`plan_pools`).
        chunk_size: ``chunked_prefill_size`` (hyckpt's token budget).
        max_context_len: longest request (prompt + output), for the request-to-token rows.
        tree_core: ``"rust"`` (SGLang's default) or ``"python"``; ``None``: SGLang's default.
    """

    def __init__(
        self,
        model: HybridModel,
        plan: PoolPlan,
        chunk_size: int,
        max_context_len: int,
        tree_core: str | None = None,
    ) -> None:
        publish_server_args(chunk_size)
        import torch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.runtime_context import get_exec, get_memory, get_schedule

        if get_exec().mamba.enable_mamba_extra_buffer:
            raise RuntimeError("the published ServerArgs enable the Mamba extra buffer")
        self.model, self.plan, self.chunk_size = model, plan, chunk_size
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
            size=1,
            mamba_size=plan.max_mamba_cache_size,
            mamba_spec_state_size=1,
            max_context_len=max_context_len,
            device="cpu",
            enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=tiny, layers=[0]),
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False,
            speculative_num_draft_tokens=None,
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
                enable_mamba_extra_buffer=False,
                tree_core_backend=tree_core,
            )
        )
        self.tree_core_name = type(self.tree_cache.tree_core).__name__

    def serve(self, request: ReplayRequest) -> RequestHit:
        """Serve ``request`` alone, from admission to release; its hit and chunks."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.allocation import alloc_req_slots, alloc_token_slots
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
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
            self._extend(req, alloc_req_slots, alloc_token_slots)
            chunks.append(req.extend_end - req.prefix_len)
            if req.extend_end < len(prompt):
                # A middle chunk: stash_chunked_request, then add_chunked_req.
                checkpoint_kv_cache(req, tree)
                req.init_next_round_input()
                req.extend_end = req.prefix_len + min(len(prompt) - req.prefix_len, self.chunk_size)
                continue
            break
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
        hit.chunks = tuple(chunks)
        hit.mamba_evictable = int(tree.mamba_evictable_size())
        return hit

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


def replay(
    model: HybridModel,
    requests: Sequence[ReplayRequest],
    budget_bytes: int,
    chunk_size: int,
    *,
    tree_core: str | None = None,
    check_every: int = 0,
) -> ReplayResult:
    """Serve ``requests`` in order through SGLang's radix cache sized for ``budget_bytes``.

    ``check_every``: run :meth:`SglangCacheReplay.check` after every that many requests
    (0: only at the end).
    """
    import_sglang()
    plan = plan_pools(model, budget_bytes)
    longest = longest_request(requests)
    started = time.perf_counter()
    engine = SglangCacheReplay(model, plan, chunk_size, longest + 1, tree_core=tree_core)
    hits = []
    for i, request in enumerate(requests, 1):
        hits.append(engine.serve(request))
        if check_every and i % check_every == 0:
            engine.check()
    engine.check()
    return ReplayResult(hits, plan, time.perf_counter() - started, engine.tree_core_name)
