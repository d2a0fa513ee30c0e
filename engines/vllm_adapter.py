"""vLLM 0.33's own placement functions as a hyckpt implementation (``--impl``).

``engines.vllm_adapter:implementation`` drives, without a GPU:

* ``vllm-align``: ``vllm.model_executor.layers.mamba.checkpoint.compute_mamba_prefill_checkpoints``,
  the function vLLM's Mamba backends and scheduler share to place the align-mode prefill
  checkpoint of each batch row (one row per chunk here);
* ``vllm-retention``: ``MambaManager.reachable_block_mask``
  (``vllm/v1/core/single_type_kv_cache_manager.py``) over
  ``replay_boundaries`` (``vllm/v1/core/kv_cache_coordinator.py``), the sparse Mamba
  prefix-cache retention ``SingleTypeKVCacheManager.cache_blocks`` applies when a chunk's
  blocks are cached. The chunk's branch points stand for ``request.shared_prefix_boundary``
  (vLLM has one per request; every one is passed).

* the index (``make_index``): vLLM's ``BlockPool`` (``vllm/v1/core/block_pool.py``) as the
  pool of a ``MambaSpec`` align-mode group, keyed by vLLM's request block hasher and
  looked up by ``MambaManager.find_longest_cache_hit``; see :mod:`engines.vllm_index` for
  the operation-by-operation mapping and what is the adapter's own code.

What is the adapter's, not vLLM's: the parameters are checked by the reference's
``make_placement`` (vLLM takes them from ``CacheConfig``/``VllmConfig``, which validate other
things in another shape), and unknown names raise ``UnknownPolicyError``. No storage or
exporter is provided (vLLM's checkpoint store is a Triton kernel).

Two factories, differing only in the index's hash block (vLLM keys prefixes only at
multiples of ``hash_block_size``):

* ``implementation``: ``hash_block_size`` = Mamba ``block_size`` = the suite's
  ``hash_unit``, as vLLM is configured; a checkpoint off that grid has no key
  (``CapabilityMissingError``);
* ``implementation_token_hash``: ``hash_block_size`` = ``block_size`` = 1, so every
  position is a key and the other index rules are exercised at every token count.

Run in the venv ``scripts/engine-venv.sh`` builds::

    .venv-engines/bin/python -m pytest tests/conformance/test_placement.py \
        tests/conformance/test_placement_engines.py tests/conformance/test_index*.py \
        --impl engines.vllm_adapter:implementation
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any

from engines import vllm_index
from engines.index_common import import_engine
from reference import placement as ref
from reference.api import CheckpointIndex, Implementation, PlacementPolicy, PrefillChunk
from reference.errors import ImplementationLoadError, InvalidConfigError, UnknownPolicyError

#: The release these adapters were written against (signatures read from its wheel).
VLLM_VERSION = "0.33"
INSTALL_HINT = (
    "build the engine venv with `bash scripts/engine-venv.sh` and run pytest with "
    "`.venv-engines/bin/python -m pytest ...` (docs/CONFORMANCE.md, 'Real engines: vLLM 0.33')"
)
POLICIES = ("vllm-align", "vllm-retention")


@dataclass(frozen=True)
class _Vllm:
    """The vLLM entry points the adapters call, imported once by :func:`load_vllm`."""

    version: str
    compute_mamba_prefill_checkpoints: Any
    replay_boundaries: Any
    mamba_manager: Any
    mamba_spec: Any
    torch_float32: Any


_cache: dict[str, _Vllm] = {}


def load_vllm() -> _Vllm:
    """Import vLLM's placement code; raise ImplementationLoadError when it is absent."""
    if "vllm" in _cache:
        return _cache["vllm"]
    version = import_engine(
        "vllm", adapter="vLLM", release=VLLM_VERSION, exact=False, hint=INSTALL_HINT
    )
    try:
        checkpoint = importlib.import_module("vllm.model_executor.layers.mamba.checkpoint")
        coordinator = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
        managers = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
        interface = importlib.import_module("vllm.v1.kv_cache_interface")
        torch = importlib.import_module("torch")
    except ImportError as error:
        raise ImplementationLoadError(
            f"vllm {version} is installed but its placement code cannot be imported "
            f"({error}); {INSTALL_HINT}"
        ) from error
    loaded = _Vllm(
        version=version,
        compute_mamba_prefill_checkpoints=checkpoint.compute_mamba_prefill_checkpoints,
        replay_boundaries=coordinator.replay_boundaries,
        mamba_manager=managers.MambaManager,
        mamba_spec=interface.MambaSpec,
        torch_float32=torch.float32,
    )
    _cache["vllm"] = loaded
    return loaded


@dataclass(frozen=True)
class VllmAlignDriver:
    """``vllm-align`` through ``compute_mamba_prefill_checkpoints`` (one row per chunk)."""

    name = "vllm-align"

    spec: ref.VllmAlign
    vllm: _Vllm = field(repr=False)

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        s = self.spec
        offsets, cols = self.vllm.compute_mamba_prefill_checkpoints(
            [chunk.end],
            [chunk.query_len],
            hash_block_size=s.hash_unit,
            mamba_block_size=s.block_size,
            checkpoint_alignment=s.alignment,
            drop_eagle_block=s.drop_draft_block,
            cache_hit_alignment_tokens=s.hit_unit,
            num_hash_lookahead_tokens=s.lookahead,
        )
        # vLLM: offset 0 and column -1 mean the row holds no checkpoint.
        return (chunk.start + int(offsets[0]),) if int(cols[0]) >= 0 else ()


@dataclass(frozen=True)
class VllmRetentionDriver:
    """``vllm-retention`` through ``MambaManager.reachable_block_mask``.

    A Mamba block of ``hash_unit`` tokens (align mode: ``mamba_block_size`` = the hash
    block size = the cache-hit alignment); block ``i`` holds the state after
    ``(i + 1) * hash_unit`` tokens. A chunk ``[start, end)`` caches blocks
    ``[start // B, end // B)``, as ``cache_blocks`` does when the chunks are cached in
    order (``num_cached_block`` .. ``num_full_blocks``).
    """

    name = "vllm-retention"

    spec: ref.VllmRetention
    vllm: _Vllm = field(repr=False)

    def positions(self, chunk: PrefillChunk) -> tuple[int, ...]:
        block = self.spec.hash_unit
        start_block, end_block = chunk.start // block, chunk.end // block
        if end_block <= start_block:
            return ()
        kv_spec = self.vllm.mamba_spec(
            block_size=block,
            shapes=((1,),),
            dtypes=(self.vllm.torch_float32,),
            mamba_cache_mode="align",
        )
        boundaries = [*self.vllm.replay_boundaries(chunk.prompt_len, block, False)]
        boundaries.extend(b for b in chunk.branch_points if b)
        mask = self.vllm.mamba_manager.reachable_block_mask(
            start_block=start_block,
            end_block=end_block,
            alignment_tokens=block,
            kv_cache_spec=kv_spec,
            use_eagle=False,
            retention_interval=self.spec.retention_interval,
            reachable_boundaries=boundaries,
        )
        blocks = range(start_block, end_block)
        kept = blocks if mask is None else [i for i, keep in zip(blocks, mask, strict=True) if keep]
        return tuple(p for p in ((i + 1) * block for i in kept) if chunk.start < p <= chunk.end)


def make_placement(name: str, **params: Any) -> PlacementPolicy:
    """Build a policy whose positions come from vLLM's code (parameters checked by
    ``reference.placement.make_placement``)."""
    vllm = load_vllm()
    if name in POLICIES:
        # The reference's registry checks the parameters (missing, unknown, out of range)
        # and raises InvalidConfigError; the positions come from vLLM's code.
        spec = ref.make_placement(name, **params)
        if isinstance(spec, ref.VllmAlign):
            return VllmAlignDriver(spec, vllm)
        if isinstance(spec, ref.VllmRetention):
            return VllmRetentionDriver(spec, vllm)
    near = difflib.get_close_matches(str(name), POLICIES, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise UnknownPolicyError(
        f"unknown placement policy {name!r}: the vLLM adapter drives {', '.join(POLICIES)}{hint}"
    )


def make_index(capacity: int, **options: Any) -> CheckpointIndex:
    """An index over vLLM's ``BlockPool`` (:func:`engines.vllm_index.make_index`); the
    hash block is the suite's ``hash_unit`` unless ``hash_block=1`` is given."""
    load_vllm()
    return vllm_index.make_index(capacity, **options)


def make_index_token_hash(capacity: int, **options: Any) -> CheckpointIndex:
    """:func:`make_index` with vLLM hashing every token (``hash_block_size`` = 1)."""
    if "hash_block" in options:
        raise InvalidConfigError(
            "implementation_token_hash fixes hash_block=1; use make_index to choose it"
        )
    return make_index(capacity, hash_block=1, **options)


#: What vLLM's ``BlockPool`` gives the index: ``touch``/``free_blocks`` reference counts
#: (``pin``), ``evict_blocks``/``reset_prefix_cache`` (``invalidate``), and freeing a block
#: never cached (``abort``; reserve and publish are ``get_new_blocks`` and
#: ``cache_full_blocks``).
INDEX_CAPABILITIES = frozenset({"pin", "invalidate", "two-phase-publish"})


def _implementation(suffix: str, factory: Any) -> Implementation:
    vllm = load_vllm()
    vllm_index.load_index_code()
    return Implementation(
        name=f"vllm-{vllm.version}{suffix}",
        make_placement=make_placement,
        make_index=factory,
        placement_policies=frozenset(POLICIES),
        eviction_policies=frozenset(vllm_index.EVICTION_POLICIES),
        capabilities=INDEX_CAPABILITIES,
    )


def implementation() -> Implementation:
    """The vLLM 0.33 adapter (index hash block = ``hash_unit``); ImplementationLoadError
    when vllm cannot be imported."""
    return _implementation("", make_index)


def implementation_token_hash() -> Implementation:
    """The vLLM 0.33 adapter with the index hashing every token (``hash_block_size`` 1)."""
    return _implementation("-token-hash", make_index_token_hash)
