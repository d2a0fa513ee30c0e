"""``hyckpt demo`` configuration errors: a bad operation, prompt, index setting or
placement names its key before anything is printed; ``load_config`` checks everything
``run_demo`` checks and reports TOML errors; the command exits 1 on a mismatch; and
expectations no operation can return, undefined reservation names and models that cannot
store their checkpoints are refused up front."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sim.demo
import sim.demo_exactness
from reference.errors import InvalidConfigError, UnknownPolicyError
from sim.cli import main
from sim.demo import load_config, run_demo
from tests.cli._demo_helpers import (
    SEED_WRITES,
    Config,
    _exactness,
    _index_only,
    _invalid,
    _report,
    _rows,
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
