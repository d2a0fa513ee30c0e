"""Mixed workloads in scenario files (``[[workload.mix]]``): loading, the merged stream,
errors that name their key path, sweeps over a component's key, and relative paths."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.scenarios import SCENARIO_DIR, ScenarioError, load_scenario, run_scenario
from sim.scenarios.key_paths import get_path, key_parts, set_path
from sim.scenarios.workload_mix import MixComponent, build_mix
from sim.workloads import make_workload, mix

#: Three components: chat sessions, popular system prompts and retrieval questions.
MIXED = """\
[scenario]
name = "mixed"
seed = 2

[cache]
checkpoint_slots = 32
token_budget = 4096

[engine]
max_num_seqs = 32

[placement]
policy = "turns"

[workload]
requests = 60

[[workload.mix]]
generator = "chat"
[workload.mix.params]
arrivals = { kind = "poisson", rate_per_s = 1.0 }
think_time = { mean_s = 2.0 }

[[workload.mix]]
name = "prompts"
generator = "system-prompt"
[workload.mix.params]
arrivals = { kind = "poisson", rate_per_s = 2.0 }
num_system_prompts = 4

[[workload.mix]]
generator = "rag"
[workload.mix.params]
arrivals = { kind = "poisson", rate_per_s = 1.5 }
num_chunks = 12
chunks_per_request = 2
"""


def write(folder: Path, text: str, name: str = "mixed.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> ScenarioError:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert info.value.file == str(path)
    return info.value


def fingerprint(request: object) -> tuple[object, ...]:
    r = request
    return (r.request_id, r.arrival_s, r.prompt.segments, r.output_tokens, r.turn_starts)  # type: ignore[attr-defined]


# --- loading and the merged stream ----------------------------------------------------


def test_a_mix_loads_into_its_components(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, MIXED))
    spec = scenario.workload
    assert spec.generator is None and spec.trace is None and spec.requests == 60
    assert [(c.generator, c.name) for c in spec.mix] == [
        ("multi_turn_chat", "multi_turn_chat"),
        ("shared_system_prompt", "prompts"),
        ("retrieval_qa", "retrieval_qa"),
    ]
    assert spec.mix[2].params == {
        "arrivals": {"kind": "poisson", "rate_per_s": 1.5},
        "num_chunks": 12,
        "chunks_per_request": 2,
    }


def test_the_stream_is_the_registry_mix_of_the_components(tmp_path: Path) -> None:
    """build_mix = mix() of the components built with the scenario's seed, each count
    defaulting to workload.requests, cut to workload.requests; the description names the
    components and their configurations."""
    spec = load_scenario(write(tmp_path, MIXED)).workload
    stream, description = spec.build(7)
    made = list(stream())
    expected = mix(
        make_workload("multi_turn_chat", 7, num_sessions=60, **spec.mix[0].params),
        make_workload(
            "shared_system_prompt", 7, name="prompts", num_requests=60, **spec.mix[1].params
        ),
        make_workload("retrieval_qa", 7, num_requests=60, **spec.mix[2].params),
    )
    assert [fingerprint(r) for r in made] == [fingerprint(r) for r in expected.take(60)]
    assert [r.arrival_s for r in made] == sorted(r.arrival_s for r in made)
    assert set(Counter(r.kind for r in made)) == {"multi_turn_chat", "prompts", "retrieval_qa"}
    assert description["kind"] == "mix" and description["requests"] == 60
    components = description["components"]
    assert isinstance(components, list)
    assert [c["name"] for c in components] == ["multi_turn_chat", "prompts", "retrieval_qa"]
    assert components[2]["config"]["num_chunks"] == "12"


def test_a_component_keeps_its_requests_whatever_the_others_do(tmp_path: Path) -> None:
    """Changing one component's rate never changes another's requests (they only
    interleave differently), and a component's own count caps it."""
    base = load_scenario(write(tmp_path, MIXED))
    faster = base.with_overrides({"workload.mix[0].params.arrivals.rate_per_s": 3.0})

    def by_kind(scenario: object, kind: str) -> list[tuple[object, ...]]:
        stream, _ = scenario.workload.build(1)  # type: ignore[attr-defined]
        return [fingerprint(r) for r in stream() if r.kind == kind]

    for kind in ("prompts", "retrieval_qa"):
        a, b = by_kind(base, kind), by_kind(faster, kind)
        assert a and b and a[: len(b)] == b[: len(a)]
    assert len(by_kind(faster, "multi_turn_chat")) > len(by_kind(base, "multi_turn_chat"))
    capped = base.with_overrides({"workload.mix[1].params.num_requests": 3})
    assert len(by_kind(capped, "prompts")) == 3


def test_a_mix_runs_and_reports_its_components(tmp_path: Path) -> None:
    result = run_scenario(load_scenario(write(tmp_path, MIXED)))
    assert result.totals["requests"]["finished"] == 60
    assert result.workload["scenario"] == "mixed" and result.workload["kind"] == "mix"
    assert result.ok


def test_the_shipped_mix_scenario_has_every_kind_of_traffic() -> None:
    scenario = load_scenario(SCENARIO_DIR / "mixed-traffic.toml")
    stream, _ = scenario.workload.build(scenario.seed)
    kinds = Counter(r.kind for r in stream())
    assert set(kinds) == {"chat", "agents", "assistants", "rag"}
    assert sum(kinds.values()) == scenario.workload.requests
    assert "workload.mix[3].params.chunk_order" in scenario.sweep_axes


# --- errors name their key path -------------------------------------------------------

ERRORS = [
    (
        ('generator = "rag"', 'generator = "ragg"'),
        "workload.mix[2].generator",
        "did you mean 'rag'?",
    ),
    (
        ("num_system_prompts = 4", 'num_system_prompts = "4"'),
        "workload.mix[1].params.num_system_prompts",
        "SharedSystemPromptConfig.num_system_prompts must be an integer >= 1, got '4'",
    ),
    (
        ("num_chunks = 12", "num_chunk = 12"),
        "workload.mix[2].params.num_chunk",
        "did you mean 'num_chunks'?",
    ),
    (
        ('name = "prompts"', 'nmae = "prompts"'),
        "workload.mix[1].nmae",
        "a key of [[workload.mix]] (generator, name, params); did you mean 'name'?",
    ),
    (
        ('name = "prompts"', 'name = "retrieval_qa"'),
        "workload.mix[2].name",
        "a name no other component has (workload.mix[1] is 'retrieval_qa' too)",
    ),
    (
        ('name = "prompts"', 'name = "a/b"'),
        "workload.mix[1].name",
        "a non-empty string without '/'",
    ),
    (
        ("requests = 60", 'requests = 60\ngenerator = "chat"'),
        "workload.mix",
        "unset when workload.generator is set",
    ),
    (
        ("requests = 60", 'requests = 60\ntrace = "t.jsonl"'),
        "workload.mix",
        "unset when workload.trace is set",
    ),
    (
        (
            '[[workload.mix]]\ngenerator = "chat"',
            '[workload.params]\nturns = 3\n\n[[workload.mix]]\ngenerator = "chat"',
        ),
        "workload.params",
        "no parameters with workload.mix: each component has its own workload.mix[i].params",
    ),
    (
        ("num_chunks = 12", 'num_chunks = 12\nname = "x"'),
        "workload.mix[2].params.name",
        "no 'name' here: it is reserved, set workload.mix[2].name instead",
    ),
    (
        ("num_chunks = 12", "num_chunks = 12\nseed = 4"),
        "workload.mix[2].params.seed",
        "it is reserved, set scenario.seed",
    ),
    (
        ("num_chunks = 12", "num_chunks = 12\nnum_requests = 0"),
        "workload.mix[2].params.num_requests",
        "mix component(s) 'retrieval_qa' generated none",
    ),
    (
        ("chunks_per_request = 2", "chunks_per_request = 13"),
        "workload.mix[2].params",  # valid alone, not with num_chunks = 12: the table
        "valid parameters (RetrievalConfig.chunks_per_request must be <= 12",
    ),
    (
        ('generator = "system-prompt"\n', ""),
        "workload.mix[1].generator",
        "one of chat, system-prompt",
    ),
    (
        ("num_system_prompts = 4", "num_system_prompts = 4\nid_space = 9"),
        "workload.mix[2].name",
        "a component whose segment id space differs from workload.mix[1]'s (9)",
    ),
]


@pytest.mark.parametrize(("edit", "key", "expected"), ERRORS, ids=[e[1] for e in ERRORS])
def test_mix_errors_name_the_key_path(
    tmp_path: Path, edit: tuple[str, str], key: str, expected: str
) -> None:
    text = MIXED.replace(*edit, 1)
    if "id_space = 9" in text:  # the rag component takes the same id space
        text = text.replace("chunks_per_request = 2", "chunks_per_request = 2\nid_space = 9")
    assert text != MIXED
    error = load_error(tmp_path, text)
    assert error.key == key
    assert expected in error.expected


@pytest.mark.parametrize(
    "value",
    ["mix = []", "mix = [1, 2]", 'mix = "chat"', "mix = [" + "{generator = 'chat'}, " * 33 + "]"],
)
def test_mix_must_be_an_array_of_tables(tmp_path: Path, value: str) -> None:
    text = MIXED.split("[[workload.mix]]")[0].replace("requests = 60", f"requests = 60\n{value}")
    error = load_error(tmp_path, text)
    assert error.key == "workload.mix"
    assert error.expected.startswith("a non-empty array of at most 32 tables")


def test_a_generator_or_trace_or_mix_is_required(tmp_path: Path) -> None:
    error = load_error(tmp_path, MIXED.split("[[workload.mix]]")[0])
    assert (error.key, error.expected) == (
        "workload.generator",
        "exactly one of workload.generator, workload.trace and workload.mix",
    )


# --- sweeps over a component's key ----------------------------------------------------


def test_a_sweep_axis_can_name_a_component_key(tmp_path: Path) -> None:
    text = MIXED + '\n[sweep]\n"workload.mix[2].params.chunk_order" = ["rank", "retrieved"]\n'
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.sweep_axes == {"workload.mix[2].params.chunk_order": ["rank", "retrieved"]}
    retrieved = scenario.with_overrides({"workload.mix[2].params.chunk_order": "retrieved"})
    assert retrieved.workload.mix[2].params["chunk_order"] == "retrieved"
    assert "chunk_order" not in scenario.workload.mix[2].params
    assert retrieved.workload.mix[:2] == scenario.workload.mix[:2]


@pytest.mark.parametrize(
    ("axis", "values", "key", "expected"),
    [
        (
            "workload.mix[5].params.num_chunks",
            "[4]",
            "sweep.workload.mix[5].params.num_chunks[0]",
            "workload.mix[5]: an index below 3: workload.mix has 3 tables",
        ),
        (
            "workload.mix[2].params.chunk_zipf",
            "[0.5, -1]",
            "sweep.workload.mix[2].params.chunk_zipf[1]",
            "RetrievalConfig.chunk_zipf must be a finite number >= 0, got -1",
        ),
        (
            "workload.mix[x].params.chunk_zipf",
            "[1.0]",
            "sweep.workload.mix[x].params.chunk_zipf[0]",
            "a dotted key path like cache.block_size",
        ),
        (
            "workload.mix.params.chunk_zipf",
            "[1.0]",
            "sweep.workload.mix.params.chunk_zipf[0]",
            "a table to set workload.mix.params.chunk_zipf in",
        ),
    ],
)
def test_bad_component_sweeps_name_their_axis(
    tmp_path: Path, axis: str, values: str, key: str, expected: str
) -> None:
    error = load_error(tmp_path, MIXED + f'\n[sweep]\n"{axis}" = {values}\n')
    assert error.key == key
    assert expected in error.expected


def test_indexing_a_file_without_a_mix_is_an_error(tmp_path: Path) -> None:
    plain = MIXED.split("[[workload.mix]]")[0].replace(
        "requests = 60", 'requests = 60\ngenerator = "chat"'
    )
    scenario = load_scenario(write(tmp_path, plain))
    assert scenario.workload.mix == () and scenario.workload.generator == "multi_turn_chat"
    with pytest.raises(ScenarioError) as info:
        scenario.with_overrides({"workload.mix[0].params.turns": 2})
    assert (info.value.key, info.value.value) == ("workload.mix", None)
    assert info.value.expected == "an array of tables to set workload.mix[0].params.turns in"


@given(
    parts=st.lists(
        st.one_of(
            st.text("abcxyz_", min_size=1, max_size=4),
            st.tuples(st.text("abcxyz_", min_size=1, max_size=4), st.integers(0, 40)),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_key_paths_round_trip_through_their_parts(parts: list[object]) -> None:
    """``key_parts`` reads back the path a list of keys and indexed keys spells."""
    dotted = ".".join(f"{p[0]}[{p[1]}]" if isinstance(p, tuple) else str(p) for p in parts)
    expected: list[object] = []
    for part in parts:
        expected.extend(part if isinstance(part, tuple) else [part])
    assert key_parts(dotted) == expected


def test_set_and_get_path_step_into_arrays_of_tables() -> None:
    data: dict[str, object] = {"workload": {"mix": [{"params": {}}, {"params": {"a": 1}}]}}
    set_path(data, "workload.mix[1].params.b", 2, "f")
    set_path(data, "workload.mix[0].params.c.d", 3, "f")
    assert get_path(data, "workload.mix[1].params") == {"a": 1, "b": 2}
    assert get_path(data, "workload.mix[0].params.c.d") == 3
    set_path(data, "workload.mix[0]", {"generator": "chat"}, "f")
    assert get_path(data, "workload.mix[0]") == {"generator": "chat"}
    for missing in ("workload.mix[2]", "workload.mix[0].params", "workload.x[0]"):
        assert repr(get_path(data, missing)) == "<missing>"
    with pytest.raises(ScenarioError, match=r"an index below 2: workload.mix has 2 tables"):
        set_path(data, "workload.mix[2].params.x", 1, "f")


# --- relative paths in a component ----------------------------------------------------


def test_a_components_arrivals_trace_is_relative_to_the_scenario_file(tmp_path: Path) -> None:
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "arrivals.jsonl").write_text('{"t": 0}\n{"t": 0.5}\n{"t": 2}\n')
    (folder / "late.jsonl").write_text('{"t": 0}\n{"t": 9}\n')
    rate = 'arrivals = { kind = "poisson", rate_per_s = 1.5 }'
    trace = 'arrivals = { kind = "trace", path = "arrivals.jsonl", field = "t", unit_s = 1.0 }'
    text = MIXED.replace(rate, trace) + (
        '\n[sweep]\n"workload.mix[2].params.arrivals.path" = ["arrivals.jsonl", "late.jsonl"]\n'
    )
    scenario = load_scenario(write(folder, text))
    assert scenario.workload.mix[2].params["arrivals"]["path"] == str(folder / "arrivals.jsonl")
    assert scenario.sweep_axes["workload.mix[2].params.arrivals.path"] == [
        str(folder / "arrivals.jsonl"),
        str(folder / "late.jsonl"),
    ]
    shown = scenario.shown_paths(
        "workload.mix[2].params.arrivals.path",
        scenario.sweep_axes["workload.mix[2].params.arrivals.path"],
        folder,
    )
    assert shown == ["arrivals.jsonl", "late.jsonl"]
    stream, _ = scenario.workload.build(1)
    times = [r.arrival_s for r in stream() if r.kind == "retrieval_qa"]
    assert times == [0.0, 0.5, 2.0]
    error = load_error(folder, text.replace('path = "arrivals.jsonl"', 'path = "none.jsonl"'))
    assert error.key == "workload.mix[2].params.arrivals"


def test_mix_components_compare_by_value() -> None:
    a = MixComponent("retrieval_qa", "r", {"num_chunks": 3, "chunks_per_request": 2})
    assert a == MixComponent("retrieval_qa", "r", {"num_chunks": 3, "chunks_per_request": 2})
    stream, description = build_mix([a], 4, 0)
    assert len(list(stream())) == 4
    components = description["components"]
    assert isinstance(components, list) and [c["name"] for c in components] == ["r"]


def test_the_documented_example_loads(tmp_path: Path) -> None:
    """The ``[[workload.mix]]`` example of docs/SCENARIOS.md is a valid workload."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "SCENARIOS.md").read_text()
    section = docs[docs.index("#### Mixed workloads") :]
    example = section[section.index("```toml\n") + 8 : section.index("```\n", 8)]
    scenario = load_scenario(write(tmp_path, '[scenario]\nname = "docs"\n\n' + example))
    assert [(c.name, c.generator) for c in scenario.workload.mix] == [
        ("chat", "multi_turn_chat"),
        ("rag", "retrieval_qa"),
    ]
    assert scenario.workload.requests == 500
