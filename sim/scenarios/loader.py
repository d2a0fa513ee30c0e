"""Load and validate scenario files: :func:`load_scenario`, :class:`Scenario`.

Every problem raises :class:`~sim.scenarios.schema.ScenarioError` naming the file, the
dotted key path (``cache.block_size``), the value found and what was expected; unknown
keys and tables get a "did you mean" suggestion for near-misses.

Relative paths (``workload.trace``, ``workload.params.arrivals.path``) are relative to the
scenario file, in its tables and in its ``[sweep]`` values alike; the loader makes them
paths that hold from the working directory (sweep values: absolute paths). Values given
to :meth:`Scenario.with_overrides` are taken as they are (relative to the working
directory); :meth:`Scenario.absolute_paths` resolves them against a folder of your choice.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from reference.conformance.loading import load_implementation
from reference.errors import HyckptError
from reference.eviction import make_eviction
from reference.placement import make_placement
from reference.sizes import MODELS, ModelSizes
from sim.engine.config import (
    MAX_CHECKPOINT_SLOTS,
    SGLANG_STATES_PER_RUNNING_REQUEST,
    Faults,
    SimConfig,
    check_finite_params,
)
from sim.engine.deployment import PlanDoesNotFitError
from sim.engine.sequence import RequestLike
from sim.engine.sessions import closed_loop
from sim.engine.sources import COUNT_FIELDS, build_trace, build_workload, canonical_name
from sim.scenarios.duplicate_keys import given_twice
from sim.scenarios.key_paths import (
    rebase_paths,
    rebased_value,
    set_path,
    unset_path,
)
from sim.scenarios.model_table import check_key
from sim.scenarios.pool_rules import apply_preset, checked_model, checked_pools, does_not_fit
from sim.scenarios.schema import (
    DEFAULT_EXPECT,
    EXPECTATIONS,
    FREE_TABLES,
    MISSING,
    SCHEMA,
    TABLES,
    TIMING_ONLY_KEYS,
    ScenarioError,
    check_expect_value,
    suggestion,
)
from sim.scenarios.workload_mix import MixComponent, build_mix, check_mix, mix_components

#: The shipped scenario files (``scenarios/*.toml`` at the repository root).
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
#: The packaged copy of the default scenario (identical to one in :data:`SCENARIO_DIR`).
DEFAULT_SCENARIO_RESOURCE = "default.toml"
#: ``workload.params`` keys the loader sets from other keys (key -> the key to set).
RESERVED_KEYS: dict[str, str] = {
    "name": "workload.generator",
    "seed": "scenario.seed (or scenario.seeds)",
    "requests": "workload.requests",
}


class Combination(dict[str, object]):
    """The axis values of one sweep run (axis key -> value), shown as ``key=value, ...``
    in an error message."""

    def __repr__(self) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in self.items())


@dataclass(frozen=True)
class WorkloadSpec:
    """What ``[workload]`` describes: a generator (with parameters), a trace file or a mix.

    Attributes:
        generator: generator name (:data:`sim.engine.sources.WORKLOAD_NAMES`) or ``None``.
        requests: requests to simulate.
        params: fields of the generator's configuration (``workload.params``).
        trace: path of a JSONL trace (absolute, or relative to the working directory).
        trace_format: ``sessions`` or ``mooncake``.
        trace_block_size: tokens per ``hash_ids`` entry of a mooncake trace.
        mix: the components of a mixed workload (``[[workload.mix]]``; empty otherwise).
    """

    generator: str | None
    requests: int
    params: Mapping[str, Any] = field(default_factory=dict)
    trace: str | None = None
    trace_format: str = "sessions"
    trace_block_size: int = 512
    mix: tuple[MixComponent, ...] = ()

    def build(self, seed: int) -> tuple[Callable[[], Iterator[RequestLike]], dict[str, object]]:
        """A factory of the request stream (seeded with ``seed``) and its description."""
        if self.trace is not None:
            return build_trace(self.trace, self.trace_format, self.requests, self.trace_block_size)
        if self.mix:
            return build_mix(self.mix, self.requests, seed)
        assert self.generator is not None
        return build_workload(self.generator, self.requests, seed, **copy.deepcopy(self.params))


@dataclass(frozen=True)
class Scenario:
    """One validated scenario file.

    Attributes:
        name: ``scenario.name``: result file names and ``reports/<name>/``.
        description: ``scenario.description``.
        path: the file it was loaded from (``None`` for the embedded default).
        seed: the default seed of the workload and the engine.
        seeds: every seed the scenario lists (``scenario.seeds``; ``(seed,)`` if absent).
        sim_config: the engine configuration (its ``seed`` is :attr:`seed`).
        workload: the workload spec.
        expect: ``[expect]`` bounds, with :data:`~sim.scenarios.schema.DEFAULT_EXPECT`.
        sweep_axes: ``[sweep]``: dotted key path -> values (relative trace paths in them
            made absolute against the scenario file's folder).
        data: the file's tables as parsed (what :meth:`with_overrides` edits).
    """

    name: str
    description: str
    path: Path | None
    seed: int
    seeds: tuple[int, ...]
    sim_config: SimConfig
    workload: WorkloadSpec
    expect: Mapping[str, float]
    sweep_axes: dict[str, list[object]]
    data: Mapping[str, Any] = field(repr=False, compare=False)

    def with_overrides(
        self, overrides: Mapping[str, object], *, check_sweep: bool = True
    ) -> Scenario:
        """This scenario with values replaced at dotted key paths.

        ``{"eviction.policy": "fifo", "cache.checkpoint_slots": 64}``; values are checked
        like file values (errors name the key path). ``scenario.seed`` sets the seed. A
        relative path in a value is relative to the working directory (see
        :meth:`absolute_paths`). ``check_sweep=False`` leaves the ``[sweep]`` table
        unchecked (a sweep whose axes replace it, or one run of a checked sweep).
        """
        return self._override(overrides, check_sweep=check_sweep)

    def absolute_paths(self, key: str, values: Sequence[object], base_dir: Path) -> list[object]:
        """``values`` of the dotted key path ``key`` with every relative file path they set
        (:data:`PATH_KEYS`, also inside a table value) made absolute against ``base_dir``,
        the folder they are relative to: the scenario file's for its ``[sweep]``, the
        working directory for ``hyckpt sweep --axis``. Other values are returned as given.
        """
        return [rebased_value(self.data, key, value, base_dir) for value in values]

    def shown_paths(self, key: str, values: Sequence[object], base_dir: Path) -> list[object]:
        """The reverse of :meth:`absolute_paths`: ``values`` with the absolute file paths
        they set made relative to ``base_dir``, as a sweep records and labels them (long
        absolute paths would crowd every legend and file name)."""
        return [rebased_value(self.data, key, value, base_dir, relative=True) for value in values]

    def check_combinations(
        self, axes: Mapping[str, Sequence[object]], *, key: str = "sweep"
    ) -> None:
        """Check every run of a sweep over ``axes``: each combination of their values (the
        cross product, as :func:`sim.sweep.expand_jobs` makes it) applied together, with
        the ``[sweep]`` table left unchecked. Nothing is run; a workload is started (its
        first request made) once per distinct ``[workload]`` table and seed.

        Raises:
            ScenarioError: the first invalid combination, as ``key`` (``sweep``, or
                ``--axis`` for axes from the command line): its values and the problem.
        """
        _check_combinations(self, axes, self._where(), key, set())

    def _override(
        self,
        overrides: Mapping[str, object],
        *,
        check_sweep: bool,
        started: set[str] | None = None,
    ) -> Scenario:
        data = copy.deepcopy(dict(self.data))
        for dotted, value in overrides.items():
            alternative = ALTERNATIVE_SIZES.get(dotted)
            if alternative is not None and alternative not in overrides:
                unset_path(data, alternative)  # the override replaces the file's pool size
            set_path(data, dotted, value, self._where())
        return build_scenario(
            data, self._where(), self.path, base_dir=None, check_sweep=check_sweep, started=started
        )

    def _where(self) -> str:
        return str(self.path) if self.path is not None else f"<scenario {self.name}>"


#: The two ways of sizing each pool: an override (a sweep axis, ``--axis``) of one replaces
#: the other where the file sets it; a file or an override that sets both is refused.
ALTERNATIVE_SIZES = {
    "cache.checkpoint_slots": "cache.checkpoint_budget_bytes",
    "cache.checkpoint_budget_bytes": "cache.checkpoint_slots",
    "cache.kv_blocks": "cache.kv_budget_bytes",
    "cache.kv_budget_bytes": "cache.kv_blocks",
}


def model_length(value: object, model: ModelSizes, where: str) -> int | None:
    """``engine.max_model_len`` in tokens: ``"model"`` is the model's
    ``max_position_embeddings`` (an error when its description has none)."""
    if value != "model":
        return value  # type: ignore[return-value]  # checked by the schema: int or None
    if not model.max_position_embeddings:
        raise ScenarioError(
            where,
            "engine.max_model_len",
            value,
            f"a number of tokens: {model.name}'s description gives no "
            "max_position_embeddings (add it to the model, or set the length here)",
        )
    return model.max_position_embeddings


def load_scenario(path: str | Path, *, check_sweep: bool = True) -> Scenario:
    """Read, validate and return the scenario in ``path``.

    ``check_sweep=False`` checks the ``[sweep]`` table's shape only, not its values and
    their combinations (for a sweep that replaces the table, or one run of a sweep).

    Raises:
        ScenarioError: unreadable file, bad TOML, or any invalid key or value.
    """
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as error:
        expected = f"a readable file ({error.strerror})"
        raise ScenarioError(str(file), "(file)", MISSING, expected) from None
    return _parse(raw, str(file), file, check_sweep)


def load_default_scenario(*, check_sweep: bool = True) -> Scenario:
    """The embedded default scenario (package data ``sim/scenarios/default.toml``);
    ``check_sweep`` as for :func:`load_scenario`."""
    raw = resources.files("sim.scenarios").joinpath(DEFAULT_SCENARIO_RESOURCE).read_bytes()
    return _parse(raw, "sim/scenarios/default.toml", None, check_sweep)


def _parse(raw: bytes, where: str, path: Path | None, check_sweep: bool) -> Scenario:
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as error:
        raise ScenarioError(where, "(file)", MISSING, f"valid UTF-8 TOML ({error})") from None
    except tomllib.TOMLDecodeError as error:
        twice = given_twice(text, str(error))
        if twice is not None:  # name the key tomllib leaves out
            raise ScenarioError(where, *twice) from None
        raise ScenarioError(where, "(file)", MISSING, f"valid UTF-8 TOML ({error})") from None
    base = path.parent if path is not None else None
    return build_scenario(data, where, path, base_dir=base, check_sweep=check_sweep)


def build_scenario(
    parsed: Mapping[str, Any],
    where: str,
    path: Path | None,
    *,
    base_dir: Path | None,
    check_sweep: bool = True,
    started: set[str] | None = None,
) -> Scenario:
    """Validate parsed tables and build the :class:`Scenario` (``where`` names the source).

    ``base_dir`` resolves a relative ``workload.trace`` or arrivals path, in the tables
    and in ``[sweep]`` values (the scenario file's folder). ``check_sweep`` checks every
    ``[sweep]`` value and every combination of them (else only the table's shape).
    ``started`` holds the workloads and implementations already checked (a sweep's
    combinations share them, so that each is started once).
    """
    data: dict[str, Any] = copy.deepcopy(dict(parsed))
    started = set() if started is None else started
    for name in data:
        if name not in TABLES:
            raise ScenarioError(
                where,
                name,
                data[name],
                f"a known table ({', '.join(TABLES)}){suggestion(name, list(TABLES))}",
            )
    tables = {name: _table(data, name, where) for name in SCHEMA}
    if base_dir is not None and isinstance(data.get("workload"), dict):
        # workload.trace and an arrivals trace (workload.params.arrivals = {kind = "trace",
        # path = ...}) are relative to the scenario file; tables["workload"]["params"] is
        # data["workload"]["params"] (the same dict).
        rebase_paths(data, base_dir)
        tables["workload"]["trace"] = data["workload"].get("trace")
    expect = _expect(data, where)
    scenario = _assemble(data, tables, expect, where, path, started)
    axes = _sweep(data, scenario, where, check_sweep, base_dir, started)
    object.__setattr__(scenario, "sweep_axes", axes)
    return scenario


def _table(data: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    """The keys of table ``name`` with defaults filled in; checks every key."""
    raw = data.get(name, {})
    if not isinstance(raw, dict):
        raise ScenarioError(where, name, raw, "a table")
    keys = SCHEMA[name]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{name}.{key}"
        if dotted in FREE_TABLES:
            if not isinstance(value, dict):
                raise ScenarioError(where, dotted, value, f"a table of {FREE_TABLES[dotted]}")
            out[key] = value
            continue
        spec = keys.get(key)
        if spec is None and name == "model":
            check_key(where, key, value)  # a key that describes the model
            out[key] = value
            continue
        if spec is None:
            known = [*keys, *(k.split(".")[1] for k in FREE_TABLES if k.startswith(f"{name}."))]
            raise ScenarioError(
                where,
                dotted,
                value,
                f"a key of [{name}] ({', '.join(known)}){suggestion(key, known)}",
            )
        problem = spec.check(value)
        if problem is not None:
            raise ScenarioError(where, dotted, value, problem)
        out[key] = value
    for key, spec in keys.items():
        if key not in out:
            if spec.default is MISSING:
                raise ScenarioError(where, f"{name}.{key}", MISSING, f"a value: {spec.doc}")
            out[key] = spec.default
    out.setdefault("params", {})
    return out


def _expect(data: dict[str, Any], where: str) -> dict[str, float]:
    raw = data.get("expect", {})
    if not isinstance(raw, dict):
        raise ScenarioError(where, "expect", raw, "a table")
    expect: dict[str, float] = dict(DEFAULT_EXPECT)
    for key, value in raw.items():
        if key not in EXPECTATIONS:
            known = list(EXPECTATIONS)
            raise ScenarioError(
                where,
                f"expect.{key}",
                value,
                f"a key of [expect] ({', '.join(known)}){suggestion(key, known)}",
            )
        problem = check_expect_value(key, value)
        if problem is not None:
            raise ScenarioError(where, f"expect.{key}", value, problem)
        expect[key] = value
    if "min_lockstep_violations" in raw and "max_lockstep_violations" not in raw:
        # A scenario that expects violations: the default bound of 0 does not apply.
        del expect["max_lockstep_violations"]
    for key, value in raw.items():
        upper = f"max_{key.removeprefix('min_')}"
        if key.startswith("min_") and upper in raw and value > raw[upper]:
            raise ScenarioError(where, f"expect.{key}", value, f"<= expect.{upper} ({raw[upper]})")
    return expect


def _sweep(
    data: dict[str, Any],
    scenario: Scenario,
    where: str,
    check: bool,
    base_dir: Path | None,
    started: set[str],
) -> dict[str, list[object]]:
    raw = data.get("sweep", {})
    if not isinstance(raw, dict):
        raise ScenarioError(where, "sweep", raw, "a table of dotted key paths to lists")
    axes: dict[str, list[object]] = {}
    # Every axis's shape first, so that an error names the axis that has it (a value is
    # checked by overriding it into the file, whose other axes must then be well-formed).
    for key, values in _flatten(raw).items():
        dotted = f"sweep.{key}"
        if key.split(".")[0] in ("sweep", "expect") or key.split(".")[0] not in SCHEMA:
            tables = list(SCHEMA)
            raise ScenarioError(
                where,
                dotted,
                values,
                f"a key path into {', '.join(tables)}{suggestion(key.split('.')[0], tables)}",
            )
        if not isinstance(values, list) or not values:
            raise ScenarioError(where, dotted, values, "a non-empty list of values")
        axes[key] = list(values)
    if base_dir is not None:
        # A relative path in a [sweep] value is relative to the scenario file, like one in
        # its tables; the table is rewritten so that with_overrides re-checks the same.
        resolved = {
            key: scenario.absolute_paths(key, values, base_dir) for key, values in axes.items()
        }
        if resolved != axes:
            axes = data["sweep"] = resolved
    if not check:
        return axes
    for key, values in axes.items():
        for index, value in enumerate(values):
            try:
                scenario._override({key: value}, check_sweep=False, started=started)
            except ScenarioError as error:
                expected = error.expected if error.key == key else f"{error.key}: {error.expected}"
                raise ScenarioError(where, f"sweep.{key}[{index}]", value, expected) from None
    if len(axes) > 1:  # each value is valid alone; now every run of the sweep
        _check_combinations(scenario, axes, where, "sweep", started)
    return axes


def _check_combinations(
    scenario: Scenario,
    axes: Mapping[str, Sequence[object]],
    where: str,
    key: str,
    started: set[str],
) -> None:
    """Apply every combination of ``axes`` (the cross product, last axis fastest) to
    ``scenario`` and validate it; the first invalid one raises, as ``key``."""
    keys = list(axes)
    for values in itertools.product(*(axes[k] for k in keys)):
        combination = Combination(zip(keys, values, strict=True))
        try:
            scenario._override(combination, check_sweep=False, started=started)
        except ScenarioError as error:
            raise ScenarioError(
                where,
                key,
                combination,
                f"axis values that are valid together (with these, {error.detail}); a "
                "sweep runs every combination of its axes' values, so change or drop one",
            ) from None


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": [1]}}`` -> ``{"a.b": [1]}`` (quoted dotted keys stay as they are)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def _assemble(
    data: dict[str, Any],
    tables: dict[str, dict[str, Any]],
    expect: dict[str, float],
    where: str,
    path: Path | None,
    started: set[str] | None = None,
) -> Scenario:
    meta, model, cache, engine = (
        tables["scenario"],
        tables["model"],
        tables["cache"],
        tables["engine"],
    )
    seeds: list[int] | None = meta["seeds"]
    seed = meta["seed"] if meta["seed"] is not None else (seeds[0] if seeds else 0)
    given_cache = data.get("cache", {})
    model_sizes = checked_model(data, tables, where)
    deployment = tables["deployment"]
    preset_keys = apply_preset(data, tables, where, model_sizes)
    if "cache.generated_state_grid" in preset_keys and tables["backend"]["name"] != "shadow":
        name = tables["cache"]["engine"]
        raise ScenarioError(
            where,
            "backend.name",
            tables["backend"]["name"],
            f"'shadow' with cache.engine = {name!r}: it runs {model_sizes.name} with SGLang's "
            "extra_buffer, whose answer state sits at a decode-tracked position only the "
            "shadow backend models (docs/SEMANTICS.md H8a); use cache.engine = "
            "'sglang-no-buffer' for real tensors",
        )
    kv_blocks = checked_pools(given_cache, tables, where, preset_keys, model_sizes)
    if engine["mode"] == "replay":
        for dotted in TIMING_ONLY_KEYS:
            table, key = dotted.split(".")
            given = data.get(table, {})
            if isinstance(given, dict) and key in given:
                raise ScenarioError(
                    where,
                    dotted,
                    given[key],
                    "unset with engine.mode = 'replay': a cache-only replay has no timing, "
                    "sessions or preemption, so it would ignore this key",
                )
    placement, eviction, backend = tables["placement"], tables["eviction"], tables["backend"]
    faults_table = {k: v for k, v in tables["faults"].items() if k != "params"}
    unit = cache["hash_unit"] if cache["hash_unit"] is not None else cache["block_size"]
    if cache["block_size"] % unit:
        raise ScenarioError(
            where,
            "cache.hash_unit",
            cache["hash_unit"],
            f"a divisor of cache.block_size ({cache['block_size']})",
        )
    budget_needed = engine["max_num_seqs"] * (1 + engine["spec_tokens"])
    if cache["token_budget"] < budget_needed:
        raise ScenarioError(
            where,
            "cache.token_budget",
            cache["token_budget"],
            f">= engine.max_num_seqs * (1 + engine.spec_tokens) = {budget_needed}",
        )
    if backend["name"] == "external" and backend["impl"] is None:
        raise ScenarioError(where, "backend.impl", None, "module:factory for backend 'external'")
    if backend["buffer_habits"] and backend["name"] == "shadow":
        raise ScenarioError(
            where,
            "backend.buffer_habits",
            backend["buffer_habits"],
            "none with backend 'shadow', which has no tensors (buffer habits need backend "
            "'reference', 'gpu' or 'external')",
        )
    for table in ("placement", "eviction"):
        for key, value in tables[table]["params"].items():
            try:
                check_finite_params(f"{table}.params", {key: value})
            except HyckptError:
                raise ScenarioError(
                    where, f"{table}.params.{key}", value, "finite numbers (no nan or inf)"
                ) from None
    # SGLang caps its running requests by its Mamba pool (the timed engine's
    # max_num_seqs): found on a provisional config, filled in unless the file sets it.
    sglang_cap = engine["mode"] == "engine" and cache["checkpoint_share_rule"] in (
        SGLANG_STATES_PER_RUNNING_REQUEST
    )
    max_num_seqs = 1 if sglang_cap else engine["max_num_seqs"]
    try:
        config = SimConfig(
            model=model_sizes.name,
            model_sizes=None if model_sizes.name in MODELS else model_sizes,
            gpu=model["gpu"],
            tensor_parallel=deployment["tensor_parallel"],
            pipeline_parallel=deployment["pipeline_parallel"],
            allreduce_latency_s=deployment["allreduce_latency_s"],
            link_efficiency=deployment["link_efficiency"],
            block_size=cache["block_size"],
            hash_unit=cache["hash_unit"],
            token_budget=cache["token_budget"],
            decodes_share_budget=cache["decodes_share_budget"],
            max_num_seqs=max_num_seqs,
            kv_blocks=kv_blocks,
            checkpoint_budget_bytes=cache["checkpoint_budget_bytes"],
            placement=placement["policy"],
            placement_params=placement["params"],
            eviction=eviction["policy"],
            eviction_params=eviction["params"],
            spec_tokens=engine["spec_tokens"],
            spec_acceptance=engine["spec_acceptance"],
            backend=backend["name"],
            impl=backend["impl"],
            seed=seed,
            sample_interval_s=engine["sample_interval_s"],
            fuse_decode_steps=engine["fuse_decode_steps"],
            async_scheduling=engine["async_scheduling"],
            preemption=engine["preemption"],
            preemption_policy=engine["preemption_policy"],
            mixed_batches=engine["mixed_batches"],
            refresh_waiting_prefixes=engine["refresh_waiting_prefixes"],
            pause_after_refusal=engine["pause_after_refusal"],
            allocate_after_lookups=engine["allocate_after_lookups"],
            lookup_refreshes_prefix=engine["lookup_refreshes_prefix"],
            decode_reservation=engine["decode_reservation"],
            admit_after_preemption=engine["admit_after_preemption"],
            max_model_len=model_length(engine["max_model_len"], model_sizes, where),
            length_limits=engine["length_limits"],
            client_max_tokens=tables["workload"]["max_tokens"],
            closed_loop=closed_loop(
                tables["workload"]["sessions"], trace=tables["workload"]["trace"] is not None
            ),
            check_exactness=backend["check_exactness"],
            buffer_habits=tuple(backend["buffer_habits"]),
            mfu=engine["mfu"],
            mbu=engine["mbu"],
            copy_efficiency=engine["copy_efficiency"],
            step_overhead_s=engine["step_overhead_s"],
            copy_launch_s=engine["copy_launch_s"],
            cache_generated=cache["cache_generated"],
            generated_state=cache["generated_state"],
            generated_state_grid=cache["generated_state_grid"],
            kv_up_to_checkpoint=cache["kv_up_to_checkpoint"],
            capture_all=cache["capture_all"],
            keep_block_copies=cache["keep_block_copies"],
            running_states=cache["running_states"],
            state_handover=cache["state_handover"],
            block_aligned_chunks=cache["block_aligned_chunks"],
            release_recency=cache["release_recency"],
            interleaved_free=cache["interleaved_free"],
            required_captures=cache["required_captures"],
            admit_full_prompt=cache["admit_full_prompt"],
            states_in_place=cache["states_in_place"],
            drop_leaf_kv=cache["drop_leaf_kv"],
            adopt_cached_blocks=cache["adopt_cached_blocks"],
            hold_latest_checkpoint=cache["hold_latest_checkpoint"],
            captures_in_step=cache["captures_in_step"],
            workload_hints=placement["workload_hints"],
            checkpoint_share=cache["checkpoint_share"],
            checkpoint_share_rule=cache["checkpoint_share_rule"],
            ssm_state_dtype=(
                None if cache["ssm_state_dtype"] == "model" else cache["ssm_state_dtype"]
            ),
            warmup_requests=engine["warmup_requests"],
            mode=engine["mode"],
            memory=cache["memory"],
            cache_budget_bytes=cache["cache_budget_bytes"],
            reserved_pages=cache["reserved_pages"],
            faults=Faults(**faults_table),
            # Sized below, so that an error can name cache.checkpoint_budget_bytes.
            checkpoint_slots=(cache["checkpoint_slots"] or 1)
            if cache["memory"] == "split" and cache["checkpoint_share"] is None
            else None,
        )
    except PlanDoesNotFitError as error:
        raise does_not_fit(where, deployment, error) from None
    except HyckptError as error:
        raise ScenarioError(
            where, "(engine configuration)", MISSING, f"a valid engine ({error})"
        ) from None
    if sglang_cap:
        config = _capped_running(config, engine["max_num_seqs"], data, where)
    if (
        cache["checkpoint_slots"] is None
        and cache["memory"] == "split"
        and cache["checkpoint_share"] is None
    ):
        per_slot = config.checkpoint_slot_bytes()
        if not 1 <= cache["checkpoint_budget_bytes"] // per_slot <= MAX_CHECKPOINT_SLOTS:
            raise ScenarioError(
                where,
                "cache.checkpoint_budget_bytes",
                cache["checkpoint_budget_bytes"],
                f"at least one and at most {MAX_CHECKPOINT_SLOTS} checkpoint slots "
                f"({per_slot} bytes each)",
            )
        try:
            config = dataclasses.replace(config, checkpoint_slots=None)
        except PlanDoesNotFitError as error:
            raise does_not_fit(where, deployment, error) from None
    if backend["impl"] is not None and not _seen(started, "impl", backend["impl"]):
        try:
            load_implementation(backend["impl"])
        except HyckptError as error:
            raise ScenarioError(
                where, "backend.impl", backend["impl"], f"a loadable module:factory ({error})"
            ) from None
        _mark(started, "impl", backend["impl"])
    for table, check in (
        ("placement", lambda: make_placement(config.placement, **config.placement_arguments())),
        ("eviction", lambda: make_eviction(config.eviction, **config.eviction_params)),
    ):
        try:
            check()
        except (HyckptError, TypeError) as error:
            params = tables[table]["params"]
            raise ScenarioError(
                where, f"{table}.params", params, f"valid parameters ({error})"
            ) from None
    workload = _workload(tables["workload"], seed, where, started)
    return Scenario(
        name=meta["name"],
        description=meta["description"],
        path=path,
        seed=seed,
        seeds=tuple(seeds) if seeds else (seed,),
        sim_config=config,
        workload=workload,
        expect=expect,
        sweep_axes={},
        data=data,
    )


def _capped_running(
    config: SimConfig, max_num_seqs: int, data: Mapping[str, Any], where: str
) -> SimConfig:
    """``config`` with ``max_num_seqs`` (the file's, else the default capped at SGLang's
    running-request limit, :meth:`SimConfig.sglang_running_cap`)."""
    cap = config.sglang_running_cap()
    assert cap is not None
    given = data.get("engine", {})
    if isinstance(given, Mapping) and "max_num_seqs" in given and max_num_seqs > cap:
        raise ScenarioError(
            where,
            "engine.max_num_seqs",
            max_num_seqs,
            f"<= {cap}: SGLang runs at most {cap} requests with this Mamba pool "
            f"({config.checkpoint_share_rule} share rule, "
            "kv_cache_configurator.resolve_max_num_reqs); raise cache.cache_budget_bytes "
            "for more",
        )
    # Fewer running requests only shrink the plan: nothing new to refuse.
    return dataclasses.replace(config, max_num_seqs=min(max_num_seqs, cap))


def _seen(started: set[str] | None, *what: object) -> bool:
    return started is not None and repr(what) in started


def _mark(started: set[str] | None, *what: object) -> None:
    if started is not None:
        started.add(repr(what))


def _workload(
    table: dict[str, Any], seed: int, where: str, started: set[str] | None = None
) -> WorkloadSpec:
    """The workload spec of ``[workload]``, started once (its first request made) unless
    ``started`` holds the same table and seed already."""
    if _seen(started, "workload", table, seed):
        return _spec(table)
    spec = _checked_workload(table, seed, where)
    _mark(started, "workload", table, seed)
    return spec


def _spec(table: dict[str, Any]) -> WorkloadSpec:
    """The spec of a ``[workload]`` table that has been checked."""
    if table["trace"] is not None:
        return WorkloadSpec(
            None,
            table["requests"],
            {},
            table["trace"],
            table["trace_format"],
            table["trace_block_size"],
        )
    if table["mix"] is not None:
        return WorkloadSpec(None, table["requests"], mix=mix_components(table["mix"]))
    generator = canonical_name(table["generator"])
    return WorkloadSpec(generator, table["requests"], dict(table["params"]))


def _checked_workload(table: dict[str, Any], seed: int, where: str) -> WorkloadSpec:
    generator, trace, mixed = table["generator"], table["trace"], table["mix"]
    if mixed is not None:
        for other in ("generator", "trace"):
            if table[other] is not None:
                raise ScenarioError(
                    where,
                    "workload.mix",
                    mixed,
                    f"unset when workload.{other} is set: a workload is one of "
                    "workload.generator, workload.trace and workload.mix",
                )
        if table["params"]:
            raise ScenarioError(
                where,
                "workload.params",
                table["params"],
                "no parameters with workload.mix: each component has its own "
                "workload.mix[i].params",
            )
        return WorkloadSpec(
            None, table["requests"], mix=check_mix(mixed, table["requests"], seed, where)
        )
    if (generator is None) == (trace is None):
        raise ScenarioError(
            where,
            "workload.generator",
            generator,
            "exactly one of workload.generator, workload.trace and workload.mix",
        )
    if trace is not None:
        if table["params"]:
            raise ScenarioError(
                where, "workload.params", table["params"], "no parameters with a trace"
            )
        if not Path(trace).is_file():
            raise ScenarioError(where, "workload.trace", trace, "an existing trace file")
        traced = _spec(table)
        try:
            _start(traced, seed)
        except HyckptError as error:
            expected = f"a trace that yields requests ({error})"
            raise ScenarioError(where, "workload.trace", trace, expected) from None
        return traced
    for key, owner in RESERVED_KEYS.items():
        if key in table["params"]:
            raise ScenarioError(
                where,
                f"workload.params.{key}",
                table["params"][key],
                f"no {key!r} here: it is reserved, set {owner} instead",
            )
    count = COUNT_FIELDS.get(canonical_name(generator))
    if count == "num_requests" and count in table["params"]:
        # Both count requests: one would silently override the other.
        raise ScenarioError(
            where,
            f"workload.params.{count}",
            table["params"][count],
            "unset: workload.requests already sets how many requests this workload "
            f"generates ({table['requests']}); set it there",
        )
    spec = _spec(table)
    try:
        _start(spec, seed)
    except HyckptError as error:
        # Name the parameter when it is wrong on its own; else the table (cross-field).
        for key, value in spec.params.items():
            try:
                _start(WorkloadSpec(spec.generator, 1, {key: value}), seed)
            except HyckptError as single:
                expected = f"a valid parameter ({single})"
                raise ScenarioError(where, f"workload.params.{key}", value, expected) from None
        raise ScenarioError(
            where, "workload.params", table["params"], f"valid parameters ({error})"
        ) from None
    return spec


def _start(spec: WorkloadSpec, seed: int) -> None:
    """Build the workload and make its first request: a workload that yields none (a
    count of 0, an empty trace) or cannot start (an unreadable arrivals or trace file, a
    bad first line) is an error of the file, found by ``hyckpt check``, not by a run."""
    stream, _ = spec.build(seed)
    next(iter(stream()))
