"""``hyckpt bench index``: the seed port is faithful, the benchmark runs and agrees.

The first tests port the Rust seed's unit tests (seed 004) to
:class:`sim.bench.seed_scan.PrefixCheckpoints`, so the baseline the benchmark measures
is the seed's behaviour. No test asserts anything about timings.
"""

from __future__ import annotations

import argparse
import random
import re

import pytest

from reference.api import Reservation
from reference.index import make_index
from sim.bench import index_bench
from sim.bench.index_bench import (
    BLOCK,
    MODEL,
    BenchRow,
    add_arguments,
    build_reference,
    build_scan,
    headline,
    main,
    make_workload,
    run_benchmark,
)
from sim.bench.seed_scan import PrefixCheckpoints, checkpoint_tokens, seed_key

HEADLINE_RE = re.compile(r"^lookup speedup vs scan at \d+ entries, \d+ tokens: \d+(\.\d+)?x$")


# --- the seed's own unit tests, on the port ------------------------------------------


def test_aligns_retained_prefixes_to_complete_cache_blocks() -> None:
    assert checkpoint_tokens(2_048, 16) == 2_032
    assert checkpoint_tokens(4_097, 16) == 4_080
    assert checkpoint_tokens(8_193, 16) == 8_176
    assert checkpoint_tokens(15, 16) == 0
    assert checkpoint_tokens(64, 0) == 0


def test_returns_the_longest_matching_checkpoint_above_replay() -> None:
    prompt = list(range(64))
    cache = PrefixCheckpoints(4, 3)
    cache.slot_for_write("model", prompt, 16)
    cache.slot_for_write("model", prompt, 32)
    cache.slot_for_write("model", prompt, 48)
    assert cache.lookup("model", prompt, 20, 48) == (48, 6)
    changed = list(prompt)
    changed[40] = 7
    assert cache.lookup("model", changed, 20, 48) == (32, 5)


def test_evicts_the_least_recent_checkpoint() -> None:
    prompt = list(range(64))
    cache = PrefixCheckpoints(8, 2)
    cache.slot_for_write("model", prompt, 16)
    cache.slot_for_write("model", prompt, 32)
    assert cache.lookup("model", prompt, 0, 16) == (16, 8)
    cache.slot_for_write("model", prompt, 48)
    assert cache.lookup("model", prompt, 16, 32) is None
    assert cache.lookup("model", prompt, 32, 48) == (48, 9)


# --- the rest of the port ------------------------------------------------------------


def test_port_slot_for_write_refreshes_an_existing_key() -> None:
    prompt = list(range(64))
    cache = PrefixCheckpoints(0, 2)
    first = cache.slot_for_write("model", prompt, 16)
    cache.slot_for_write("model", prompt, 32)
    assert cache.slot_for_write("model", prompt, 16) == first  # refresh: 16 is now newest
    cache.slot_for_write("model", prompt, 48)  # evicts 32, the least recent
    assert cache.lookup("model", prompt, 16, 32) is None
    assert cache.lookup("model", prompt, 0, 16) == (16, 0)
    assert cache.lookup("model", prompt, 32, 48) == (48, 1)
    assert cache.lookup("other", prompt, 0, 48) is None  # the model is part of the key


def test_port_invalidate_clear_and_tick() -> None:
    prompt = list(range(64))
    cache = PrefixCheckpoints(4, 3)
    hash16, slot16 = cache.slot_for_write("model", prompt, 16)
    cache.slot_for_write("model", prompt, 32)
    cache.invalidate(hash16, 16)
    assert len(cache) == 1 and cache.free == [6, slot16]
    assert cache.lookup("model", prompt, 0, 16) is None
    cache.invalidate(hash16, 16)  # absent: no-op
    assert cache.free == [6, slot16]
    cache.clear()
    assert len(cache) == 0 and sorted(cache.free) == [4, 5, 6]
    cache.clock = (1 << 64) - 1
    assert cache.tick() == 0  # wrapping u64


def test_port_append_unchecked_matches_slot_for_write_on_distinct_keys() -> None:
    prompt = list(range(200))
    checked, unchecked = PrefixCheckpoints(3, 8), PrefixCheckpoints(3, 8)
    for tokens in (16, 48, 96, 160):
        assert checked.slot_for_write("m", prompt, tokens) == unchecked.append_unchecked(
            "m", prompt, tokens
        )
    assert checked.entries == unchecked.entries and checked.free == unchecked.free
    full = PrefixCheckpoints(0, 0)
    with pytest.raises(IndexError):
        full.append_unchecked("m", prompt, 16)
    with pytest.raises(IndexError):  # the seed panics on a zero-capacity write too
        full.slot_for_write("m", prompt, 16)


def test_port_key_hashes_the_prefix_only() -> None:
    prompt = list(range(64))
    assert seed_key("m", prompt, 32) == seed_key("m", [*prompt[:32], 99, 98], 32)
    assert seed_key("m", prompt, 32) != seed_key("m", prompt, 33)
    assert seed_key("m", prompt, 32) != seed_key("n", prompt, 32)


# --- workload ------------------------------------------------------------------------


def test_workload_shape() -> None:
    workload = make_workload(200, 512, 30, seed=3)
    assert sum(len(s.checkpoints) for s in workload.sessions) == 200
    assert len(workload.corpus) == 512 - BLOCK
    assert len({s.header for s in workload.sessions}) == len(workload.sessions)
    for session in workload.sessions:
        assert list(session.checkpoints) == sorted(set(session.checkpoints))
        assert all(c % BLOCK == 0 and c > 0 for c in session.checkpoints)
        assert checkpoint_tokens(session.end, BLOCK) == session.checkpoints[-1]
        assert session.end < 512 - 512 // 8
    for query in workload.queries:
        session = workload.sessions[query.session]
        assert session.end < query.length <= 512
        assert query.length - session.end <= 512 // 8
        assert query.expected == session.checkpoints[-1]
    again = make_workload(200, 512, 30, seed=3)
    assert again == workload  # seeded, no global RNG
    bigger = make_workload(600, 512, 30, seed=3)
    assert bigger.queries != workload.queries
    assert [q.length - bigger.sessions[q.session].end for q in bigger.queries] == [
        q.length - workload.sessions[q.session].end for q in workload.queries
    ]  # the same new-turn lengths for every entry count


# --- agreement -----------------------------------------------------------------------


def test_port_and_reference_agree_on_lookups() -> None:
    """Random ranges, prefixes of sessions and edited prompts: same token count from both."""
    workload = make_workload(300, 768, 1, seed=11)
    reference, _ = build_reference(workload)
    scan, _ = build_scan(workload)
    rng = random.Random(5)
    for _ in range(300):
        number = rng.randrange(len(workload.sessions))
        length = rng.randint(BLOCK, workload.tokens)
        prompt = workload.prompt(number, length)
        if rng.random() < 0.3:
            prompt[rng.randrange(len(prompt))] = -1  # diverge somewhere
        maximum = rng.randint(0, workload.tokens + BLOCK)
        minimum = rng.randint(0, maximum)
        want = scan.lookup(MODEL, prompt, minimum, maximum)
        got = reference.lookup(MODEL, prompt, minimum, maximum)
        assert (got.tokens if got else None) == (want[0] if want else None), (
            number,
            length,
            minimum,
            maximum,
        )


def test_port_and_reference_agree_on_the_seed_vectors() -> None:
    prompt = list(range(64))
    reference = make_index(3, first_slot=4, eviction="lru", hash_unit=16)
    scan = PrefixCheckpoints(4, 3)
    for tokens in (16, 32, 48):
        outcome = reference.reserve("model", prompt, tokens)
        assert isinstance(outcome, Reservation)
        reference.publish(outcome)
        scan.slot_for_write("model", prompt, tokens)
    changed = list(prompt)
    changed[40] = 7
    for probe, want in ((prompt, 48), (changed, 32)):
        hit = reference.lookup("model", probe, 20, 48)
        seed_hit = scan.lookup("model", probe, 20, 48)
        assert hit is not None and seed_hit is not None
        assert hit.tokens == seed_hit[0] == want


def test_run_benchmark_rows() -> None:
    rows = run_benchmark([24, 40], [64, 160], queries=5, seed=1, budget_s=0.0, progress=False)
    assert [(r.entries, r.tokens) for r in rows] == [(24, 64), (24, 160), (40, 64), (40, 160)]
    for row in rows:
        assert isinstance(row, BenchRow)
        assert row.queries == 5 and row.scan_queries == 1  # zero budget: exactly one
        assert row.ref_warm_us > 0 and row.scan_us > 0 and row.speedup_warm > 0
    assert HEADLINE_RE.match(headline(rows))
    assert headline(rows) == headline(rows[::-1])  # the largest configuration
    assert "40 entries, 160 tokens" in headline(rows)


def test_run_benchmark_reports_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    original = PrefixCheckpoints.lookup

    def off_by_a_block(
        self: PrefixCheckpoints, model: str, prompt: list[int], minimum: int, maximum: int
    ) -> tuple[int, int] | None:
        hit = original(self, model, prompt, minimum, maximum)
        return None if hit is None else (hit[0] - BLOCK, hit[1])

    monkeypatch.setattr(PrefixCheckpoints, "lookup", off_by_a_block)
    with pytest.raises(index_bench.BenchMismatchError, match="seed scan"):
        run_benchmark([16], [96], queries=2, seed=0, budget_s=0.0, progress=False)


def test_headline_prefers_10k_entries_32k_tokens() -> None:
    def row(entries: int, tokens: int, speedup: float) -> BenchRow:
        return BenchRow(entries, tokens, 1, 1, 1, 1.0, 1.0, 1.0, speedup, 1.0, 0.0, 0.0)

    rows = [row(10_000, 32_768, 1234.4), row(100_000, 32_768, 9999.0), row(10_000, 4096, 2.0)]
    assert headline(rows) == "lookup speedup vs scan at 10000 entries, 32768 tokens: 1234x"
    assert (
        headline([row(64, 256, 3.21)]) == "lookup speedup vs scan at 64 entries, 256 tokens: 3.2x"
    )


# --- command line --------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    args = _parse([])
    assert args.entries == [1000, 10000, 100000] and args.tokens == [4096, 32768]
    assert args.quick is False and args.budget > 0 and args.queries >= 1


def test_quick_main_prints_table_and_headline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_parse(["--quick", "--no-progress"])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["entries", "prompt", "tokens"]
    assert any(line.split()[:2] == ["256", "1024"] for line in lines)
    assert any(line.startswith("reference warm lookup at 256 vs 64 entries") for line in lines)
    assert HEADLINE_RE.match(lines[-1]), lines[-1]
    assert lines[-1].startswith("lookup speedup vs scan at 256 entries, 1024 tokens: ")


def test_main_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_parse(["--tokens", "20", "--no-progress"])) == 2
    assert "tokens must be >=" in capsys.readouterr().err
    with pytest.raises(ValueError):
        run_benchmark([0], [64], queries=1, seed=0, budget_s=0.0, progress=False)
