"""Every storage and exporter bug of the catalogue (tests/impls/bug_catalog.py) under the
scheduler on real tensors, on the shipped scenario ``crosscheck-tiny`` (its draft head,
speculative decoding, cached answers, partial pages and every buffer habit on): which rule
reports it, or why none can. docs/SIMULATION.md section 5 lists the same table; the last
test keeps the two in step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sim.engine import Faults
from tests.impls.bug_catalog import CATALOG
from tests.sim.test_sim_tensor_faults import run_tiny

DOC = Path(__file__).resolve().parents[2] / "docs" / "SIMULATION.md"
MISMATCH = frozenset({"restore-mismatch"})


@dataclass(frozen=True)
class Seen:
    """What a bug does on the scenario.

    Attributes:
        rules: the lockstep rules reported (empty: the run is clean).
        changes: ``SimConfig`` changes the run needs (the variant of the scenario).
        detail: a phrase some ``restore-mismatch`` detail holds (``""``: any).
        why: for a clean run, why no restore can see the bug.
    """

    rules: frozenset[str] = MISMATCH
    changes: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    why: str = ""


NOTHING_READ = "changes nothing a restore reads"
#: The catalogue's storage and exporter entries, by name.
SEEN: dict[str, Seen] = {
    "capture-skips-ring": Seen(detail="logits"),  # rings restored from the old batch slot
    "storage-ignores-strides": Seen(),  # padded_pools
    "storage-keeps-old-pools": Seen(),  # reallocation
    "boundary-ignores-strides": Seen(detail="draft KV"),  # padded hidden buffers
    "zero-keeps-conv-window": Seen(),  # a request that missed, in a reused batch slot
    "paired-restore-skips-draft": Seen(detail="draft KV"),
    "partial-capture-drops-last-row": Seen(changes={"spec_tokens": 0}, detail="KV 3."),
    "exporter-null-destination-wraps": Seen(),  # shared_export
    "exporter-zero-pads-window": Seen(detail="conv"),  # a capture 2 tokens into a chunk
    "exporter-ignores-strides": Seen(),  # sliced_inputs
    "exporter-ignores-recurrent-rows": Seen(),  # shared_export
    "exports-one-token-late": Seen(),
    # With broken_backend a published slot is restored that nothing captured: the
    # reference refuses the recurrent restore, the bug restores it silently. Both are
    # restore-mismatch; the bug's details no longer say the recurrent slot was never
    # captured (only its partial page's refusal remains).
    "restore-never-captured": Seen(
        rules=frozenset({"restore-mismatch", "unwritten-at-step-end"}),
        changes={"faults": Faults(broken_backend=True)},
    ),
    "bytes-forget-draft-pages": Seen(
        rules=frozenset(), why="byte accounting: the engine sizes its pools from SimConfig"
    ),
    "discard-keeps-boundary-row": Seen(
        rules=frozenset(), why="every checkpoint of a draft-head run writes its boundary row"
    ),
    "partial-restore-whole-page": Seen(
        rules=frozenset(),
        changes={"spec_tokens": 0},
        why="the restored page is fresh: rows >= valid are written before any read",
    ),
    "valid-clamped": Seen(rules=frozenset(), why="the engine never passes valid outside [0, B]"),
    "rejected-call-half-writes": Seen(rules=frozenset(), why="the engine makes no rejected call"),
}

ENTRIES = {bug.name: bug for bug in CATALOG if bug.layer in ("storage", "exporter")}


def test_every_storage_and_exporter_bug_of_the_catalogue_is_listed() -> None:
    assert sorted(SEEN) == sorted(ENTRIES)


@pytest.mark.parametrize("name", sorted(SEEN))
def test_each_bug_is_reported_or_invisible_to_a_restore(name: str) -> None:
    seen = SEEN[name]
    result = run_tiny(backend="external", impl=ENTRIES[name].spec, **seen.changes)
    reported = {rule for rule, count in result.violation_counts.items() if count}
    assert seen.rules <= reported, result.violation_counts
    if not seen.rules:
        assert result.ok, result.violation_counts
        assert result.backend["exactness_checks"] > 0  # restores happened, and were exact
    details = [v["detail"] for v in result.lockstep["violations"] if v["rule"] in seen.rules]
    assert not seen.detail or any(seen.detail in d for d in details), details[:5]
    if name == "restore-never-captured":
        assert not any("recurrent snapshot slot" in d for d in details), details[:5]
    elif seen.rules == MISMATCH:
        assert set(reported) == MISMATCH, result.violation_counts


def test_the_reference_refuses_a_restore_of_a_slot_never_captured() -> None:
    """The other side of ``restore-never-captured``: with the reference storage the same
    run reports the recurrent restore refused."""
    result = run_tiny(faults=Faults(broken_backend=True))
    details = [v["detail"] for v in result.lockstep["violations"]]
    assert any("recurrent snapshot slot" in d and "never captured" in d for d in details)


def test_docs_list_each_bug_under_the_rule_that_reports_it() -> None:
    """docs/SIMULATION.md section 5 names every entry, each in the row of its outcome."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("| catalogue bug |") :]
    table = table[: table.index("\n\n")]
    rows = {
        match.group(1): line
        for line in table.splitlines()
        if (match := re.match(r"\| `([a-z0-9-]+)` \|", line))
    }
    assert sorted(rows) == sorted(SEEN)
    for name, seen in SEEN.items():
        outcome = ", ".join(f"`{rule}`" for rule in sorted(seen.rules)) or NOTHING_READ
        assert outcome in rows[name], (name, rows[name])
