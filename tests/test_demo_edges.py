"""Edge cases of ``hyckpt demo`` (``sim.demo`` and ``sim.demo_exactness``): every number
and verdict the report prints comes from the configuration and from real comparisons,
every configuration value is honoured, a bad value is an error naming its key before
anything is printed, and the exit code says whether everything held.

The existing tests (tests/test_cli.py, tests/test_demo_config.py) run the default
configuration; these pin the report line by line and drive the paths the default
never takes (other outcomes, other expectations, other models, corrupted restores).
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.index
import sim.demo
import sim.demo_exactness
from reference.api import CheckpointIndex, PrefillChunk
from reference.errors import InvalidConfigError, UnknownPolicyError
from reference.exactness import VOCAB, Case, Outcome, play
from reference.placement import make_placement
from reference.state import LiveState
from sim.cli import main
from sim.demo import chunk_bounds, load_config, load_default_config, run_demo

Config = dict[str, Any]

ROW = re.compile(r"^  +(\d+)  (.+?)  +(ok, seed|ok|MISMATCH|-)  +(.*)$")


# --- helpers ---------------------------------------------------------------------------


def _default() -> Config:
    return copy.deepcopy(load_default_config())


def _index_only(ops: list[dict[str, Any]] | None = None, **index: Any) -> Config:
    """The default configuration without its exactness table (fast), with ``ops`` and
    ``index`` settings replacing the default ones."""
    config = _default()
    del config["exactness"]
    if ops is not None:
        config["index"]["ops"] = ops
    config["index"].update(index)
    return config


def _report(config: Config | None) -> tuple[int, str]:
    buffer = io.StringIO()
    code = run_demo(config, buffer)
    return code, buffer.getvalue()


def _rows(report: str) -> dict[int, tuple[str, str, str]]:
    """The index table: step number -> (operation, check, result), wrapped text joined."""
    rows: dict[int, tuple[str, str, str]] = {}
    last = 0
    section = report.split("\nIndex (DESIGN section 3)")[1].split("\n\n")[1]
    for line in section.splitlines()[1:]:
        match = ROW.match(line)
        if match:
            last = int(match[1])
            rows[last] = (match[2].rstrip(), match[3], match[4])
        else:
            operation, check, text = rows[last]
            rows[last] = (operation, check, f"{text} {line.strip()}")
    return rows


def _summary(report: str) -> str:
    """The index verdict line (``OK: ...`` or ``FAILED: ...``)."""
    return next(
        line
        for line in report.splitlines()
        if line.startswith(("OK: ", "FAILED: ")) and "index results" in line
    )


def _invalid(config: Config, message: str) -> None:
    """``config`` is refused with ``message`` (exactly that substring), before output."""
    buffer = io.StringIO()
    with pytest.raises(InvalidConfigError) as raised:
        run_demo(config, buffer)
    assert message in str(raised.value), str(raised.value)
    assert buffer.getvalue() == ""


SEED_WRITES = [
    {"op": "write", "prompt": "base", "tokens": 16, "expect": 4},
    {"op": "write", "prompt": "base", "tokens": 32, "expect": 5},
    {"op": "write", "prompt": "base", "tokens": 48, "expect": 6},
]


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


# --- index: results, expectations and verdicts -------------------------------------------


def test_every_reserve_outcome_is_shown_and_checked() -> None:
    """A reserve can be reserved, already cached while being written, already cached
    and published, or find no slot; each is shown with its slot and matched against
    the expectation's outcome, slot and published flag."""
    ops = [
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "a"},
        {
            "op": "reserve",
            "prompt": "base",
            "tokens": 16,
            "expect": {"outcome": "already-cached", "slot": 0, "published": False},
        },
        {"op": "reserve", "prompt": "base", "tokens": 32, "expect": {"outcome": "no-slot"}},
        {"op": "publish", "reservation": "a", "expect": True},
        {
            "op": "reserve",
            "prompt": "base",
            "tokens": 16,
            "expect": {"outcome": "already-cached", "slot": 0, "published": True},
        },
        {
            "op": "reserve",
            "prompt": "base",
            "tokens": 48,
            "expect": {"outcome": "reserved", "slot": 1},
        },
    ]
    code, report = _report(_index_only(ops, capacity=1, first_slot=0))
    rows = _rows(report)
    assert rows[1] == ("reserve base[:16] as a", "-", "reserved slot 0")
    assert rows[2] == ("reserve base[:16]", "ok", "already cached in slot 0 (being written)")
    assert rows[3] == (
        "reserve base[:32]",
        "ok",
        "no slot (all 1 slots are reserved, pinned or waiting for a pin to drop)",
    )
    assert rows[4] == ("publish a", "ok", "published")
    assert rows[5] == ("reserve base[:16]", "ok", "already cached in slot 0 (published)")
    # The last expectation names another slot than the one reserved.
    assert rows[6] == (
        "reserve base[:48]",
        "MISMATCH",
        "reserved slot 0; expected reserved slot 1",
    )
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 5 index results differ from the expected values (steps 6)"
    )


@pytest.mark.parametrize(
    ("op", "expect", "row"),
    [
        (
            {"op": "write", "prompt": "base", "tokens": 16},
            5,
            ("write base[:16]", "published in slot 4; expected published in slot 5"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "no-slot"},
            ("reserve base[:16]", "reserved slot 4; expected no slot"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "reserved", "slot": 6},
            ("reserve base[:16]", "reserved slot 4; expected reserved slot 6"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "already-cached", "slot": 4, "published": True},
            ("reserve base[:16]", "reserved slot 4; expected already cached in slot 4 (published)"),
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "already-cached", "slot": 4, "published": False},
            (
                "reserve base[:16]",
                "reserved slot 4; expected already cached in slot 4 (being written)",
            ),
        ),
        (
            {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64},
            [16, 4],
            ("lookup base, 0 < tokens <= 64", "miss; expected hit (16, 4)"),
        ),
        (
            {"op": "free_count"},
            2,
            ("free_count", "3 free; expected 2 free"),
        ),
        (
            {"op": "pin", "slot": 4},
            1,
            (
                "pin slot 4",
                "raised SlotStateError: cannot pin slot 4: it is free; pin only a slot "
                "returned by lookup, before anything invalidates it; expected pins = 1",
            ),
        ),
        (
            {"op": "unpin", "slot": 4},
            0,
            (
                "unpin slot 4",
                "raised PinUnderflowError: unpin of slot 4 would take its pin count below "
                "zero; call unpin once per successful pin, after the restore's copy "
                "completed; expected pins = 0",
            ),
        ),
    ],
)
def test_a_mismatch_names_what_was_expected(
    op: dict[str, Any], expect: object, row: tuple[str, str]
) -> None:
    """On a fresh index (capacity 3 from slot 4), a wrong expectation is a MISMATCH that
    shows the result and the expected value in the operation's own words, and the demo
    exits 1 naming the step."""
    code, report = _report(_index_only([{**op, "expect": expect}]))
    operation, text = row
    assert _rows(report) == {1: (operation, "MISMATCH", text)}
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 1 index results differ from the expected values (steps 1)"
    )


def test_a_hit_where_a_miss_was_expected_says_so() -> None:
    """``expect = []`` is a miss; a hit instead is a MISMATCH that says a miss was
    expected."""
    ops = [
        SEED_WRITES[0],
        {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": []},
    ]
    code, report = _report(_index_only(ops))
    assert _rows(report)[2] == (
        "lookup base, 0 < tokens <= 64",
        "MISMATCH",
        "hit (16, 4); expected miss",
    )
    assert code == 1


def test_pin_counts_are_checked() -> None:
    """``pin`` and ``unpin`` return the new pin count, checked against ``expect``."""
    ops = [
        *SEED_WRITES,
        {"op": "pin", "slot": 4, "expect": 1},
        {"op": "pin", "slot": 4, "expect": 1},
        {"op": "unpin", "slot": 4, "expect": 1},
    ]
    code, report = _report(_index_only(ops))
    rows = _rows(report)
    assert rows[4] == ("pin slot 4", "ok", "pins = 1")
    assert rows[5] == ("pin slot 4", "MISMATCH", "pins = 2; expected pins = 1")
    assert rows[6] == ("unpin slot 4", "ok", "pins = 1")
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 6 index results differ from the expected values (steps 5)"
    )


def test_several_mismatches_are_all_listed() -> None:
    """Every failing step is listed, in order, and counted against every checked one;
    operations without an expectation are neither."""
    ops = [
        {"op": "write", "prompt": "base", "tokens": 16, "expect": 5},
        {"op": "write", "prompt": "base", "tokens": 32},
        {"op": "free_count", "expect": 1},
        {"op": "free_count", "expect": 0},
    ]
    code, report = _report(_index_only(ops))
    assert code == 1
    assert [row[1] for row in _rows(report).values()] == ["MISMATCH", "-", "ok", "MISMATCH"]
    assert _summary(report) == (
        "FAILED: 2 of 3 index results differ from the expected values (steps 1, 4)"
    )


def test_a_write_that_finds_the_key_cached_writes_nothing() -> None:
    """A ``write`` of a published key reports the reserve outcome and that nothing was
    written; its value is the reserve's, so an expected slot number does not match."""
    ops = [
        {"op": "write", "prompt": "base", "tokens": 16, "expect": 4},
        {"op": "write", "prompt": "base", "tokens": 16, "expect": 4},
    ]
    code, report = _report(_index_only(ops))
    assert _rows(report)[2] == (
        "write base[:16]",
        "MISMATCH",
        "reserve gave already cached in slot 4 (published), nothing written; "
        "expected published in slot 4",
    )
    assert code == 1


def test_a_write_into_a_full_pool_reports_no_slot() -> None:
    """With every slot reserved, a ``write`` reserves nothing and says so; an
    expectation of the no-slot outcome matches it."""
    ops = [
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "r"},
        {"op": "write", "prompt": "base", "tokens": 32, "expect": {"outcome": "no-slot"}},
    ]
    code, report = _report(_index_only(ops, capacity=1))
    assert _rows(report)[2] == (
        "write base[:32]",
        "ok",
        "reserve gave no slot (all 1 slots are reserved, pinned or waiting for a pin to "
        "drop), nothing written",
    )
    assert code == 0


def test_publish_and_abort_act_on_the_named_reservation() -> None:
    """``publish`` makes the named reservation visible (a lookup then hits it); a
    reservation aborted is never visible and its slot is free again."""
    ops: list[dict[str, Any]] = [
        {"op": "reserve", "prompt": "base", "tokens": 32, "name": "x"},
        {"op": "reserve", "prompt": "base", "tokens": 48, "name": "y"},
        {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": []},
        {"op": "publish", "reservation": "x", "expect": True},
        {"op": "abort", "reservation": "y"},
        {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": [32, 4]},
        {"op": "free_count", "expect": 2},
    ]
    code, report = _report(_index_only(ops))
    rows = _rows(report)
    assert rows[4] == ("publish x", "ok", "published")
    assert rows[5] == ("abort y", "-", "slot 5 returned to the free list")
    assert code == 0, report
    assert _summary(report) == "OK: all 4 expected index results reproduced"


def test_a_reserve_without_a_slot_leaves_its_name_unbound() -> None:
    """A named reserve that finds no slot opens no reservation: a later ``abort`` of
    that name touches nothing, says so and fails the demo (the configuration asked for
    an abort that could not happen), and the pool is unchanged."""
    name = "-".join(["ab"] * 7)  # hyphens are not line breaks: the name stays whole
    ops: list[dict[str, Any]] = [
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "a"},
        {"op": "reserve", "prompt": "base", "tokens": 32, "name": name},
        {"op": "abort", "reservation": name},
        {"op": "free_count", "expect": 0},
        {"op": "publish", "reservation": "a", "expect": True},
    ]
    code, report = _report(_index_only(ops, capacity=1))
    rows = _rows(report)
    assert rows[2][1:] == (
        "-",
        "no slot (all 1 slots are reserved, pinned or waiting for a pin to drop)",
    )
    assert rows[3] == (
        f"abort {name}",
        "MISMATCH",
        f"no open reservation named '{name}'; expected no error",
    )
    lines = report.splitlines()
    operation = f"abort {name}".ljust(len(f"reserve base[:32] as {name}"))
    wrapped = next(n for n, line in enumerate(lines) if line.startswith(f"  3  {operation}  "))
    assert lines[wrapped].endswith("  no open reservation named")
    assert lines[wrapped + 1] == f"{' ' * 58}'{name}'; expected no error"
    assert rows[4] == ("free_count", "ok", "0 free")
    assert rows[5] == ("publish a", "ok", "published")
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 3 index results differ from the expected values (steps 3)"
    )


def test_an_unexpected_error_fails_even_without_an_expectation() -> None:
    """An operation that raises is checked even without ``expect``: it is a MISMATCH
    that expected no error."""
    code, report = _report(_index_only([{"op": "pin", "slot": 4}]))
    assert _rows(report) == {
        1: (
            "pin slot 4",
            "MISMATCH",
            "raised SlotStateError: cannot pin slot 4: it is free; pin only a slot returned "
            "by lookup, before anything invalidates it; expected no error",
        )
    }
    assert code == 1
    assert _summary(report) == (
        "FAILED: 1 of 1 index results differ from the expected values (steps 1)"
    )


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("SlotStateError", "ok"),
        ("HyckptError", "ok"),  # a base class of the error raised matches too
        ("PinUnderflowError", "MISMATCH"),
        ("Slot", "MISMATCH"),  # whole class names only
    ],
)
def test_expect_error_matches_the_class_or_a_base_class(name: str, check: str) -> None:
    """``expect_error`` names the error class or one of its bases; another name is a
    MISMATCH saying which error was expected."""
    code, report = _report(_index_only([{"op": "pin", "slot": 4, "expect_error": name}]))
    operation, shown, text = _rows(report)[1]
    assert (operation, shown) == ("pin slot 4", check)
    assert text.startswith("raised SlotStateError: cannot pin slot 4: it is free")
    if check == "ok":
        assert code == 0 and text.endswith("invalidates it")
        assert _summary(report) == "OK: all 1 expected index results reproduced"
    else:
        assert code == 1 and text.endswith(f"; expected raises {name}")


def test_expect_error_without_an_error_is_a_mismatch() -> None:
    """An operation expected to raise that succeeds is a MISMATCH."""
    code, report = _report(_index_only([{"op": "free_count", "expect_error": "PinUnderflowError"}]))
    assert _rows(report)[1] == (
        "free_count",
        "MISMATCH",
        "3 free; expected raises PinUnderflowError",
    )
    assert code == 1


def test_seed_vectors_are_listed_only_when_they_hold() -> None:
    """Steps marked ``seed`` are listed in the OK line in order (lookups as ranges, other
    operations by their description); a failing seed step is a plain MISMATCH."""
    ops = [
        {**SEED_WRITES[0], "seed": True},
        *SEED_WRITES[1:],
        {"op": "lookup", "prompt": "base", "minimum": 20, "maximum": 48, "expect": [48, 6]},
        {
            "op": "lookup",
            "prompt": "edited",
            "minimum": 0,
            "maximum": 64,
            "expect": [32, 5],
            "seed": True,
        },
        {"op": "free_count", "expect": 0, "seed": True},
        {"op": "lookup", "prompt": "base", "minimum": 48, "maximum": 64, "expect": [], "seed": 1},
    ]
    code, report = _report(_index_only(ops))
    rows = _rows(report)
    checks = ["ok, seed", "ok", "ok", "ok", "ok, seed", "ok, seed", "ok"]  # seed = 1 is no seed
    assert [row[1] for row in rows.values()] == checks
    assert code == 0
    assert _summary(report) == (
        "OK: all 7 expected index results reproduced, seed vectors included "
        "(write base[:16] -> published in slot 4; edited (0, 64] -> (32, 5); "
        "free_count -> 0 free)"
    )
    ops[4]["expect"] = [48, 6]
    code, report = _report(_index_only(ops))
    assert _rows(report)[5][1] == "MISMATCH"
    assert code == 1
    assert "seed vectors" not in report


def test_a_seed_miss_is_listed_by_its_description() -> None:
    """A seed lookup that (as expected) misses is listed by its description."""
    ops = [{"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64, "expect": []}]
    ops[0]["seed"] = True
    code, report = _report(_index_only(ops))
    assert code == 0
    assert _summary(report) == (
        "OK: all 1 expected index results reproduced, seed vectors included "
        "(lookup base, 0 < tokens <= 64 -> miss)"
    )


# --- configuration errors name the key -------------------------------------------------


def _with_op(op: object) -> Config:
    config = _index_only()
    config["index"]["ops"].append(op)
    return config


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ("pin", "index.ops[19] must be a table"),
        ({"op": "evict"}, "index.ops[19].op must be one of write, reserve, publish, abort, "),
        ({"slot": 4}, "got None"),
        ({"op": "write", "tokens": 16}, "index.ops[19].prompt must be a non-empty string"),
        ({"op": "reserve", "prompt": "nope", "tokens": 1}, "index.ops[19].prompt 'nope' is not"),
        ({"op": "write", "prompt": "base"}, "index.ops[19].tokens must be an integer >= 0"),
        ({"op": "reserve", "prompt": "base"}, "index.ops[19].tokens must be an integer >= 0"),
        (
            {"op": "lookup", "prompt": "base", "maximum": 1},
            "index.ops[19].minimum must be an integer >= 0",
        ),
        (
            {"op": "lookup", "prompt": "base", "minimum": 1},
            "index.ops[19].maximum must be an integer >= 0",
        ),
        ({"op": "lookup", "minimum": 0, "maximum": 1}, "index.ops[19].prompt must be a"),
        ({"op": "pin"}, "index.ops[19].slot must be an integer >= 0"),
        ({"op": "unpin", "slot": -1}, "index.ops[19].slot must be an integer >= 0, got -1"),
        ({"op": "publish"}, "index.ops[19].reservation must be a non-empty string"),
        ({"op": "abort", "reservation": ""}, "index.ops[19].reservation must be a non-empty"),
        (
            {"op": "write", "prompt": "base", "tokens": 16, "name": "w"},
            "index.ops[19]: only a reserve can be given a name",
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16, "name": 3},
            "index.ops[19].name must be a non-empty string, got 3",
        ),
        (
            {"op": "free_count", "expect_error": 5},
            "index.ops[19].expect_error must be a non-empty string, got 5",
        ),
        (
            {"op": "free_count", "expect": 3, "expect_error": "HyckptError"},
            "index.ops[19] has both expect and expect_error",
        ),
        ({"op": "free_count", "expct": 3}, "index.ops[19].expct: unknown key"),
    ],
)
def test_a_bad_operation_names_its_index(op: object, message: str) -> None:
    """Each operation's required fields are checked for its kind, and the message names
    the operation by its (zero-based) position and the field."""
    _invalid(_with_op(op), message)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([1, 2], "[index.prompts.p] must be a table with start and stop"),
        ({"stop": 4}, "index.prompts.p.start must be an integer >= 0, got None"),
        ({"start": 4, "stop": 4}, "index.prompts.p.stop must be an integer >= 5, got 4"),
        ({"start": 0, "stop": 4, "replace": [0, 1]}, "entries must be [position, token]"),
        (
            {"start": 0, "stop": 4, "replace": "0=1"},
            "index.prompts.p.replace must be a list of [position, token]",
        ),
        ({"start": 0, "stop": 4, "replace": [[0]]}, "< 4, got [0]"),
        ({"start": 0, "stop": 4, "replace": [[0, 1, 2]]}, "< 4, got [0, 1, 2]"),
        ({"start": 0, "stop": 4, "replace": [[0, "a"]]}, "< 4, got [0, 'a']"),
        ({"start": 0, "stop": 4, "replace": [[True, 1]]}, "< 4, got [True, 1]"),
        ({"start": 0, "stop": 4, "replace": [[4, 1]]}, "< 4, got [4, 1]"),
        ({"start": 0, "stop": 4, "replace": [[-1, 1]]}, "< 4, got [-1, 1]"),
        ({"start": 0, "stop": 4, "replce": []}, "index.prompts.p.replce: unknown key"),
    ],
)
def test_a_bad_prompt_names_its_key(spec: object, message: str) -> None:
    """A prompt must be a table with start < stop; each replacement a pair of ints with
    the position inside the prompt."""
    config = _index_only()
    config["index"]["prompts"]["p"] = spec
    _invalid(config, message)


def test_prompt_replacements_at_the_edges_are_accepted() -> None:
    """Replacements at the first and last position are inside the prompt."""
    config = _index_only([{"op": "free_count", "expect": 3}])
    config["index"]["prompts"]["p"] = {"start": 1, "stop": 5, "replace": [[0, 9], [3, 8]]}
    code, report = _report(config)
    assert code == 0
    assert "  prompt p: tokens 9..12 (4 tokens) with [1] = 2, [2] = 3, [3] = 8\n" in report


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("first_slot", None, "index.first_slot must be an integer >= 0, got None"),
        ("eviction", "", "index.eviction must be a non-empty string, got ''"),
        ("namespace", None, "index.namespace must be a non-empty string, got None"),
        ("hash_unit", 0, "index.hash_unit must be an integer >= 1, got 0"),
        ("capacity", True, "index.capacity must be an integer >= 1, got True"),
        ("ops", {"op": "free_count"}, "[index] needs a non-empty list of [[index.ops]]"),
        ("prompts", {}, "[index.prompts] must define at least one prompt"),
        ("prompts", [], "demo configuration needs a [index.prompts] table"),
    ],
)
def test_a_bad_index_setting_names_its_key(key: str, value: object, message: str) -> None:
    config = _index_only()
    config["index"][key] = value
    _invalid(config, message)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(placement={}), "[placement] must configure at least one policy"),
        (
            lambda c: c["placement"].update(turns=2),
            "[placement.turns] must be a table of parameters",
        ),
        (lambda c: c.pop("placement"), "demo configuration needs a [placement] table"),
        (lambda c: c.pop("prompt"), "demo configuration needs a [prompt] table"),
        (lambda c: c.pop("index"), "demo configuration needs a [index] table"),
        (
            lambda c: c["prompt"].pop("block_size"),
            "prompt.block_size must be an integer >= 1, got None",
        ),
        (
            lambda c: c["prompt"].update(hash_unit=0),
            "prompt.hash_unit must be an integer >= 1, got 0",
        ),
        (
            lambda c: c["prompt"].update(turn_starts=[-1]),
            "prompt.turn_starts must be a list of non-negative integers, got [-1]",
        ),
        (
            lambda c: c["placement"]["interval"].update(evry=5),
            "placement.interval: placement policy 'interval' has no parameter 'evry'",
        ),
        (lambda c: c.update(extra=1), "extra: unknown key (known: prompt, placement, index, "),
        (lambda c: c["prompt"].update(length=0), "prompt.length must be an integer >= 1, got 0"),
        (
            lambda c: c["prompt"].update(branch_points=5),
            "prompt.branch_points must be a list of non-negative integers, got 5",
        ),
    ],
)
def test_a_bad_prompt_or_placement_names_its_key(
    change: Callable[[Config], object], message: str
) -> None:
    config = _index_only()
    change(config)
    _invalid(config, message)


def test_an_unknown_policy_keeps_its_error_class() -> None:
    """An unregistered placement policy is an UnknownPolicyError prefixed with the
    table it came from."""
    config = _index_only()
    config["placement"]["nope"] = {}
    with pytest.raises(UnknownPolicyError, match=r"^placement\.nope: "):
        run_demo(config, io.StringIO())


# --- exactness ---------------------------------------------------------------------------


def _exactness(**table: Any) -> Config:
    """The default configuration with a one-step index and ``table`` over [exactness]."""
    config = _index_only([{"op": "free_count", "expect": 3}])
    config["exactness"] = {**_default()["exactness"], **table}
    return config


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
    after the restore (reference.exactness.play's corruption hook)."""

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


# --- load_config and the command line ------------------------------------------------------


def _toml(config: Config) -> str:
    """A small TOML writer for the configurations used here."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f'"{k}" = {value(x)}' for k, x in v.items()) + "}"
        return str(v)

    def tables(prefix: str, table: dict[str, Any]) -> Iterator[str]:
        plain = {k: v for k, v in table.items() if not isinstance(v, dict) and k != "ops"}
        yield f"[{prefix}]"
        yield from (f'"{k}" = {value(v)}' for k, v in plain.items())
        for k, v in table.items():
            if isinstance(v, dict):
                yield from tables(f'{prefix}."{k}"', v)
        for op in table.get("ops", []):
            yield f"[[{prefix}.ops]]"
            yield from (f'"{k}" = {value(v)}' for k, v in op.items())

    return "\n".join(line for name, t in config.items() for line in tables(name, t)) + "\n"


def test_the_command_exits_1_on_a_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hyckpt demo --config FILE`` prints the whole report to stdout and exits 1 when
    an expected value was not reproduced (0 when it was)."""
    config = _index_only([{"op": "free_count", "expect": 3}])
    path = tmp_path / "demo.toml"
    path.write_text(_toml(config), encoding="utf-8")
    assert load_config(path) == config
    assert main(["demo", "--config", str(path)]) == 0
    assert capsys.readouterr().out == _report(config)[1]
    config["index"]["ops"][0]["expect"] = 2
    path.write_text(_toml(config), encoding="utf-8")
    assert main(["demo", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out.rstrip().endswith(
        "FAILED: 1 of 1 index results differ from the expected values (steps 1)"
    )
    assert err == ""


def test_load_config_checks_everything_run_demo_checks(tmp_path: Path) -> None:
    """``load_config`` refuses what ``run_demo`` would, prefixed with the file name, so the
    command fails before printing anything; a missing file is named with the reason."""
    config = _exactness(checkpoints=[25])
    path = tmp_path / "demo.toml"
    path.write_text(_toml(config), encoding="utf-8")
    with pytest.raises(InvalidConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (
        f"{path}: exactness.checkpoints: 25 must lie in 1..19 (request B continues after it)"
    )
    with pytest.raises(InvalidConfigError) as raised:
        load_config(tmp_path / "missing.toml")
    assert str(raised.value) == (
        f"cannot read demo configuration {str(tmp_path / 'missing.toml')!r}: "
        "No such file or directory"
    )


def test_load_config_reports_the_toml_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[prompt]\nlength = = 3\n", encoding="utf-8")
    with pytest.raises(InvalidConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"demo configuration {str(path)!r} is not valid TOML: ")
    assert "line 2" in str(raised.value)


# --- expectations and models refused up front ---------------------------------------------


def _refused(config: Config) -> str:
    """The message of the configuration error ``config`` raises before any output."""
    buffer = io.StringIO()
    with pytest.raises(InvalidConfigError) as raised:
        run_demo(config, buffer)
    assert buffer.getvalue() == ""
    return str(raised.value)


@pytest.mark.parametrize("kind", ["abort", "publish"])
def test_an_undefined_reservation_name_is_refused(kind: str) -> None:
    """``abort r46`` after ``reserve ... as r64`` (a typo) names no reservation: it is
    refused before output, like an undefined prompt name, instead of being skipped."""
    ops = [
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "r64"},
        {"op": kind, "reservation": "r46"},
    ]
    assert _refused(_index_only(ops)) == (
        "index.ops[1].reservation 'r46' is not the name of an earlier reserve "
        "(names given so far: r64)"
    )


def test_a_reservation_name_must_be_given_before_it_is_used() -> None:
    """A name is bound by the reserve that gives it: an abort before it is refused."""
    ops = [
        {"op": "abort", "reservation": "later"},
        {"op": "reserve", "prompt": "base", "tokens": 16, "name": "later"},
    ]
    assert _refused(_index_only(ops)) == (
        "index.ops[0].reservation 'later' is not the name of an earlier reserve "
        "(names given so far: none)"
    )


@pytest.mark.parametrize(
    ("op", "expect", "wanted"),
    [
        (
            {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64},
            [48],
            "[] (a miss) or [tokens, slot] (a hit)",
        ),
        (
            {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64},
            [48, True],
            "[] (a miss) or [tokens, slot] (a hit)",
        ),
        ({"op": "free_count"}, True, "a count, an integer >= 0"),
        ({"op": "free_count"}, [3, True, "x"], "a count, an integer >= 0"),
        ({"op": "pin", "slot": 4}, "one", "a count, an integer >= 0"),
        (
            {"op": "lookup", "prompt": "base", "minimum": 0, "maximum": 64},
            True,
            "[] (a miss) or [tokens, slot] (a hit)",
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "other"},
            '{ outcome = "reserved", slot }, { outcome = "already-cached", slot, published } '
            'or { outcome = "no-slot" }',
        ),
        ({"op": "pin", "slot": 4}, -1, "a count, an integer >= 0"),
        (
            {"op": "write", "prompt": "base", "tokens": 16},
            [4],
            'the slot written (an integer >= 0), or { outcome = "already-cached", slot, '
            'published } or { outcome = "no-slot" } when nothing was written',
        ),
        (
            {"op": "write", "prompt": "base", "tokens": 16},
            {"outcome": "reserved", "slot": 4},
            'the slot written (an integer >= 0), or { outcome = "already-cached", slot, '
            'published } or { outcome = "no-slot" } when nothing was written',
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "reserved", "slot": 4, "published": False},
            '{ outcome = "reserved", slot }, { outcome = "already-cached", slot, published } '
            'or { outcome = "no-slot" }',
        ),
        (
            {"op": "reserve", "prompt": "base", "tokens": 16},
            {"outcome": "already-cached", "slot": 4, "published": 1},
            '{ outcome = "reserved", slot }, { outcome = "already-cached", slot, published } '
            'or { outcome = "no-slot" }',
        ),
    ],
)
def test_an_expectation_no_operation_can_return_is_refused(
    op: dict[str, Any], expect: object, wanted: str
) -> None:
    """``expect = [48]`` for a lookup or ``expect = true`` for a count is a typo, not a
    miss or a count of 1: it is refused naming the key, so the report never calls it a
    mismatch it is not (``[48]`` used to be reported as "expected miss", ``true`` used
    to match a count of 1)."""
    ops = [{**op, "expect": expect}]
    assert _refused(_index_only(ops)) == (
        f"index.ops[0].expect must be {wanted} for a {op['op']}, got {expect!r}"
    )


def test_publish_expects_a_boolean_and_abort_nothing() -> None:
    reserve = {"op": "reserve", "prompt": "base", "tokens": 16, "name": "r"}
    publish_one = [reserve, {"op": "publish", "reservation": "r", "expect": 1}]
    assert _refused(_index_only(publish_one)) == (
        "index.ops[1].expect must be true or false for a publish, got 1"
    )
    abort = [reserve, {"op": "abort", "reservation": "r", "expect": []}]
    assert _refused(_index_only(abort)).startswith(
        "index.ops[1].expect must be nothing (an abort returns nothing; use expect_error"
    )


def test_expectations_compare_as_json_types() -> None:
    """A count expectation matches the count it names, and the comparison behind it
    tells JSON types apart (``true`` is not ``1``, ``1`` is not ``1.0``) even where
    parsing has not already refused the mismatched type."""
    ops = [*SEED_WRITES[:2], {"op": "free_count", "expect": 1}]
    code, report = _report(_index_only(ops))
    assert _rows(report)[3][1] == "ok" and code == 0
    assert not sim.demo.same_json(True, 1) and not sim.demo.same_json(1, 1.0)


@pytest.mark.parametrize(
    ("layers", "draft_head", "p", "message"),
    [
        (
            ["attn"],
            True,
            12,
            "exactness.layers ['attn'] has no recurrent or sliding-window layer, so a "
            "checkpoint has no state to store; add mamba2, gdn or swa",
        ),
        (
            ["mamba2"],
            False,
            10,
            "exactness.checkpoints [10] are not multiples of block_size 4, so their "
            "checkpoints store a partial KV page, but exactness.layers ['mamba2'] without "
            "a draft head have no KV pages; add attn, set draft_head = true or use "
            "multiples of block_size",
        ),
    ],
)
def test_a_model_that_cannot_store_its_checkpoints_is_refused_up_front(
    layers: list[str], draft_head: bool, p: int, message: str
) -> None:
    """An attention-only model (no recurrent state to store), or a recurrent-only model
    without a draft head at a checkpoint with a partial page (no KV pages), is refused
    naming the key before any output; it used to die mid-report with
    AxisNotConfiguredError after the placement and index sections were printed."""
    config = _exactness(
        layers=layers, draft_head=draft_head, block_size=4, prompt_length=16, checkpoints=[p]
    )
    assert _refused(config) == message


@pytest.mark.parametrize(
    ("layers", "draft_head", "p"),
    [(["mamba2"], False, 8), (["swa"], True, 10), (["gdn"], True, 12)],
)
def test_every_model_the_demo_accepts_is_played_to_a_verdict(
    layers: list[str], draft_head: bool, p: int
) -> None:
    """The boundary of the refusal above: a recurrent-only model at a block boundary,
    and a draft head giving pages to a model without attention, play to OK."""
    config = _exactness(
        layers=layers, draft_head=draft_head, block_size=4, prompt_length=16, checkpoints=[p]
    )
    code, report = _report(config)
    assert code == 0, report
    assert report.endswith("OK: 1 of 1 restores matched a from-scratch prefill bitwise\n")


def test_an_empty_checkpoint_list_is_refused() -> None:
    """``checkpoints = []`` would print "OK: 0 of 0 restores matched": it is refused."""
    assert _refused(_exactness(checkpoints=[])) == (
        "exactness.checkpoints must list at least one position"
    )
