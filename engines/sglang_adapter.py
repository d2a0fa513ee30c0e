"""SGLang 0.5.23's own radix cache as a hyckpt index (``--impl``).

``engines.sglang_adapter:implementation`` builds, without a GPU, SGLang's
``UnifiedRadixCache`` (``sglang/srt/mem_cache/unified_radix_cache.py``) with its FULL and
MAMBA tree components over CPU pools: a ``HybridReqToTokenPool`` whose ``MambaPool`` holds
the checkpoints (one Mamba2 layer, tiny state), a ``HybridLinearKVPool`` with one
full-attention layer and a ``TokenToKVPoolAllocator`` for the FULL component's KV
indices, all with ``device="cpu"``, ``page_size=1`` and no Mamba extra buffer (SGLang's
``no_buffer`` strategy, where a Mamba state can sit at any token count). The tree core is
SGLang's default (the Rust ``RustUnifiedTreeCore``); ``HYCKPT_SGLANG_TREE_CORE=python``
(or ``make_index(..., tree_core="python")``) selects the pure-Python ``UnifiedTreeCore``
instead. The index itself is :class:`engines.sglang_index.SglangIndex`; its docstring maps
each hyckpt operation to the SGLang call.

What SGLang does not have, and so this adapter does not declare: ``invalidate``/``clear``
of one key while readers hold it (SGLang only resets the whole tree,
``UnifiedRadixCache.reset``), the eviction policies other than ``lru`` (the MAMBA
component evicts in the order of its own LRU list whatever ``eviction_policy`` says:
``MambaComponent._evict_device_start`` in ``unified_cache/components/mamba.py`` walks
``lru_lists[MAMBA].get_lru_no_lock()``), and a placement function: SGLang's scheduler
checkpoints at every chunk end by calling ``UnifiedRadixCache.checkpoint(req, up_to=...)``
on a live ``Req``, so there is no standalone position function to drive (hyckpt's
``chunk-end`` policy describes it). ``make_placement`` raises.

Run in the venv ``scripts/engine-venv-sglang.sh`` builds::

    .venv-sglang/bin/python -m pytest tests/conformance/test_index.py \
        --impl engines.sglang_adapter:implementation
"""

from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, NoReturn

from engines.index_common import check_config_count, check_index_counts, import_engine
from reference.api import CheckpointIndex, Implementation, PlacementPolicy
from reference.errors import (
    AllocationTooLargeError,
    CapabilityMissingError,
    ImplementationLoadError,
    InvalidConfigError,
    UnknownPolicyError,
)

#: The release this adapter was written against (read from its wheel).
SGLANG_VERSION = "0.5.23"
INSTALL_HINT = (
    "build the SGLang venv with `bash scripts/engine-venv-sglang.sh` and run pytest with "
    "`.venv-sglang/bin/python -m pytest ...` (docs/CONFORMANCE.md, 'Real engines: SGLang 0.5.23')"
)
#: hyckpt's eviction policies; SGLang's MAMBA component only has its LRU list.
EVICTION_POLICIES = ("lru",)
_HYCKPT_POLICIES = ("lru", "fifo", "size-aware", "flop-aware", "marconi")
TREE_CORES = ("rust", "python")
#: Mamba pool slots an index may have (SGLang allocates the pool up front).
MAX_CAPACITY = 2**20
#: KV tokens of the FULL pool per checkpoint slot by default (``kv_tokens`` overrides).
KV_TOKENS_PER_SLOT = 64
MIN_KV_TOKENS = 1 << 16


@dataclass(frozen=True)
class _Sglang:
    """The SGLang entry points the adapter calls, imported once by :func:`load_sglang`."""

    version: str
    torch: Any
    unified_radix_cache: Any
    cache_init_params: Any
    component_type: Any
    hybrid_req_to_token_pool: Any
    hybrid_linear_kv_pool: Any
    token_to_kv_pool_allocator: Any
    mamba2_cache_params: Any
    mamba2_state_shape: Any
    match_prefix_params: Any
    insert_params: Any
    evict_params: Any
    radix_key: Any


_cache: dict[str, _Sglang] = {}


class _Missing:
    """What the torchvision stub hands out: any attribute is another ``_Missing``, any
    call fails saying torchvision is not installed."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._name}.{name}")

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise ImportError(f"{self._name}: torchvision is a stub in this process (hyckpt)")


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self.__name__}.{name}")


class _TorchvisionStubFinder:
    """Serves ``torchvision`` and its submodules as stubs.

    ``sglang/srt/configs/__init__.py`` imports ``nano_nemotron_vl`` and ``deepseek_ocr``,
    which import ``torchvision.transforms`` at module level, on the import path of
    ``memory_pool.py``; the PyPI torchvision cannot load beside the CPU torch. Only names
    are imported there, none is used by the cache.
    """

    def find_spec(self, name: str, path: object = None, target: object = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)  # type: ignore[arg-type]
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def stub_torchvision() -> None:
    """Put the torchvision stub on ``sys.meta_path`` unless a torchvision is installed.

    transformers caches whether torchvision is usable (``is_torchvision_available`` is an
    ``lru_cache``), so it is asked first, while no torchvision can be found: it then never
    takes the stub for the real package.
    """
    if any(isinstance(f, _TorchvisionStubFinder) for f in sys.meta_path):
        return
    if importlib.util.find_spec("torchvision") is not None:
        return
    import_utils = importlib.import_module("transformers.utils.import_utils")
    import_utils.is_torchvision_available()
    sys.meta_path.insert(0, _TorchvisionStubFinder())


def load_sglang() -> _Sglang:
    """Import SGLang's cache code; raise ImplementationLoadError when it is absent."""
    if "sglang" in _cache:
        return _cache["sglang"]
    version = import_engine(
        "sglang", adapter="SGLang", release=SGLANG_VERSION, exact=True, hint=INSTALL_HINT
    )
    try:
        stub_torchvision()
        torch = importlib.import_module("torch")
        urc = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
        params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
        base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        pools = importlib.import_module("sglang.srt.mem_cache.memory_pool")
        allocator = importlib.import_module("sglang.srt.mem_cache.allocator")
        mamba_utils = importlib.import_module("sglang.srt.configs.mamba_utils")
        radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        components = importlib.import_module("sglang.srt.mem_cache.unified_cache.components")
        _publish_server_args()
    except ImportError as error:
        raise ImplementationLoadError(
            f"sglang {version} is installed but its cache code cannot be imported "
            f"({error}); {INSTALL_HINT}"
        ) from error
    loaded = _Sglang(
        version=version,
        torch=torch,
        unified_radix_cache=urc.UnifiedRadixCache,
        cache_init_params=params.CacheInitParams,
        component_type=components.ComponentType,
        hybrid_req_to_token_pool=pools.HybridReqToTokenPool,
        hybrid_linear_kv_pool=pools.HybridLinearKVPool,
        token_to_kv_pool_allocator=allocator.TokenToKVPoolAllocator,
        mamba2_cache_params=mamba_utils.Mamba2CacheParams,
        mamba2_state_shape=mamba_utils.Mamba2StateShape,
        match_prefix_params=base.MatchPrefixParams,
        insert_params=base.InsertParams,
        evict_params=base.EvictParams,
        radix_key=radix.RadixKey,
    )
    _cache["sglang"] = loaded
    return loaded


def _publish_server_args() -> None:
    """Install the process-wide scheduler config the MAMBA component reads.

    ``MambaComponent.__init__`` reads ``mamba_cache_chunk_size()`` and
    ``get_exec().mamba.mamba_max_states_per_path`` (``sglang/srt/runtime_context.py``).
    ``ServerArgs(model_path="dummy")`` keeps every default (``mamba_max_states_per_path
    = -1``: no cap); ``_mamba_cache_chunk_size`` is pre-seeded, as SGLang's own CPU tests
    do, or ``arg_groups/overrides.py::mamba_cache_chunk_size`` loads the model's HF
    config. It only sets the match result's ``mamba_branching_seqlen`` grid here.
    """
    server_args_module = importlib.import_module("sglang.srt.server_args")
    runtime_context = importlib.import_module("sglang.srt.runtime_context")
    server_args = server_args_module.ServerArgs(model_path="dummy", page_size=1)
    try:
        chunk = importlib.import_module("sglang.kernels.ops.attention.fla.chunk_delta_h")
        chunk_size = int(chunk.CHUNK_SIZE)
    except ImportError:
        chunk_size = 64  # arg_groups/overrides.py's fallback for FLA_CHUNK_SIZE
    server_args._mamba_cache_chunk_size = chunk_size
    runtime_context.publish(server_args, role="scheduler")


def make_index(
    capacity: int,
    *,
    first_slot: int = 0,
    eviction: object = "lru",
    hash_unit: int = 16,
    bytes_per_slot: int = 1,
    tree_core: str | None = None,
    kv_tokens: int | None = None,
    **eviction_params: object,
) -> CheckpointIndex:
    """An index over a fresh SGLang ``UnifiedRadixCache`` (FULL + MAMBA) on CPU pools.

    Args:
        capacity: Mamba pool size (``HybridReqToTokenPool(mamba_size=capacity)``).
        first_slot: hyckpt slot of SGLang's Mamba pool index 1 (index 0 is SGLang's
            dummy slot for padded tokens, ``allocator/mamba.py::MambaSlotAllocator.clear``).
        eviction: ``"lru"`` only (see the module docstring).
        hash_unit: unit of the hyckpt keys' chained digests (``make_key``); SGLang's tree
            is keyed by the tokens themselves and runs at ``page_size=1``.
        bytes_per_slot: checked and kept; every Mamba slot has the same bytes in SGLang.
        tree_core: ``"rust"`` or ``"python"``; default ``HYCKPT_SGLANG_TREE_CORE``, else
            SGLang's own default (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``, ``"rust"``).
        kv_tokens: size of the FULL KV pool; default ``max(65536, 64 * capacity)``, so that
            KV pressure (which makes SGLang evict leaves, checkpoints with them) does not
            happen in the conformance tests.

    Raises:
        InvalidConfigError: a count out of range, an unknown option or tree core, or
            eviction parameters (``lru`` takes none).
        UnknownPolicyError: any eviction policy but ``lru``.
        AllocationTooLargeError: more than :data:`MAX_CAPACITY` slots.
    """
    check_index_counts(capacity, first_slot, hash_unit, bytes_per_slot)
    if capacity > MAX_CAPACITY:
        raise AllocationTooLargeError(
            f"capacity={capacity} Mamba slots exceeds the SGLang adapter's limit of "
            f"{MAX_CAPACITY} (SGLang allocates the pool up front); use fewer slots"
        )
    if not isinstance(eviction, str):
        raise InvalidConfigError(
            f"eviction must be a policy name, got {eviction!r} ({type(eviction).__name__}); "
            "SGLang's tree takes no policy object"
        )
    if eviction not in EVICTION_POLICIES:
        near = difflib.get_close_matches(eviction, _HYCKPT_POLICIES, n=1)
        hint = f"; did you mean {near[0]!r}?" if near and near[0] != eviction else ""
        why = (
            "SGLang's MAMBA component evicts checkpoints in the order of its LRU list "
            "whatever eviction_policy the tree has (MambaComponent._evict_device_start)"
            if eviction in _HYCKPT_POLICIES
            else "no such policy"
        )
        raise UnknownPolicyError(
            f"unknown eviction policy {eviction!r} for the SGLang adapter ({why}); it has "
            f"{', '.join(EVICTION_POLICIES)}{hint}"
        )
    if eviction_params:
        raise InvalidConfigError(
            f"eviction parameters {sorted(eviction_params)} were given, but SGLang's LRU "
            "takes none (and the adapter has no other option by these names)"
        )
    core = tree_core if tree_core is not None else os.environ.get("HYCKPT_SGLANG_TREE_CORE")
    if core is not None and core not in TREE_CORES:
        raise InvalidConfigError(f"tree_core must be one of {TREE_CORES}, got {core!r}")
    kv = max(MIN_KV_TOKENS, KV_TOKENS_PER_SLOT * capacity) if kv_tokens is None else kv_tokens
    check_config_count("kv_tokens", kv, 1)
    sglang = load_sglang()
    from engines.sglang_index import SglangIndex

    return SglangIndex(
        sglang,
        capacity,
        first_slot=first_slot,
        hash_unit=hash_unit,
        bytes_per_slot=bytes_per_slot,
        tree_core=core,
        kv_tokens=kv,
    )


def make_placement(name: str, **params: Any) -> PlacementPolicy:
    """No SGLang placement function exists to drive: always raises.

    Raises:
        CapabilityMissingError: for ``chunk-end``, SGLang's placement, which its scheduler
            applies by calling ``UnifiedRadixCache.checkpoint(req, up_to=...)`` on a live
            request at each chunk end (``unified_radix_cache.py``), not through a position
            function.
        UnknownPolicyError: for any other name.
    """
    if name == "chunk-end":
        raise CapabilityMissingError(
            "SGLang checkpoints at every chunk end from its scheduler "
            "(UnifiedRadixCache.checkpoint(req, up_to=...) on a live Req); it has no "
            "position function the adapter could call, so the SGLang adapter provides no "
            "placement policy: test the reference's 'chunk-end' instead"
        )
    raise UnknownPolicyError(
        f"unknown placement policy {name!r}: the SGLang adapter provides none (SGLang's "
        "placement is 'chunk-end', applied by its scheduler)"
    )


def implementation() -> Implementation:
    """The SGLang 0.5.23 adapter; ImplementationLoadError when sglang cannot be imported."""
    sglang = load_sglang()
    core = os.environ.get("HYCKPT_SGLANG_TREE_CORE")
    suffix = f"-{core}-core" if core else ""
    return Implementation(
        name=f"sglang-{sglang.version}{suffix}",
        make_placement=make_placement,
        make_index=make_index,
        placement_policies=frozenset(),
        eviction_policies=frozenset(EVICTION_POLICIES),
        capabilities=frozenset({"pin", "two-phase-publish"}),
    )
