"""Saturation (docs/REPORTS.md "queued"): the share of samples with requests waiting for
admission replaces "compute busy" (93-99% at every load), and an overloaded run — its
queue never drained while requests arrived — is warned about."""

from __future__ import annotations

from pathlib import Path

from sim.engine import SimConfig, run_simulation
from sim.engine.command import overload_warning, overloaded, warning_lines
from sim.engine.sources import build_workload
from sim.report.build import build_report

ENGINE = SimConfig(max_num_seqs=8, token_budget=2048)


def chat_at(rate: float, count: int = 300) -> list[object]:
    stream, _ = build_workload(
        "multi_turn_chat", count, 0, arrivals={"kind": "poisson", "rate_per_s": rate}
    )
    return list(stream())


def test_a_light_load_rarely_queues_and_a_heavy_one_always_does() -> None:
    light = run_simulation(ENGINE, chat_at(0.5)).totals
    heavy = run_simulation(ENGINE, chat_at(50.0)).totals
    assert light["queue"]["queued_share"] < 0.05
    assert heavy["queue"]["queued_share"] > 0.8
    assert heavy["queue"]["peak_waiting"] >= heavy["queue"]["waiting_at_last_arrival"] > 100
    # compute busy barely tells the two apart; the queued share does.
    assert overloaded(light) is None and overloaded(heavy) is not None


def test_an_overloaded_run_is_warned_about_on_the_command_line_and_in_the_report(
    tmp_path: Path,
) -> None:
    result = run_simulation(ENGINE, chat_at(50.0))
    assert any(line.startswith("WARNING: overloaded:") for line in warning_lines(result))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "heavy.json").write_text(result.to_json())
    assert "**overloaded**" in build_report(tmp_path).read_text()


def test_the_overload_threshold() -> None:
    """More than 5% of the arrived requests, and more than 10, still waiting."""

    def totals(waiting: int, arrived: int) -> dict[str, object]:
        queue = {"waiting_at_last_arrival": waiting, "peak_waiting": waiting + 1}
        return {"queue": queue, "requests": {"arrived": arrived}}

    assert overloaded(totals(10, 100)) is None  # not more than 10
    assert overloaded(totals(11, 100)) == (11, 12)
    assert overloaded(totals(50, 1000)) is None  # 5% exactly
    assert overloaded(totals(51, 1000)) is not None
    assert overload_warning({"requests": {}}) is None  # a replay has no queue


def test_a_replay_has_no_queue() -> None:
    replay = run_simulation(SimConfig(mode="replay"), chat_at(1.0, 20)).totals
    assert "queue" not in replay


def test_a_batch_workload_gets_a_makespan_column() -> None:
    """Every request at t = 0 (trace arrivals): the table shows the seconds to finish
    them all; an open-loop run has no such column."""
    from sim.report.build import makespan, table
    from sim.report.data import Row

    stream, _ = build_workload(
        "few_shot_branching", 30, 0, arrivals={"kind": "trace", "times_s": [0.0] * 30}
    )
    result = run_simulation(ENGINE, list(stream()))
    assert result.totals["arrivals"] == {"first_s": 0.0, "last_s": 0.0}
    row = Row("batch.json", result.to_dict())
    assert makespan(row) == result.totals["sim_time_s"]
    header = table([row])[0]
    assert "makespan (s)" in header
    open_loop = Row("open.json", run_simulation(ENGINE, chat_at(1.0, 20)).to_dict())
    assert makespan(open_loop) is None and "makespan" not in table([open_loop])[0]
