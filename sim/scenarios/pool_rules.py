"""Rules that tie a scenario's tables together: the model and its deployment, the engine
preset, and how the KV and checkpoint pools are sized (each one way, never two).

:func:`checked_model`, :func:`apply_preset` and :func:`checked_pools` run in this order
while a scenario is built (:mod:`sim.scenarios.loader`); each raises a
:class:`~sim.scenarios.schema.ScenarioError` naming the key at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reference.errors import HyckptError
from reference.sizes import ModelSizes
from sim.engine.config import MAX_KV_BLOCKS
from sim.engine.costs import CostModel, get_gpu
from sim.engine.deployment import Deployment, PlanDoesNotFitError, shard_model
from sim.engine.presets import PRESETS
from sim.scenarios.model_table import build_model
from sim.scenarios.schema import ScenarioError


def checked_model(
    data: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]], where: str
) -> ModelSizes:
    """The model ``[model]`` names or describes, checked against ``[deployment]``'s split.

    Raises:
        ScenarioError: naming ``model.<key>`` or ``deployment.<key>``.
    """
    # model.file is already relative to the scenario's folder (PATH_KEYS).
    model_sizes = build_model(data.get("model", {}), where)
    deployment = tables["deployment"]
    try:
        shard_model(model_sizes, deployment["tensor_parallel"], deployment["pipeline_parallel"])
    except HyckptError as error:
        key = "tensor_parallel" if "tensor_parallel" in str(error) else "pipeline_parallel"
        raise ScenarioError(
            where, f"deployment.{key}", deployment[key], f"a split the model allows ({error})"
        ) from None
    return model_sizes


def checked_pools(
    given_cache: Mapping[str, Any],
    tables: Mapping[str, Mapping[str, Any]],
    where: str,
    preset_keys: set[str],
    model_sizes: ModelSizes,
) -> int | None:
    """Check that the pools are sized one way each (split or unified memory, slots or a
    byte budget, pages or a KV byte budget); return ``kv_blocks`` (from
    ``kv_budget_bytes`` when that is how the file sizes the KV pool).

    Raises:
        ScenarioError: naming the ``cache.<key>`` that contradicts another.
    """
    model, cache = tables["model"], tables["cache"]
    deployment = tables["deployment"]
    if cache["reserved_pages"] and cache["memory"] != "unified":
        raise ScenarioError(
            where,
            "cache.reserved_pages",
            cache["reserved_pages"],
            "0 unless cache.memory = 'unified' (pages are reserved out of its one budget)"
            + (
                " (set by cache.engine; set cache.reserved_pages = 0 with split memory)"
                if "cache.reserved_pages" in preset_keys
                else ""
            ),
        )
    if cache["state_handover"] and (cache["memory"] != "unified" or not cache["running_states"]):
        raise ScenarioError(
            where,
            "cache.state_handover",
            cache["state_handover"],
            "false unless cache.memory = 'unified' and cache.running_states >= 1 (it moves "
            "a running request's state between pages of the one budget)"
            + (
                " (set by cache.engine; set cache.state_handover = false to override)"
                if "cache.state_handover" in preset_keys
                else ""
            ),
        )
    if cache["interleaved_free"] and (cache["memory"] != "unified" or not cache["release_recency"]):
        raise ScenarioError(
            where,
            "cache.interleaved_free",
            cache["interleaved_free"],
            "false unless cache.memory = 'unified' and cache.release_recency = true (it "
            "orders the pages of the checkpoints a chunk lets go of in the one budget)"
            + (
                " (set by cache.engine; set cache.interleaved_free = false to override)"
                if "cache.interleaved_free" in preset_keys
                else ""
            ),
        )
    if cache["required_captures"] and cache["memory"] != "unified":
        raise ScenarioError(
            where,
            "cache.required_captures",
            cache["required_captures"],
            "false unless cache.memory = 'unified' (it counts a chunk's checkpoints in the "
            "pages it needs from the one budget)"
            + (
                " (set by cache.engine; set cache.required_captures = false to override)"
                if "cache.required_captures" in preset_keys
                else ""
            ),
        )
    if cache["adopt_cached_blocks"] and cache["keep_block_copies"]:
        raise ScenarioError(
            where,
            "cache.keep_block_copies",
            cache["keep_block_copies"],
            "false while cache.adopt_cached_blocks = true (that swaps a recomputed block for "
            "the one cached copy)"
            + (
                " (adopt_cached_blocks is set by cache.engine; set it to false to keep copies)"
                if "cache.adopt_cached_blocks" in preset_keys
                else ""
            ),
        )
    if cache["memory"] == "unified":
        refuse_pool_sizes(
            given_cache,
            where,
            "unset with cache.memory = 'unified'"
            + (
                " (set by cache.engine; set cache.memory = 'split' to override)"
                if "cache.memory" in preset_keys
                else ""
            )
            + ": KV blocks and checkpoint slots come out of one budget "
            "(cache.cache_budget_bytes)",
        )
        if cache["checkpoint_share"] is not None:
            raise ScenarioError(
                where,
                "cache.checkpoint_share",
                cache["checkpoint_share"],
                "unset with cache.memory = 'unified' (one pool: nothing to divide)"
                + (" (set by cache.engine)" if "cache.checkpoint_share" in preset_keys else ""),
            )
    elif cache["checkpoint_share"] is not None:
        refuse_pool_sizes(
            given_cache,
            where,
            "unset with cache.checkpoint_share"
            + (" (set by cache.engine)" if "cache.checkpoint_share" in preset_keys else "")
            + ": both pools are sized from one budget (cache.cache_budget_bytes)",
        )
    elif cache["cache_budget_bytes"] is not None:
        raise ScenarioError(
            where,
            "cache.cache_budget_bytes",
            cache["cache_budget_bytes"],
            "unset unless cache.memory = 'unified' or cache.checkpoint_share is set (split "
            "pools are otherwise sized by kv_* and checkpoint_*)",
        )
    if cache["checkpoint_slots"] is not None and "checkpoint_budget_bytes" in given_cache:
        raise ScenarioError(
            where,
            "cache.checkpoint_budget_bytes",
            cache["checkpoint_budget_bytes"],
            "unset when cache.checkpoint_slots is set (the pool is sized one way or the other)",
        )
    kv_blocks: int | None = cache["kv_blocks"]
    if cache["kv_budget_bytes"] is not None:
        if kv_blocks is not None:
            raise ScenarioError(
                where,
                "cache.kv_budget_bytes",
                cache["kv_budget_bytes"],
                "unset when cache.kv_blocks is set",
            )
        costs = CostModel(
            model_sizes,
            get_gpu(model["gpu"]),
            block_size=cache["block_size"],
            deployment=Deployment(
                tensor_parallel=deployment["tensor_parallel"],
                pipeline_parallel=deployment["pipeline_parallel"],
            ),
        )
        page = cache["block_size"] * max(costs.kv_bytes_per_token, 1)
        kv_blocks = cache["kv_budget_bytes"] // page
        if not 1 <= kv_blocks <= MAX_KV_BLOCKS:
            raise ScenarioError(
                where,
                "cache.kv_budget_bytes",
                cache["kv_budget_bytes"],
                f"at least one and at most {MAX_KV_BLOCKS} KV pages ({page} bytes each)",
            )
    return kv_blocks


def does_not_fit(
    where: str, deployment: Mapping[str, Any], error: PlanDoesNotFitError
) -> ScenarioError:
    """The scenario error of a plan that does not fit its GPUs (the numbers included)."""
    return ScenarioError(
        where,
        "deployment.tensor_parallel",
        deployment["tensor_parallel"],
        f"a deployment the plan fits: {error}",
    )


def refuse_pool_sizes(given_cache: Mapping[str, Any], where: str, expected: str) -> None:
    """Raise for the first split-pool size the file sets (``cache.kv_blocks`` ...)."""
    for key in ("kv_blocks", "kv_budget_bytes", "checkpoint_slots", "checkpoint_budget_bytes"):
        if key in given_cache:
            raise ScenarioError(where, f"cache.{key}", given_cache[key], expected)


def apply_preset(
    data: dict[str, Any],
    tables: dict[str, dict[str, Any]],
    where: str,
    model_sizes: ModelSizes,
) -> set[str]:
    """Fill in the ``cache.engine`` preset's settings the file does not set; return the
    dotted keys the preset set."""
    name = tables["cache"]["engine"]
    if name == "none":
        return set()
    applied: set[str] = set()

    def given(table: str, key: str) -> bool:
        values = data.get(table, {})
        return isinstance(values, dict) and key in values

    deployment = tables["deployment"]
    share = shard_model(model_sizes, deployment["tensor_parallel"], deployment["pipeline_parallel"])
    # A state dtype the file sets is the engine's: the preset's model-dependent settings
    # (vLLM's block size) follow it, and the preset keeps it.
    dtype = tables["cache"]["ssm_state_dtype"] if given("cache", "ssm_state_dtype") else None
    preset = PRESETS[name]
    settings = {
        **preset.settings(share, None if dtype == "model" else dtype, fixed=dtype),
        **preset.scheduling(get_gpu(tables["model"]["gpu"]), tables["engine"]["spec_tokens"]),
    }
    for dotted, value in settings.items():
        table, key = dotted.split(".")
        # A policy's parameters go with the policy: a file that picks another policy
        # does not get the preset's parameters for it.
        if given(table, key) or (key == "params" and given(table, "policy")):
            continue
        tables[table][key] = dict(value) if isinstance(value, dict) else value
        applied.add(dotted)
    return applied
