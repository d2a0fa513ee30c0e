"""Statistics a planner can trust (sim.report.stats, docs/REPORTS.md "Across seeds"): the
95 % interval over seeds, the summary's across-seeds and best-policy tables."""

from __future__ import annotations

import math

import pytest

from sim.report.build import best_policy_section, seeds_section, summary
from sim.report.figures import spaced_ticks
from sim.report.stats import mean_interval, shown_interval, t_quantile
from tests.report._report_helpers import result_doc, rows_of


def test_t_quantiles_are_the_printed_table() -> None:
    assert t_quantile(1) == 12.706 and t_quantile(2) == 4.303 and t_quantile(30) == 2.042
    assert t_quantile(31) == 1.960  # the normal quantile beyond the table
    with pytest.raises(ValueError, match=">= 1"):
        t_quantile(0)


def test_the_interval_of_three_seeds_by_hand() -> None:
    """.1, .2, .6: mean .3, sample sd sqrt(((.2)^2 + (.1)^2 + (.3)^2) / 2) = .26458,
    half-width 4.303 * .26458 / sqrt(3) = .65728."""
    mean, half = mean_interval([0.1, 0.2, 0.6])
    assert mean == pytest.approx(0.3)
    assert half == pytest.approx(4.303 * math.sqrt(0.07) / math.sqrt(3))
    assert shown_interval([0.1, 0.2, 0.6]) == "0.300 ± 0.657"
    assert mean_interval([0.4]) == (0.4, None) and shown_interval([0.4]) == "0.400"
    assert shown_interval([]) == "n/a"
    with pytest.raises(ValueError):
        mean_interval([])


def two_policies() -> list[object]:
    """turns beats block-floor by far at 16 slots and by little at 4, three seeds each."""
    docs = []
    for slots, turns, floor in ((4, (0.30, 0.31, 0.32), (0.29, 0.30, 0.31)),
                                (16, (0.70, 0.71, 0.72), (0.40, 0.41, 0.42))):  # fmt: skip
        for seed in range(3):
            for placement, hit in (("turns", turns[seed]), ("block-floor", floor[seed])):
                doc = result_doc(placement, "lru", slots, seed, hit)
                doc["sweep"] = {"placement.policy": placement, **doc["sweep"]}
                docs.append(doc)
    return rows_of(docs)  # type: ignore[return-value]


def test_the_best_policy_per_pool_says_whether_the_seeds_tell_it_apart() -> None:
    lines = best_policy_section(two_policies())  # type: ignore[arg-type]
    assert lines[0] == "## Best policy per pool size"
    rows = [line for line in lines if line.startswith("| checkpoint_slots=")]
    assert len(rows) == 2
    at_4, at_16 = rows
    # 4 slots: .31 ± .025 against .30 ± .025: the intervals overlap.
    assert at_4.startswith("| checkpoint_slots=4 | turns × lru |") and at_4.endswith("| no |")
    assert "| block-floor × lru |" in at_4
    # 16 slots: .71 against .41, both ± .025: apart.
    assert at_16.startswith("| checkpoint_slots=16 | turns × lru | 0.710 ± 0.025 |")
    assert at_16.endswith("| yes |")


def test_the_summary_reports_every_configuration_across_its_seeds() -> None:
    rows = two_policies()
    lines = seeds_section(rows)  # type: ignore[arg-type]
    assert lines[0] == "## Across seeds"
    assert any("| 3 | 0.710 ± 0.025 | 0.810 ± 0.025 |" in line for line in lines)
    from sim.report.figures import FIGURES

    text = summary(rows, dict.fromkeys(FIGURES, "not drawn here"))  # type: ignore[arg-type]
    assert text.index("## Across seeds") < text.index("## Best policy per pool size")
    assert text.index("## Best policy per pool size") < text.index("## Figures")


def test_one_seed_or_one_policy_adds_no_section() -> None:
    one_seed = rows_of(
        [result_doc("turns", "lru", 4, 0, 0.3), result_doc("turns", "lru", 8, 0, 0.4)]
    )
    assert seeds_section(one_seed) == [] and best_policy_section(one_seed) == []


def test_close_ticks_share_one_label() -> None:
    """A split engine's pools add up to a little under the unified budget: 1.97 and 2 GiB
    are one tick (labelled at the larger), 5 and 10 their own."""
    gib = 2**30
    sizes = [int(1.97 * gib), 2 * gib, int(4.96 * gib), 5 * gib, 10 * gib]
    assert spaced_ticks(sizes) == [2 * gib, 5 * gib, 10 * gib]
    assert spaced_ticks([4, 8, 16]) == [4, 8, 16]
