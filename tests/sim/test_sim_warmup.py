"""Hit rates after warm-up (``totals.after_warmup``; docs/REPORTS.md, docs/SIMULATION.md):
the requests admitted once the cache has first evicted to make room, or after
``warmup_requests``; a run whose cache never filled says so."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from reference.errors import InvalidConfigError
from sim.engine import SimConfig, run_simulation
from sim.engine.sources import build_workload
from sim.report.build import build_report
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.request import Request

#: A cache-only replay with a small checkpoint pool: it fills within the first requests.
SMALL = SimConfig(checkpoint_slots=8, mode="replay")


def chat(count: int) -> list[Request]:
    stream, _ = build_workload("multi_turn_chat", count, 0)
    return list(stream())


def test_warm_up_ends_at_the_first_request_after_the_cache_filled() -> None:
    """The replay serves one request at a time, so the prefixes of the workload tell when
    the cache first evicted: during request k - 1, so request k is the first after it."""
    requests = chat(200)
    warm = run_simulation(SMALL, requests).totals["after_warmup"]
    k = warm["from_request"]
    assert isinstance(k, int) and k > 0
    # Split memory: only checkpoint evictions mean the pool filled (the KV pool's own
    # LRU reuse does not).
    assert run_simulation(SMALL, requests[:k]).totals["evictions"].get("checkpoint:capacity")
    assert (
        not run_simulation(SMALL, requests[: k - 1]).totals["evictions"].get("checkpoint:capacity")
    )


def test_the_warm_hit_rate_counts_only_the_requests_after_warm_up() -> None:
    requests = chat(200)
    totals = run_simulation(SMALL, requests).totals
    warm = totals["after_warmup"]
    k = warm["from_request"]
    before = run_simulation(SMALL, requests[:k]).totals  # the same first k requests
    assert warm["requests"] == len(requests) - k
    assert warm["prompt_tokens"] == sum(len(r.prompt) for r in requests[k:])
    assert warm["hit_tokens"] == totals["hit_tokens"] - before["hit_tokens"]
    assert warm["token_hit_rate"] == warm["hit_tokens"] / warm["prompt_tokens"]


def test_a_configured_warm_up_counts_requests() -> None:
    requests = chat(60)
    everything = run_simulation(dataclasses.replace(SMALL, warmup_requests=0), requests)
    assert everything.totals["after_warmup"]["from_request"] == 0
    assert (
        everything.totals["after_warmup"]["token_hit_rate"] == everything.totals["token_hit_rate"]
    )
    ten = run_simulation(dataclasses.replace(SMALL, warmup_requests=10), requests)
    assert ten.totals["after_warmup"]["from_request"] == 10
    assert ten.totals["after_warmup"]["requests"] == 50


def test_a_cache_that_never_filled_is_reported_as_filling(tmp_path: Path) -> None:
    result = run_simulation(SimConfig(mode="replay"), chat(30))
    assert result.totals["after_warmup"]["from_request"] is None
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text(result.to_json())
    text = build_report(tmp_path).read_text()
    assert "**cache still filling at the end**" in text and "| filling |" in text


def test_bad_warm_up_settings_are_refused() -> None:
    with pytest.raises(InvalidConfigError, match="warmup_requests"):
        SimConfig(warmup_requests=-1)
    text = (
        '[scenario]\nname = "w"\n[engine]\nwarmup_requests = "ten"\n'
        '[workload]\ngenerator = "multi_turn_chat"\nrequests = 5\n'
    )
    with pytest.raises(ScenarioError) as caught:
        build_scenario(tomllib.loads(text), "w.toml", None, base_dir=None)
    assert caught.value.key == "engine.warmup_requests"
