"""Edge cases of ``hyckpt demo`` (``sim.demo``): the default report line by line, and the
placement and index configuration honoured.

The existing tests (tests/cli/test_cli.py, tests/cli/test_demo_config.py) run the default
configuration; these pin the default report's placement, index and exactness sections
exactly, then change the placement policies, prompts, hint lists, slot capacity,
namespace, index settings and eviction policy and check that each reaches the report.
The index verdicts are in tests/cli/test_demo_edges_verdicts.py, the exactness section in
tests/cli/test_demo_edges_exactness.py, and configuration errors in
tests/cli/test_demo_edges_errors.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.index
import sim.demo
import sim.demo_exactness
from reference.api import CheckpointIndex, PrefillChunk
from reference.placement import make_placement
from sim.demo import chunk_bounds
from tests.cli._demo_helpers import SEED_WRITES, _index_only, _invalid, _report, _rows, _summary

# --- the default report, line by line ------------------------------------------------

DEFAULT_PLACEMENT = """\
Placement (DESIGN section 2): positions captured in each prefill chunk of a 3602-token prompt
  block size 16, hash unit 16, 4 chunks of up to 1024 tokens
  user turns start at 0, 812, 2050; branch points 1600

vllm-align   block_size=16 hash_unit=16 alignment=16 drop_draft_block=false lookahead=0
    chunk [   0, 1024)  1008
    chunk [1024, 2048)  2032
    chunk [2048, 3072)  3056
    chunk [3072, 3602)  3600
    all (4)             1008, 2032, 3056, 3600

block-floor  block_size=16
    chunk [   0, 1024)  -
    chunk [1024, 2048)  -
    chunk [2048, 3072)  -
    chunk [3072, 3602)  3584
    all (1)             3584

interval     hash_unit=16 every=512 from_start=[64] from_end=[2]
    chunk [   0, 1024)  64, 512, 1024
    chunk [1024, 2048)  1536, 2048
    chunk [2048, 3072)  2560, 3072
    chunk [3072, 3602)  3584, 3600
    all (9)             64, 512, 1024, 1536, 2048, 2560, 3072, 3584, 3600

turns        hash_unit=16 margin=2
    chunk [   0, 1024)  800
    chunk [1024, 2048)  2048
    chunk [2048, 3072)  -
    chunk [3072, 3602)  3600
    all (3)             800, 2048, 3600

branch       hash_unit=16
    chunk [   0, 1024)  -
    chunk [1024, 2048)  1600
    chunk [2048, 3072)  -
    chunk [3072, 3602)  3600
    all (2)             1600, 3600
"""

DEFAULT_INDEX_ROWS = {
    1: ("write base[:16]", "ok", "published in slot 4"),
    2: ("write base[:32]", "ok", "published in slot 5"),
    3: ("write base[:48]", "ok", "published in slot 6"),
    4: ("lookup base, 20 < tokens <= 48", "ok, seed", "hit (48, 6)"),
    5: ("lookup edited, 20 < tokens <= 48", "ok, seed", "hit (32, 5)"),
    6: ("reserve base[:48]", "ok", "already cached in slot 6 (published)"),
    7: ("reserve base[:64] as r64", "ok", "reserved slot 4"),
    8: ("abort r64", "-", "slot 4 returned to the free list"),
    9: ("lookup base, 48 < tokens <= 64", "ok", "miss"),
    10: ("lookup base, 0 < tokens <= 16", "ok", "miss"),
    11: ("free_count", "ok", "1 free"),
    12: ("write base[:64]", "ok", "published in slot 4"),
    13: ("pin slot 6", "ok", "pins = 1"),
    14: ("write edited[:48]", "ok", "published in slot 5"),
    15: ("unpin slot 6", "ok", "pins = 0"),
    16: ("lookup base, 20 < tokens <= 48", "ok", "hit (48, 6)"),
    17: ("lookup edited, 0 < tokens <= 64", "ok", "hit (48, 5)"),
    18: ("lookup base, 0 < tokens <= 64", "ok", "hit (64, 4)"),
    19: (
        "unpin slot 6",
        "ok",
        "raised PinUnderflowError: unpin of slot 6 would take its pin count below zero; "
        "call unpin once per successful pin, after the restore's copy completed",
    ),
}


def test_default_report_placement_section_is_exact() -> None:
    """The placement section of the default report, verbatim: every captured position,
    every union and its count, the settings line of each policy (booleans and lists in
    TOML spelling) and the prompt summary."""
    code, report = _report(None)
    assert code == 0
    assert report.startswith(
        "hyckpt demo: reference placement policies and checkpoint index\n" + "=" * 62 + "\n\n"
    )
    assert DEFAULT_PLACEMENT in report


def test_default_report_index_table_is_exact() -> None:
    """Every row of the default index table: what was done, the check and the result,
    and the header naming the index's settings and prompts."""
    code, report = _report(None)
    assert code == 0
    assert (
        "Index (DESIGN section 3): capacity 3 from slot 4, eviction lru, namespace 'model', "
        "hash unit 16\n"
        "  prompt base: tokens 0..63 (64 tokens)\n"
        "  prompt edited: tokens 0..63 (64 tokens) with [40] = 1040\n\n"
        "   #  operation                         check     result\n"
    ) in report
    assert _rows(report) == DEFAULT_INDEX_ROWS
    assert _summary(report) == (
        "OK: all 18 expected index results reproduced, seed vectors included "
        "(base (20, 48] -> (48, 6); edited (20, 48] -> (32, 5))"
    )


def test_default_report_exactness_section_is_exact() -> None:
    """The exactness section of the default: how each checkpoint was stored, B's
    successor and A's token at p, and the shapes that were compared."""
    code, report = _report(None)
    assert code == 0
    assert report.endswith(
        "\n\nExactness (DESIGN section 6): capture -> restore -> continue on the tiny float64 "
        "hybrid\n"
        "  layers mamba2 + gdn + swa + attn, with a draft head, block size 4\n"
        "  prompt 20 tokens, prefilled in chunks of 6\n"
        "  p = 12   captured at the end of chunk [6, 12); no partial page (p mod B = 0)\n"
        "            restored into batch slot 2 and new pages, draft row p-1 recomputed "
        "from h_(p-1)\n"
        "            request B continues 8 tokens from successor 16 (A had 15)\n"
        "            bitwise equal to a from-scratch prefill: logits [8, 48] and 10 state "
        "tensors\n"
        "  p = 10   stored by the exporter inside chunk [6, 12); partial page of 2 rows\n"
        "            restored into batch slot 2 and new pages, draft row p-1 recomputed "
        "from h_(p-1)\n"
        "            request B continues 10 tokens from successor 6 (A had 5)\n"
        "            bitwise equal to a from-scratch prefill: logits [10, 48] and 10 state "
        "tensors\n"
        "OK: 2 of 2 restores matched a from-scratch prefill bitwise\n"
    )


def test_default_report_writes_nothing_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """With an explicit stream nothing leaks to stdout (every print names its stream)."""
    code, report = _report(_index_only())
    assert code == 0 and report
    assert capsys.readouterr() == ("", "")


# --- placement: the configuration is honoured ----------------------------------------


def _placement_lines(report: str) -> dict[str, list[str]]:
    """Policy name -> its chunk and union lines (wrapped lines joined)."""
    section = report.split("Placement (DESIGN section 2)")[1].split("\nIndex (DESIGN")[0]
    policies: dict[str, list[str]] = {}
    for block in section.strip("\n").split("\n\n")[1:]:
        head, *lines = block.splitlines()
        joined: list[str] = []
        for line in lines:
            if line.startswith(("    chunk [", "    all (")):
                joined.append(line)
            else:
                joined[-1] += " " + line.strip()
        policies[head.split()[0]] = joined
    return policies


@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_placement_positions_match_the_policies(data: st.DataObject) -> None:
    """For any prompt, chunking and policy parameters, each chunk line lists exactly what
    the policy returns for that chunk (or ``-``), and the union line the sorted union and
    its size."""
    length = data.draw(st.integers(1, 400), label="length")
    chunk_size = data.draw(st.integers(1, 160), label="chunk_size")
    block_size = data.draw(st.sampled_from([1, 4, 16, 32]), label="block_size")
    turns = data.draw(st.lists(st.integers(0, length), max_size=3, unique=True), label="turns")
    branches = data.draw(
        st.lists(st.integers(0, length), max_size=2, unique=True), label="branches"
    )
    config = _index_only()
    config["prompt"].update(
        length=length,
        chunk_size=chunk_size,
        turn_starts=sorted(turns),
        branch_points=sorted(branches),
    )
    config["placement"] = {
        "block-floor": {"block_size": block_size},
        "interval": {"hash_unit": 1, "every": 50, "from_start": [3], "from_end": [1]},
        "turns": {"hash_unit": 1, "margin": 2},
        "branch": {"hash_unit": 1},
    }
    code, report = _report(config)
    assert code == 0
    digits = len(str(length))
    shown = _placement_lines(report)
    assert list(shown) == list(config["placement"])
    for name, params in config["placement"].items():
        policy = make_placement(name, **params)
        expected: list[str] = []
        union: set[int] = set()
        for start, end in chunk_bounds(length, chunk_size):
            chunk = PrefillChunk(start, end, length, tuple(sorted(turns)), tuple(sorted(branches)))
            positions = list(policy.positions(chunk))
            union.update(positions)
            text = ", ".join(map(str, positions)) or "-"
            expected.append(f"chunk [{start:>{digits}}, {end:>{digits}}) {text}")
        everything = sorted(union)
        expected.append(f"all ({len(everything)}) {', '.join(map(str, everything)) or '-'}")
        assert [" ".join(line.split()) for line in shown[name]] == [
            " ".join(line.split()) for line in expected
        ]


def test_long_lines_wrap_at_100_columns_under_their_label() -> None:
    """Position lists and results longer than a line wrap at 100 columns, continuing
    under the text column: twelve 4-digit positions per line for a policy capturing
    every 16 tokens, and the default's last index row on three lines."""
    config = _index_only()
    config["placement"] = {"interval": {"hash_unit": 16, "every": 16}}
    code, report = _report(config)
    assert code == 0
    lines = report.splitlines()
    first = lines.index(
        "    chunk [1024, 2048)  " + ", ".join(map(str, range(1040, 1217, 16))) + ","
    )
    for row in range(1, 6):
        numbers = range(1040 + 192 * row, min(1040 + 192 * (row + 1), 2049), 16)
        tail = "," if row < 5 else ""
        assert lines[first + row] == " " * 24 + ", ".join(map(str, numbers)) + tail
    assert lines[first + 6].startswith("    chunk [2048, 3072)  ")
    assert all(len(line) <= 100 for line in lines if not line.startswith("OK: "))
    code, report = _report(None)
    assert (
        "  19  unpin slot 6                      ok        raised PinUnderflowError: unpin of "
        "slot 6 would\n"
        + " " * 50
        + "take its pin count below zero; call unpin once per\n"
        + " " * 50
        + "successful pin, after the restore's copy completed\n"
    ) in report


def test_policy_settings_are_shown_in_toml_spelling() -> None:
    """Each policy's settings line shows its parameters in order as written in TOML:
    lists with their elements comma-separated, booleans as true/false."""
    config = _index_only()
    config["placement"] = {
        "interval": {"hash_unit": 16, "every": 1024, "from_start": [64, 128], "from_end": []},
        "vllm-align": {"block_size": 16, "hash_unit": 16, "drop_draft_block": True},
    }
    code, report = _report(config)
    assert code == 0
    assert "\ninterval     hash_unit=16 every=1024 from_start=[64, 128] from_end=[]\n" in report
    assert "\nvllm-align   block_size=16 hash_unit=16 drop_draft_block=true\n" in report


def test_prompt_summary_shows_the_configured_prompt() -> None:
    """The placement header shows the configured length, block size, hash unit, chunk
    count and size; empty hint lists are shown as ``-``."""
    config = _index_only()
    config["prompt"] = {
        "length": 100,
        "block_size": 8,
        "hash_unit": 4,
        "chunk_size": 30,
        "turn_starts": [],
        "branch_points": [],
    }
    config["placement"] = {"block-floor": {"block_size": 8}}
    code, report = _report(config)
    assert code == 0
    assert (
        "Placement (DESIGN section 2): positions captured in each prefill chunk of a "
        "100-token prompt\n"
        "  block size 8, hash unit 4, 4 chunks of up to 30 tokens\n"
        "  user turns start at -; branch points -\n\n"
        "block-floor  block_size=8\n"
        "    chunk [  0,  30)  -\n"
        "    chunk [ 30,  60)  -\n"
        "    chunk [ 60,  90)  88\n"
        "    chunk [ 90, 100)  -\n"
        "    all (1)           88\n\n"
        "Index (DESIGN section 3)"
    ) in report


def test_hint_lists_may_end_at_the_prompt_length_but_not_beyond() -> None:
    """A turn start or branch point equal to the prompt length is accepted; one beyond
    it is refused, naming the key, the offending positions and the length."""
    config = _index_only()
    config["prompt"]["turn_starts"] = [0, 3602]
    config["prompt"]["branch_points"] = [3602]
    assert _report(config)[0] == 0
    config["prompt"]["turn_starts"] = [0, 3603, 4000]
    _invalid(config, "prompt.turn_starts [3603, 4000] lie beyond the prompt length 3602")
    config = _index_only()
    config["prompt"]["branch_points"] = [3603]
    _invalid(config, "prompt.branch_points [3603] lie beyond the prompt length 3602")


# --- index: configuration honoured -------------------------------------------------------


def test_first_slot_capacity_and_namespace_are_honoured() -> None:
    """Slots are numbered from ``first_slot``; ``capacity`` bounds the pool (a third
    write with capacity 2 evicts); the header names the namespace."""
    ops = [
        {"op": "write", "prompt": "base", "tokens": 16, "expect": 10},
        {"op": "write", "prompt": "base", "tokens": 32, "expect": 11},
        {"op": "free_count", "expect": 0},
        {"op": "write", "prompt": "base", "tokens": 48, "expect": 10},
    ]
    config = _index_only(ops, capacity=2, first_slot=10, namespace="other", hash_unit=8)
    code, report = _report(config)
    assert code == 0, report
    assert (
        "Index (DESIGN section 3): capacity 2 from slot 10, eviction lru, namespace 'other', "
        "hash unit 8\n"
    ) in report
    assert [row[2] for row in _rows(report).values()] == [
        "published in slot 10",
        "published in slot 11",
        "0 free",
        "published in slot 10",
    ]


def test_the_index_is_built_with_the_configured_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The header's claims are the index's own settings: the index the demo plays on
    has the configured capacity, first slot, eviction policy and hash unit (the hash
    unit changes no result, so only the index itself can show it)."""
    built: list[CheckpointIndex] = []

    def spy(*args: Any, **kwargs: Any) -> CheckpointIndex:
        built.append(reference.index.make_index(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(sim.demo, "make_index", spy)
    config = _index_only([{"op": "free_count", "expect": 2}], capacity=2, first_slot=7)
    config["index"].update(eviction="fifo", hash_unit=8)
    code, report = _report(config)
    assert code == 0
    assert "capacity 2 from slot 7, eviction fifo, namespace 'model', hash unit 8\n" in report
    [index] = built
    assert isinstance(index, reference.index.ReferenceIndex)
    assert (index.capacity, index.first_slot, index.hash_unit) == (2, 7, 8)
    assert index.eviction.name == "fifo"


@pytest.mark.parametrize(("eviction", "slot"), [("lru", 5), ("fifo", 4)])
def test_eviction_policy_is_honoured(eviction: str, slot: int) -> None:
    """After a lookup refreshes the oldest entry, LRU evicts the second write (slot 5)
    and FIFO the first (slot 4): the configured eviction policy is the one used."""
    ops = [
        *SEED_WRITES,
        {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 16, "expect": [16, 4]},
        {"op": "write", "prompt": "base", "tokens": 64, "expect": slot},
    ]
    code, report = _report(_index_only(ops, eviction=eviction))
    assert code == 0, report
    assert _rows(report)[5] == ("write base[:64]", "ok", f"published in slot {slot}")


def test_prompt_ranges_and_replacements_are_honoured() -> None:
    """A prompt is ``range(start, stop)`` with its ``replace`` pairs applied: the header
    shows it, and a lookup on the edited prompt stops at the edited token."""
    config = _index_only(
        [
            {"op": "write", "prompt": "p", "tokens": 32, "expect": 4},
            {"op": "lookup", "prompt": "q", "minimum": 0, "maximum": 32, "expect": [16, 5]},
        ]
    )
    config["index"]["prompts"] = {
        "p": {"start": 5, "stop": 45},
        "q": {"start": 5, "stop": 45, "replace": [[20, 7], [39, 8]]},
    }
    config["index"]["ops"].insert(1, {"op": "write", "prompt": "q", "tokens": 16, "expect": 5})
    code, report = _report(config)
    assert code == 0, report
    assert "  prompt p: tokens 5..44 (40 tokens)\n" in report
    assert "  prompt q: tokens 5..44 (40 tokens) with [20] = 7, [39] = 8\n" in report
