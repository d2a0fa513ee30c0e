"""Scenario schema details pinned by hand mutation testing: the documented defaults of a
minimal file, the type and range of every key (and the values on the edge of their range
that load), messages that name the key and cut long values short, tables that must be
tables, cross-field rules of the cache, backend, workload and pool sizes, override paths,
and each expectation bounding the number it names."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import tomllib
import types
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.sweep  # noqa: F401  (the parser imports it; before tests fake sim.report)
from sim.engine.result import SimResult
from sim.scenarios import (
    Scenario,
    ScenarioError,
    WorkloadSpec,
    check_expectations,
    load_default_scenario,
    load_scenario,
    run_scenario,
)
from sim.scenarios.schema import EXPECTATIONS
from tests.scenarios._scenario_helpers import ROOT, TINY, load_error, write

# --- pinned by hand mutation testing: types, bounds, defaults, messages ----------------

#: The smallest valid scenario file: everything else takes its documented default.
MINIMAL = '[scenario]\nname = "minimal"\n\n[workload]\ngenerator = "chat"\nrequests = 1\n'


def minimal_with(lines: str) -> str:
    """:data:`MINIMAL` with ``lines`` (a ``[table]`` header, then keys) added to it."""
    header, _, body = lines.partition("\n")
    if header in ("[scenario]", "[workload]"):
        text = MINIMAL.replace(f"{header}\n", f"{header}\n{body}\n")
        return text.replace('name = "minimal"\n', "", 1) if "name =" in body else text
    return f"{MINIMAL}\n{lines}\n"


def test_a_minimal_file_takes_the_documented_defaults(tmp_path: Path) -> None:
    """Every key left out takes the default docs/SCENARIOS.md gives it."""
    scenario = load_scenario(write(tmp_path, MINIMAL))
    config = scenario.sim_config
    assert (scenario.name, scenario.description, scenario.seed, scenario.seeds) == (
        "minimal",
        "",
        0,
        (0,),
    )
    assert (config.model, config.gpu) == ("nemotron-h-8b", "h200")
    assert (config.block_size, config.hash_unit, config.token_budget) == (16, None, 8192)
    assert (config.kv_blocks, config.checkpoint_slots) == (None, None)
    assert config.checkpoint_budget_bytes == 16 * 2**30
    assert (config.max_num_seqs, config.spec_tokens, config.spec_acceptance) == (256, 0, 0.7)
    assert (config.sample_interval_s, config.fuse_decode_steps) == (1.0, True)
    assert (config.mfu, config.mbu, config.copy_efficiency) == (0.5, 0.8, 0.8)
    assert (config.step_overhead_s, config.copy_launch_s) == (0.0005, 0.000005)
    assert (config.placement, config.placement_params) == ("block-floor", {})
    assert (config.eviction, config.eviction_params) == ("lru", {})
    assert (config.backend, config.impl, config.check_exactness) == ("shadow", None, True)
    assert config.buffer_habits == ()
    assert config.closed_loop is True
    assert config.faults == type(config.faults)()  # every fault off
    assert scenario.workload == WorkloadSpec("multi_turn_chat", 1, {}, None, "sessions")
    assert scenario.expect == {"max_lockstep_violations": 0}
    assert scenario.sweep_axes == {}


HABITS_EXPECTED = (
    "a list of distinct names among padded_pools, reallocation, shared_export, sliced_inputs"
)


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        ("[cache]\nblock_size = true", "cache.block_size", "an integer >= 1 and <= 65536"),
        ("[engine]\nmax_num_seqs = false", "engine.max_num_seqs", "an integer >= 1 and <= 1048576"),
        ("[engine]\nmfu = true", "engine.mfu", "a number in (0.0, 1.0]"),
        ("[faults]\ncopy_delay_s = true", "faults.copy_delay_s", "a number in [0.0, 3600.0]"),
        ("[engine]\nfuse_decode_steps = 1", "engine.fuse_decode_steps", "true or false"),
        ("[backend]\ncheck_exactness = 0", "backend.check_exactness", "true or false"),
        (
            '[backend]\nname = "reference"\nbuffer_habits = "padded_pools"',
            "backend.buffer_habits",
            HABITS_EXPECTED,
        ),
        (
            '[backend]\nname = "reference"\nbuffer_habits = ["reallocation", "reallocation"]',
            "backend.buffer_habits",
            HABITS_EXPECTED + " (each at most once)",
        ),
        (
            '[backend]\nname = "reference"\nbuffer_habits = ["sliced_input"]',
            "backend.buffer_habits",
            HABITS_EXPECTED + "; did you mean 'sliced_inputs'?",
        ),
        (
            '[backend]\nbuffer_habits = ["sliced_inputs"]',
            "backend.buffer_habits",
            "none with backend 'shadow', which has no tensors (buffer habits need backend "
            "'reference', 'gpu' or 'external')",
        ),
        ("[cache]\nblock_size = 16.0", "cache.block_size", "an integer >= 1 and <= 65536"),
        ('[backend]\nimpl = ""', "backend.impl", "a non-empty string"),
        ('[workload]\ntrace = ""', "workload.trace", "a non-empty string"),
        (
            "[scenario]\nseeds = []",
            "scenario.seeds",
            "a non-empty list of integers >= 0 and <= 9223372036854775807",
        ),
        (
            "[scenario]\nseeds = [1, true]",
            "scenario.seeds",
            "a non-empty list of integers >= 0 and <= 9223372036854775807",
        ),
        ("[cache]\nhash_unit = 0", "cache.hash_unit", "an integer >= 1 and <= 65536"),
        ("[engine]\nspec_tokens = -1", "engine.spec_tokens", "an integer >= 0 and <= 1024"),
        ("[engine]\nmfu = 0.0", "engine.mfu", "a number in (0.0, 1.0]"),
        ("[engine]\nmbu = 0", "engine.mbu", "a number in (0.0, 1.0]"),
        ("[engine]\ncopy_efficiency = 1.5", "engine.copy_efficiency", "a number in (0.0, 1.0]"),
        (
            "[engine]\nsample_interval_s = 0.0",
            "engine.sample_interval_s",
            "a number in (0.0, 3600.0]",
        ),
        ("[engine]\nspec_acceptance = 1.01", "engine.spec_acceptance", "a number in [0.0, 1.0]"),
        ("[engine]\nstep_overhead_s = -0.1", "engine.step_overhead_s", "a number in [0.0, 3600.0]"),
        (
            "[engine]\nstep_overhead_s = 1" + "0" * 400,
            "engine.step_overhead_s",
            "a number in [0.0, 3600.0]",
        ),
        (
            "[faults]\ncapture_failure_rate = 1.5",
            "faults.capture_failure_rate",
            "a number in [0.0, 1.0]",
        ),
        (
            "[faults]\npreempt_mid_prefill_rate = -0.5",
            "faults.preempt_mid_prefill_rate",
            "a number in [0.0, 1.0]",
        ),
        ("[faults]\ncopy_delay_s = nan", "faults.copy_delay_s", "a number in [0.0, 3600.0]"),
        ("[expect]\nmax_ttft_p99_s = inf", "expect.max_ttft_p99_s", "a number >= 0.0"),
        ("[expect]\nmax_ttft_p99_s = -1.0", "expect.max_ttft_p99_s", "a number >= 0.0"),
        (
            "[expect]\nmax_preemptions = 1.5",
            "expect.max_preemptions",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmin_restores = 2.0",
            "expect.min_restores",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmin_evictions = -1",
            "expect.min_evictions",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmax_rejected = true",
            "expect.max_rejected",
            "an integer >= 0 and <= 9223372036854775807",
        ),
        (
            "[expect]\nmin_request_hit_rate = 1.5",
            "expect.min_request_hit_rate",
            "a number in [0.0, 1.0]",
        ),
    ],
)
def test_wrong_types_and_out_of_range_values_are_errors(
    tmp_path: Path, line: str, key: str, expected: str
) -> None:
    """A bool for a number, a number for a bool, an empty string or list, a value just
    outside its range or non-finite is an error naming its key."""
    error = load_error(tmp_path, minimal_with(line))
    assert (error.key, error.expected) == (key, expected)


@pytest.mark.parametrize(
    "line",
    [
        "[engine]\nspec_acceptance = 0.0",
        "[engine]\nspec_acceptance = 1",
        "[engine]\nspec_tokens = 0",
        "[engine]\nmfu = 1.0",
        "[engine]\nsample_interval_s = 3600",
        "[engine]\nstep_overhead_s = 0",
        "[faults]\ncapture_failure_rate = 1.0",
        "[cache]\nblock_size = 65536\nhash_unit = 65536",
        "[expect]\nmin_restores = 0",
        "[expect]\nmax_ttft_p99_s = 0",
        "[expect]\nmin_token_hit_rate = 0.5\nmax_token_hit_rate = 0.5",
        '[scenario]\nname = "' + "x" * 100 + '"',
        "[scenario]\nseeds = [0, 9223372036854775807]",
    ],
)
def test_values_on_the_edge_of_their_range_load(tmp_path: Path, line: str) -> None:
    """The documented bounds are inclusive where the docs say ``[``/``]`` (and a min_*
    bound may equal its max_* bound)."""
    assert isinstance(load_scenario(write(tmp_path, minimal_with(line))), Scenario)


@given(data=st.data())
def test_integer_and_number_checks_follow_their_bounds(data: st.DataObject) -> None:
    """An integer key takes exactly the ints in its range (never a bool or float); a
    number key takes the finite numbers in its range, open on the left when strict."""
    from sim.scenarios.schema import SCHEMA

    block_size = SCHEMA["cache"]["block_size"].check
    value = data.draw(st.integers(-3, 2**16 + 3), label="block_size")
    assert (block_size(value) is None) == (1 <= value <= 2**16)
    assert block_size(float(value)) == "an integer >= 1 and <= 65536"
    mfu = SCHEMA["engine"]["mfu"].check
    number = data.draw(st.floats(allow_nan=True, allow_infinity=True), label="mfu")
    assert (mfu(number) is None) == (0.0 < number <= 1.0)
    assert mfu(0) == mfu(True) == "a number in (0.0, 1.0]"
    overhead = SCHEMA["engine"]["step_overhead_s"].check
    assert (overhead(number) is None) == (0.0 <= number <= 3600.0)
    assert overhead(10**400) == "a number in [0.0, 3600.0]"


def test_a_required_key_that_is_missing_is_found_as_nothing(tmp_path: Path) -> None:
    """The message of a missing required key says "found nothing", not a repr."""
    error = load_error(tmp_path, MINIMAL.replace("requests = 1\n", ""))
    assert error.key == "workload.requests"
    assert (
        error.detail == "workload.requests: found nothing, expected a value: requests to simulate"
    )


def test_a_long_value_is_cut_short_in_the_message(tmp_path: Path) -> None:
    """A 401-digit value is shown as its first 100 characters and its length."""
    error = load_error(tmp_path, MINIMAL + "\n[engine]\nmfu = 1" + "0" * 400 + "\n")
    assert error.key == "engine.mfu" and error.value == 10**400
    shown = "1" + "0" * 99 + "... (401 characters)"
    assert error.detail == f"engine.mfu: found {shown}, expected a number in (0.0, 1.0]"


def test_override_key_paths_must_be_well_formed(tmp_path: Path) -> None:
    """An override path with an empty part, or one through a value that is not a table,
    is an error naming the path (not a TypeError)."""
    scenario = load_scenario(write(tmp_path, TINY))
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"cache..block_size": 16})
    assert info.value.key == "cache..block_size"
    assert info.value.expected == "a dotted key path like cache.block_size"
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"cache.block_size.x": 1})
    assert (info.value.key, info.value.value) == ("cache.block_size", 16)
    assert info.value.expected == "a table to set cache.block_size.x in"
    assert info.value.file == str(scenario.path)


def test_file_level_errors_name_the_file(tmp_path: Path) -> None:
    """A missing file and a file that is not UTF-8 are ScenarioErrors keyed "(file)"."""
    missing = tmp_path / "missing.toml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(missing)
    assert (info.value.file, info.value.key) == (str(missing), "(file)")
    assert info.value.expected.startswith("a readable file (")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'[scenario]\nname = "\xff\xfe"\n')
    with pytest.raises(ScenarioError) as info:
        load_scenario(binary)
    assert (info.value.file, info.value.key) == (str(binary), "(file)")
    assert info.value.expected.startswith("valid UTF-8 TOML (")


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("cache = 5\n", "cache", "a table"),
        ("expect = 5\n", "expect", "a table"),
        ("sweep = 5\n", "sweep", "a table of dotted key paths to lists"),
        (
            "[placement]\nparams = 5\n",
            "placement.params",
            "a table of keyword arguments of the placement policy",
        ),
        (
            "[workload.x]\n",
            "workload.x",
            "a key of [workload] (generator, trace, trace_format, trace_block_size, sessions, "
            "requests, max_tokens, mix, params)",
        ),
    ],
)
def test_tables_must_be_tables(tmp_path: Path, text: str, key: str, expected: str) -> None:
    """A value where a table belongs is an error naming that table, not a crash."""
    whole = MINIMAL + "\n" + text if text.startswith("[") else text + MINIMAL
    error = load_error(tmp_path, whole)
    assert (error.key, error.expected) == (key, expected)


def test_a_typo_of_params_is_suggested(tmp_path: Path) -> None:
    """``params`` counts among a table's known keys, so a near-miss gets a suggestion."""
    error = load_error(tmp_path, MINIMAL + "\n[placement]\nparam = { margin = 4 }\n")
    assert error.key == "placement.param"
    assert error.expected == (
        "a key of [placement] (policy, workload_hints, params); did you mean 'params'?"
    )


def test_lockstep_bounds_both_kept_when_both_given(tmp_path: Path) -> None:
    """``min_lockstep_violations`` drops the default max of 0 only when no max is given."""
    text = TINY.replace(
        "max_lockstep_violations = 0", "min_lockstep_violations = 1\nmax_lockstep_violations = 3"
    )
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.expect == {"min_lockstep_violations": 1, "max_lockstep_violations": 3}
    assert load_scenario(
        write(tmp_path, TINY.replace("[expect]\n", "[expect]\nmin_restores = 1\n"))
    ).expect == {"min_restores": 1, "max_lockstep_violations": 0}


def test_sweep_as_nested_tables_and_cross_field_errors(tmp_path: Path) -> None:
    """Nested ``[sweep.table]`` keys flatten to dotted paths, and a sweep value that breaks
    another key's rule names that key after the axis."""
    text = (
        MINIMAL
        + '\n[sweep.eviction]\npolicy = ["lru", "fifo"]\n[sweep.placement]\npolicy = ["turns"]\n'
    )
    axes = load_scenario(write(tmp_path, text)).sweep_axes
    assert axes == {"eviction.policy": ["lru", "fifo"], "placement.policy": ["turns"]}
    text = TINY.replace('"cache.checkpoint_slots" = [4, 16]', '"engine.max_num_seqs" = [16, 2048]')
    error = load_error(tmp_path, text)
    assert (error.key, error.value) == ("sweep.engine.max_num_seqs[1]", 2048)
    assert error.expected == (
        "cache.token_budget: >= engine.max_num_seqs * (1 + engine.spec_tokens) = 2048"
    )


def test_seed_defaults_to_the_first_of_seeds(tmp_path: Path) -> None:
    """Without ``scenario.seed`` the seed is the first of ``scenario.seeds``; with it,
    ``scenario.seed`` wins."""
    text = MINIMAL.replace('name = "minimal"\n', 'name = "minimal"\nseeds = [5, 7]\n')
    scenario = load_scenario(write(tmp_path, text))
    assert (scenario.seed, scenario.seeds, scenario.sim_config.seed) == (5, (5, 7), 5)
    scenario = load_scenario(write(tmp_path, text.replace("seeds =", "seed = 9\nseeds =")))
    assert (scenario.seed, scenario.seeds, scenario.sim_config.seed) == (9, (5, 7), 9)


def test_cache_cross_field_rules(tmp_path: Path) -> None:
    """The token budget must cover every sequence's decode and speculative tokens (exactly
    enough is enough), and a byte budget of more than 2^22 KV pages is an error."""
    engine = "\n[engine]\nmax_num_seqs = 16\nspec_tokens = 3\n"
    enough = MINIMAL + engine + "\n[cache]\ntoken_budget = 64\n"
    assert load_scenario(write(tmp_path, enough)).sim_config.token_budget == 64
    error = load_error(tmp_path, enough.replace("token_budget = 64", "token_budget = 63"))
    assert (error.key, error.value) == ("cache.token_budget", 63)
    assert error.expected == ">= engine.max_num_seqs * (1 + engine.spec_tokens) = 64"
    error = load_error(tmp_path, MINIMAL + "\n[cache]\nkv_budget_bytes = 1125899906842624\n")
    assert error.key == "cache.kv_budget_bytes"
    assert error.expected.startswith("at least one and at most 4194304 KV pages (")


def test_backend_and_policy_parameter_errors(tmp_path: Path) -> None:
    """``external`` needs ``backend.impl``; a non-finite or unknown placement parameter is
    an error of ``placement.params``."""
    error = load_error(tmp_path, MINIMAL + '\n[backend]\nname = "external"\n')
    assert (error.key, error.value) == ("backend.impl", None)
    assert error.expected == "module:factory for backend 'external'"
    policy = '\n[placement]\npolicy = "interval"\n'
    error = load_error(tmp_path, MINIMAL + policy + "params = { every = inf }\n")
    assert (error.key, error.value) == ("placement.params.every", math.inf)
    assert error.expected == "finite numbers (no nan or inf)"
    error = load_error(tmp_path, MINIMAL + policy + "params = { bogus = 1 }\n")
    assert (error.key, error.value) == ("placement.params", {"bogus": 1})
    assert error.expected.startswith("valid parameters (")


def test_workload_is_a_generator_or_a_trace(tmp_path: Path) -> None:
    """Exactly one of generator and trace; no parameters with a trace; the trace a file."""
    (tmp_path / "t.jsonl").write_text((ROOT / "tests" / "data" / "session_trace.jsonl").read_text())
    both = MINIMAL.replace("requests = 1", 'requests = 1\ntrace = "t.jsonl"')
    error = load_error(tmp_path, both)
    assert (error.key, error.value) == ("workload.generator", "chat")
    assert error.expected == "exactly one of workload.generator, workload.trace and workload.mix"
    error = load_error(tmp_path, MINIMAL.replace('generator = "chat"\n', ""))
    assert (error.key, error.value) == ("workload.generator", None)
    traced = MINIMAL.replace('generator = "chat"', 'trace = "t.jsonl"')
    assert load_scenario(write(tmp_path, traced)).workload.trace == str(tmp_path / "t.jsonl")
    error = load_error(tmp_path, traced + "\n[workload.params]\nturns = 3\n")
    assert (error.key, error.value) == ("workload.params", {"turns": 3})
    assert error.expected == "no parameters with a trace"
    (tmp_path / "folder.jsonl").mkdir()
    for name in ("absent.jsonl", "folder.jsonl"):
        error = load_error(tmp_path, traced.replace("t.jsonl", name))
        assert (error.key, error.value) == ("workload.trace", str(tmp_path / name))
        assert error.expected == "an existing trace file"


def test_overrides_check_sweep_values_and_name_the_embedded_default() -> None:
    """``with_overrides`` validates a new ``[sweep]`` too; errors of the embedded default
    (no file) name it ``<scenario NAME>``."""
    default = load_default_scenario()
    with pytest.raises(ScenarioError) as info:
        default.with_overrides({"sweep": {"eviction.policy": ["lru", "nope"]}})
    assert (info.value.key, info.value.value) == ("sweep.eviction.policy[1]", "nope")
    assert info.value.file == f"<scenario {default.name}>"
    with pytest.raises(ScenarioError) as info:
        default.with_overrides({"cache.block_size": 0})
    assert str(info.value).startswith(f"<scenario {default.name}>: cache.block_size: found 0, ")


def test_build_scenario_leaves_the_parsed_tables_alone(tmp_path: Path) -> None:
    """Resolving a relative arrivals path edits a copy: the caller's tables stay as given."""
    from sim.scenarios.loader import build_scenario

    (tmp_path / "arrivals.jsonl").write_text('{"t": 0}\n{"t": 1.5}\n')
    text = TINY.replace(
        'arrivals = { kind = "poisson", rate_per_s = 2.0 }',
        'arrivals = { kind = "trace", path = "arrivals.jsonl", field = "t", unit_s = 1.0 }',
    )
    parsed = tomllib.loads(text)
    before = copy.deepcopy(parsed)
    scenario = build_scenario(parsed, "x.toml", None, base_dir=tmp_path)
    assert parsed == before
    assert scenario.workload.params["arrivals"]["path"] == str(tmp_path / "arrivals.jsonl")


def test_run_scenario_seeds_workload_and_engine_with_the_given_seed(tmp_path: Path) -> None:
    """``seed=`` (0 included) replaces the scenario's seed for the workload and the engine
    alike, and the progress callback counts every request that left."""
    scenario = load_scenario(write(tmp_path, TINY.replace("requests = 20", "requests = 6")))
    calls: list[int] = []
    result = run_scenario(scenario, seed=0, progress=calls.append)
    assert result.seed == 0 and sum(calls) == 6
    same = run_scenario(scenario.with_overrides({"scenario.seed": 0}))
    assert result.totals == same.totals
    assert run_scenario(scenario).totals != result.totals


@functools.cache
def _default_scenario() -> Scenario:
    return load_default_scenario()


def _expectation_result(totals: dict[str, object], counts: dict[str, int]) -> SimResult:
    return cast(SimResult, types.SimpleNamespace(totals=totals, lockstep={"counts": counts}))


@settings(max_examples=40)
@given(data=st.data())
def test_each_expectation_bounds_the_number_it_names(data: st.DataObject) -> None:
    """Every ``[expect]`` key reads its own number from a result and fails exactly when a
    ``max_*`` bound is exceeded or a ``min_*`` bound not reached (equal is met)."""
    count = st.integers(0, 10**7)
    evictions = data.draw(
        st.dictionaries(
            st.sampled_from(["checkpoint:capacity", "checkpoint:pressure", "kv:capacity"]), count
        ),
        label="evictions",
    )
    counts = data.draw(st.dictionaries(st.sampled_from(["a", "b", "c"]), count), label="counts")
    rates = [data.draw(st.floats(0, 1), label=f"rate{i}") for i in range(2)]
    numbers = {
        k: data.draw(count, label=k)
        for k in ("restores", "published", "rejected", "pre", "acc", "prop")
    }
    p99 = data.draw(st.one_of(st.none(), st.floats(0, 100)), label="p99")
    totals: dict[str, object] = {
        "token_hit_rate": rates[0],
        "request_hit_rate": rates[1],
        "restores": {"count": numbers["restores"]},
        "captures": {"published": numbers["published"]},
        "evictions": evictions,
        "requests": {"rejected": numbers["rejected"]},
        "preemptions": numbers["pre"],
        "speculative": {"accepted": numbers["acc"], "proposed": numbers["prop"]},
        "ttft": {"p99_s": p99},
    }
    readings: dict[str, float] = {
        "token_hit_rate": rates[0],
        "request_hit_rate": rates[1],
        "lockstep_violations": sum(counts.values()),
        "restores": numbers["restores"],
        "captures_published": numbers["published"],
        "evictions": sum(evictions.values()),
        "checkpoint_evictions": sum(v for k, v in evictions.items() if k.startswith("checkpoint")),
        "rejected": numbers["rejected"],
        "preemptions": numbers["pre"],
        "spec_accepted": numbers["acc"],
        "ttft_p99_s": math.inf if p99 is None else p99,
    }
    result = _expectation_result(totals, counts)
    scenario = _default_scenario()
    for key in EXPECTATIONS:
        upper, name = key.startswith("max_"), key.split("_", 1)[1]
        reading = readings[name]
        integral = isinstance(reading, int)
        for step in (-1, 0, 1):
            bound = reading + step * (1 if integral else 0.25) if math.isfinite(reading) else 5.0
            if bound < 0:
                continue
            failures = check_expectations(
                dataclasses.replace(scenario, expect={key: bound}), result
            )
            met = reading <= bound if upper else reading >= bound
            shown = str(reading) if integral else f"{reading:g}"
            relation = "at most" if upper else "at least"
            assert failures == (
                []
                if met
                else [f"{key}: {EXPECTATIONS[key].what} is {shown}, expected {relation} {bound:g}"]
            ), (key, reading, bound)


def test_an_empty_description_is_its_default(tmp_path: Path) -> None:
    """``description = ""`` is what leaving it out gives, so it loads; a non-string does
    not."""
    scenario = load_scenario(write(tmp_path, minimal_with('[scenario]\ndescription = ""')))
    assert scenario.description == ""
    error = load_error(tmp_path, minimal_with("[scenario]\ndescription = 3"))
    assert "description" in str(error) and "a string" in str(error)


def test_a_pool_is_sized_one_way_and_an_override_of_the_other_way_replaces_it(
    tmp_path: Path,
) -> None:
    """A file that sets both checkpoint_slots and checkpoint_budget_bytes is refused (the
    budget would be ignored without a word); an axis or override of one way replaces the
    other where the file sets it, for the checkpoint pool and the KV pool alike."""
    both = TINY.replace(
        "checkpoint_slots = 16", "checkpoint_slots = 16\ncheckpoint_budget_bytes = 2"
    )
    error = load_error(tmp_path, both)
    assert (error.key, error.value) == ("cache.checkpoint_budget_bytes", 2)
    assert "unset when cache.checkpoint_slots is set" in error.expected
    scenario = load_scenario(write(tmp_path, TINY))
    per_slot = scenario.sim_config.checkpoint_slot_bytes()
    budget = scenario.with_overrides({"cache.checkpoint_budget_bytes": 3 * per_slot})
    assert budget.sim_config.checkpoint_capacity() == 3
    back = budget.with_overrides({"cache.checkpoint_slots": 5})
    assert back.sim_config.checkpoint_capacity() == 5
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides(
            {"cache.checkpoint_slots": 5, "cache.checkpoint_budget_bytes": per_slot}
        )
    assert info.value.key == "cache.checkpoint_budget_bytes"
    blocks = scenario.with_overrides({"cache.kv_blocks": 64})
    kv_bytes = 16 * blocks.sim_config.costs().kv_bytes_per_token
    assert (
        blocks.with_overrides({"cache.kv_budget_bytes": 32 * kv_bytes}).sim_config.kv_blocks == 32
    )
    swept = TINY.replace(
        '"cache.checkpoint_slots" = [4, 16]',
        f'"cache.checkpoint_budget_bytes" = [{per_slot}, {4 * per_slot}]',
    )
    scenario = load_scenario(write(tmp_path, swept))
    assert scenario.sweep_axes["cache.checkpoint_budget_bytes"] == [per_slot, 4 * per_slot]


def test_a_hit_rate_bound_fails_with_n_a_when_nothing_was_admitted(tmp_path: Path) -> None:
    """A KV pool of one page admits no prompt: a hit-rate bound is not met by a 0 that
    is no measurement; the failure says why."""
    text = TINY.replace("checkpoint_slots = 16", "checkpoint_slots = 16\nkv_blocks = 1")
    text = text.replace("max_lockstep_violations = 0", "min_token_hit_rate = 0.0")
    scenario = load_scenario(write(tmp_path, text))
    result = run_scenario(scenario)
    assert result.totals["requests"]["admitted"] == 0
    (failure,) = check_expectations(scenario, result)
    assert failure == (
        "min_token_hit_rate: token hit rate is n/a (the run admitted no request), "
        "expected at least 0"
    )
