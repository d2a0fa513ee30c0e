"""``hyckpt demo``'s exactness section (``sim.demo_exactness``): it follows the configured
model and checkpoints (also at their edges), the successor token wraps around the
vocabulary, a corrupted restore or a shared page written in place is a mismatch, an
index failure and the exactness verdict are both reported, and a bad exactness value
names its key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import sim.demo
import sim.demo_exactness
from reference.conformance.exactness import VOCAB, Case, Outcome, play
from reference.state import LiveState
from tests.cli._demo_helpers import _exactness, _index_only, _invalid, _report, _summary


def _exactness_section(report: str) -> str:
    return report.split("\n\nExactness (DESIGN section 6)")[1]


def test_exactness_follows_the_configured_model_and_checkpoint() -> None:
    """Layers, draft head, block size, prompt length, chunk size and checkpoints all
    come from the table: p = 7 lies inside chunk [6, 12) with 3 rows in the partial
    page; B continues 13 tokens from A's token at 7 plus one; without a draft head no
    boundary row is recomputed."""
    config = _exactness(
        layers=["mamba2", "attn"], draft_head=False, block_size=4, prompt_length=20, checkpoints=[7]
    )
    code, report = _report(config)
    a_token = (5 * 7 + 3) % VOCAB
    assert code == 0, report
    assert _exactness_section(report) == (
        ": capture -> restore -> continue on the tiny float64 hybrid\n"
        "  layers mamba2 + attn, without a draft head, block size 4\n"
        "  prompt 20 tokens, prefilled in chunks of 6\n"
        "  p = 7    stored by the exporter inside chunk [6, 12); partial page of 3 rows\n"
        "            restored into batch slot 2 and new pages\n"
        f"            request B continues 13 tokens from successor {a_token + 1} "
        f"(A had {a_token})\n"
        "            bitwise equal to a from-scratch prefill: logits [13, 48] and 4 state "
        "tensors\n"
        "OK: 1 of 1 restores matched a from-scratch prefill bitwise\n"
    )


def test_exactness_checkpoints_at_the_edges() -> None:
    """p = 1 (inside the first chunk) and p = prompt_length - 1 (inside the last one,
    the successor wrapping around the vocabulary) are both playable; the chunk size and
    block size decide how each was stored."""
    config = _exactness(
        layers=["gdn"],
        draft_head=True,
        block_size=3,
        prompt_length=20,
        chunk_size=5,
        checkpoints=[1, 19, 15],
    )
    code, report = _report(config)
    section = _exactness_section(report)
    assert code == 0, report
    assert "  p = 1    stored by the exporter inside chunk [0, 5); partial page of 1 rows\n" in (
        section
    )
    assert "  p = 19   stored by the exporter inside chunk [15, 20); partial page of 1 rows\n" in (
        section
    )
    assert "  p = 15   captured at the end of chunk [10, 15); no partial page (p mod B = 0)\n" in (
        section
    )
    # A's token at 19 is (5*19+3) % 48 = 2, at 1 it is 8: B continues from one more.
    assert "request B continues 1 tokens from successor 3 (A had 2)\n" in section
    assert "request B continues 19 tokens from successor 9 (A had 8)\n" in section
    assert "layers gdn, with a draft head, block size 3\n" in section
    assert section.endswith("OK: 3 of 3 restores matched a from-scratch prefill bitwise\n")


def test_successor_wraps_around_the_vocabulary() -> None:
    """When A's token at p is the last of the vocabulary, B's successor is token 0."""
    p = next(p for p in range(1, 40) if (5 * p + 3) % VOCAB == VOCAB - 1)
    config = _exactness(
        layers=["mamba2", "attn"],
        draft_head=False,
        block_size=4,
        prompt_length=p + 2,
        chunk_size=64,
        checkpoints=[p],
    )
    code, report = _report(config)
    assert code == 0, report
    assert f"request B continues 2 tokens from successor 0 (A had {VOCAB - 1})\n" in report
    assert f"stored by the exporter inside chunk [0, {p + 2})" in report


def _corrupting(
    monkeypatch: pytest.MonkeyPatch, at: set[int], damage: Callable[[LiveState, list[int]], None]
) -> None:
    """Make the demo's restores of the checkpoints ``at`` corrupt request B's state right
    after the restore (reference.conformance.exactness.play's corruption hook)."""

    def corrupted(impl: Any, case: Case) -> Outcome:
        if case.p not in at:
            return play(impl, case)

        def corrupt(live: LiveState, case: Case, table_b: list[int]) -> None:
            damage(live, table_b)

        return play(impl, case, corrupt)

    monkeypatch.setattr(sim.demo_exactness, "play", corrupted)


def _bump_recurrent(live: LiveState, table_b: list[int]) -> None:
    live.recurrent["0.ssm"][2].add_(1e-9)  # the Mamba2 state of request B's batch slot


def _bump_kv(live: LiveState, table_b: list[int]) -> None:
    pages = next(iter(live.kv_pages.values()))
    pages[table_b[0], 0].add_(1.0)  # a full page shared with request A


def test_a_corrupted_restore_is_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore whose state differs from a from-scratch prefill by one recurrent value
    is reported as MISMATCH lines from the real comparison, is not called bitwise
    equal, and fails the demo while the other checkpoint still matches."""
    _corrupting(monkeypatch, {10}, _bump_recurrent)
    code, report = _report(_exactness())
    section = _exactness_section(report)
    assert code == 1
    p12, p10 = section.split("  p = 12   ")[1].split("  p = 10   ")
    assert "bitwise equal to a from-scratch prefill" in p12
    assert "bitwise equal" not in p10
    mismatches = [line.strip() for line in p10.splitlines() if "MISMATCH" in line]
    assert mismatches, p10
    assert all(line.startswith("MISMATCH: ") for line in mismatches)
    assert any("logits of [p, n) differ" in line and "p=10" in line for line in mismatches)
    assert section.endswith("FAILED: 1 of 2 restores matched a from-scratch prefill bitwise\n")
    assert _summary(report) == "OK: all 1 expected index results reproduced"


def test_a_shared_page_written_in_place_is_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing into a full page request B shares with A is caught and reported."""
    _corrupting(monkeypatch, {12, 10}, _bump_kv)
    code, report = _report(_exactness())
    assert code == 1
    assert "a shared full page was written in place" in report
    assert "bitwise equal" not in report
    assert report.endswith("FAILED: 0 of 2 restores matched a from-scratch prefill bitwise\n")


def test_index_failure_and_exactness_are_both_reported() -> None:
    """An index mismatch fails the demo even when every restore matched, and the
    exactness section is still played."""
    config = _exactness(checkpoints=[10])
    config["index"]["ops"][0]["expect"] = 2
    code, report = _report(config)
    assert code == 1
    assert report.endswith("OK: 1 of 1 restores matched a from-scratch prefill bitwise\n")
    assert _summary(report).startswith("FAILED: 1 of 1 ")


def test_no_exactness_table_means_no_exactness_section() -> None:
    """The exactness table is optional: without it the report ends at the index verdict."""
    code, report = _report(_index_only())
    assert code == 0
    assert "Exactness" not in report
    assert report.endswith("(base (20, 48] -> (48, 6); edited (20, 48] -> (32, 5))\n")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("layers", [], "exactness.layers must be a non-empty list of"),
        ("layers", "attn", "got 'attn'"),
        ("layers", ["attn", "mlp"], "got ['attn', 'mlp']"),
        ("draft_head", None, "exactness.draft_head must be true or false, got None"),
        ("draft_head", 1, "exactness.draft_head must be true or false, got 1"),
        ("prompt_length", 1, "exactness.prompt_length must be an integer >= 2, got 1"),
        ("chunk_size", 0, "exactness.chunk_size must be an integer >= 1, got 0"),
        ("checkpoints", [0], "exactness.checkpoints: 0 must lie in 1..19 (request B continues"),
        ("checkpoints", [19, 20], "exactness.checkpoints: 20 must lie in 1..19"),
        ("checkpoints", [-3], "exactness.checkpoints must be a list of non-negative integers"),
        ("checkpoint", [3], "exactness.checkpoint: unknown key"),
    ],
)
def test_a_bad_exactness_value_names_its_key(key: str, value: object, message: str) -> None:
    _invalid(_exactness(**{key: value}), message)


def test_exactness_must_be_a_table() -> None:
    config = _index_only()
    config["exactness"] = [1]
    _invalid(config, "demo configuration needs a [exactness] table")
