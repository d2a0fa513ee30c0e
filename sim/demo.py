"""``hyckpt demo``: the reference placement policies and checkpoint index, step by step.

The demo reads a configuration (by default the embedded ``sim/default.toml``) and prints

(a) for each placement policy, the positions it captures in each prefill chunk of a
    sample prompt, and their union (DESIGN section 2);
(b) a sequence of index operations (reserve, publish, abort, lookup, pin, unpin) with
    their results, checked against the expected values in the configuration; the DESIGN
    section 3 seed vectors are part of the default sequence;
(c) on the tiny hybrid model (DESIGN section 6), checkpoints captured at a chunk end and
    by the exporter inside a chunk, restored for a request with another successor token
    and checked bitwise against a from-scratch prefill (:mod:`sim.demo_exactness`).

:func:`run_demo` returns 0 when every expected value was reproduced and every restore
matched, else 1. A configuration that cannot be used (an unknown key, a value of the
wrong type, an expectation no operation can return, a reservation name no earlier
reserve gave, a tiny model that cannot store a configured checkpoint) raises
:class:`~reference.errors.InvalidConfigError` before anything is printed.
"""

from __future__ import annotations

import sys
import textwrap
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO, TypeGuard

from reference.api import (
    AlreadyCached,
    CheckpointIndex,
    NoSlot,
    PlacementPolicy,
    PrefillChunk,
    Reservation,
)
from reference.conformance.vectors_replay import same_json
from reference.errors import HyckptError, InvalidConfigError, UnknownPolicyError
from reference.index import make_index
from reference.placement import make_placement
from sim.config_fields import config_int, config_ints, config_str, config_table
from sim.demo_exactness import ExactnessPlan, parse_exactness, show_exactness
from sim.scenarios.schema import suggestion

#: A parsed TOML document.
Config = dict[str, Any]

DEFAULT_CONFIG_RESOURCE = "default.toml"
_WIDTH = 100
_OPS = ("write", "reserve", "publish", "abort", "lookup", "pin", "unpin", "free_count")


# --- configuration ---------------------------------------------------------------------


def load_default_config() -> Config:
    """The embedded default configuration (``sim/default.toml``)."""
    text = resources.files("sim").joinpath(DEFAULT_CONFIG_RESOURCE).read_text(encoding="utf-8")
    return tomllib.loads(text)


def load_config(path: str | Path) -> Config:
    """Read a demo configuration from a TOML file and check it (as :func:`run_demo`
    would, unknown keys included).

    Raises:
        InvalidConfigError: the file cannot be read, is not valid TOML, or its
            configuration is invalid; the message starts with the file name.
    """
    try:
        with open(path, "rb") as handle:
            config = tomllib.load(handle)
    except OSError as error:
        raise InvalidConfigError(
            f"cannot read demo configuration {str(path)!r}: {error.strerror or error}"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidConfigError(
            f"demo configuration {str(path)!r} is not valid TOML: {error}"
        ) from None
    try:
        _prepare(config)
    except HyckptError as error:
        raise InvalidConfigError(f"{path}: {error}") from None
    return config


#: The keys of each table of a demo configuration (``""``: the top level).
_KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "": ("prompt", "placement", "index", "exactness"),
    "prompt": ("length", "block_size", "hash_unit", "chunk_size", "turn_starts", "branch_points"),
    "index": ("capacity", "first_slot", "eviction", "namespace", "hash_unit", "prompts", "ops"),
    "index.prompts.*": ("start", "stop", "replace"),
    "index.ops[]": (
        "op",
        "prompt",
        "tokens",
        "minimum",
        "maximum",
        "slot",
        "reservation",
        "name",
        "expect",
        "expect_error",
        "seed",
    ),
    "exactness": (
        "layers",
        "draft_head",
        "block_size",
        "prompt_length",
        "chunk_size",
        "checkpoints",
    ),
}


def _check_keys(table: object, known: tuple[str, ...], where: str) -> None:
    """An unknown key of ``table`` (at ``where``) is an error with a did-you-mean."""
    if not isinstance(table, Mapping):
        return  # the table's own reader says what it should be
    for key in table:
        if key not in known:
            path = f"{where}.{key}" if where else str(key)
            hint = suggestion(str(key), list(known))
            raise InvalidConfigError(f"{path}: unknown key (known: {', '.join(known)}){hint}")


def _check_known_keys(config: Mapping[str, Any]) -> None:
    for name in ("", "prompt", "index", "exactness"):
        _check_keys(config if not name else config.get(name), _KNOWN_KEYS[name], name)
    index = config.get("index")
    if isinstance(index, Mapping):
        prompts = index.get("prompts")
        if isinstance(prompts, Mapping):
            for name, spec in prompts.items():
                _check_keys(spec, _KNOWN_KEYS["index.prompts.*"], f"index.prompts.{name}")
        ops = index.get("ops")
        if isinstance(ops, list):
            for number, op in enumerate(ops):
                _check_keys(op, _KNOWN_KEYS["index.ops[]"], f"index.ops[{number}]")


def chunk_bounds(length: int, chunk_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each prefill chunk of a ``length``-token prompt, in order."""
    return [(start, min(start + chunk_size, length)) for start in range(0, length, chunk_size)]


@dataclass(frozen=True)
class _Prompt:
    length: int
    block_size: int
    hash_unit: int
    chunk_size: int
    turn_starts: tuple[int, ...]
    branch_points: tuple[int, ...]


@dataclass(frozen=True)
class _Op:
    number: int
    kind: str
    fields: Mapping[str, Any]

    @property
    def has_expect(self) -> bool:
        return "expect" in self.fields or "expect_error" in self.fields

    @property
    def seed(self) -> bool:
        return self.fields.get("seed") is True


@dataclass(frozen=True)
class _IndexPlan:
    capacity: int
    first_slot: int
    eviction: str
    namespace: str
    hash_unit: int
    prompts: Mapping[str, list[int]]
    ops: tuple[_Op, ...]


@dataclass(frozen=True)
class _Plan:
    prompt: _Prompt
    policies: Mapping[str, Mapping[str, Any]]
    index: _IndexPlan
    exactness: ExactnessPlan | None


def _parse_prompt(config: Mapping[str, Any]) -> _Prompt:
    table = config_table(config, "prompt", "prompt")
    prompt = _Prompt(
        length=config_int(table, "length", "prompt", minimum=1),
        block_size=config_int(table, "block_size", "prompt", minimum=1),
        hash_unit=config_int(table, "hash_unit", "prompt", minimum=1),
        chunk_size=config_int(table, "chunk_size", "prompt", minimum=1),
        turn_starts=config_ints(table, "turn_starts", "prompt"),
        branch_points=config_ints(table, "branch_points", "prompt"),
    )
    for name in ("turn_starts", "branch_points"):
        beyond = [p for p in getattr(prompt, name) if p > prompt.length]
        if beyond:
            raise InvalidConfigError(
                f"prompt.{name} {beyond} lie beyond the prompt length {prompt.length}"
            )
    return prompt


def _parse_prompts(table: Mapping[str, Any]) -> dict[str, list[int]]:
    prompts: dict[str, list[int]] = {}
    for name, spec in config_table(table, "prompts", "index.prompts").items():
        where = f"index.prompts.{name}"
        if not isinstance(spec, Mapping):
            raise InvalidConfigError(f"[{where}] must be a table with start and stop")
        start = config_int(spec, "start", where)
        stop = config_int(spec, "stop", where, minimum=start + 1)
        tokens = list(range(start, stop))
        replace = spec.get("replace", [])
        if not isinstance(replace, list):
            raise InvalidConfigError(f"{where}.replace must be a list of [position, token]")
        for pair in replace:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair)
                or not 0 <= pair[0] < len(tokens)
            ):
                raise InvalidConfigError(
                    f"{where}.replace entries must be [position, token] with 0 <= position "
                    f"< {len(tokens)}, got {pair!r}"
                )
            tokens[pair[0]] = pair[1]
        prompts[name] = tokens
    if not prompts:
        raise InvalidConfigError("[index.prompts] must define at least one prompt")
    return prompts


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


_RESERVE_FORMS = '{ outcome = "already-cached", slot, published } or { outcome = "no-slot" }'


def _check_expect(kind: str, expect: object, where: str) -> None:
    """Refuse an ``expect`` that no ``kind`` operation can return (the forms listed in
    ``sim/default.toml``), so a mistyped expectation is an error, not a mismatch."""
    slot = _is_int(expect) and expect >= 0
    if kind == "lookup":
        ok = expect == [] or (
            isinstance(expect, list) and len(expect) == 2 and all(_is_int(v) for v in expect)
        )
        wanted = "[] (a miss) or [tokens, slot] (a hit)"
    elif kind == "reserve":
        ok = isinstance(expect, Mapping) and _is_reserve_outcome(expect)
        wanted = f'{{ outcome = "reserved", slot }}, {_RESERVE_FORMS}'
    elif kind == "publish":
        ok, wanted = isinstance(expect, bool), "true or false"
    elif kind == "abort":
        ok, wanted = False, "nothing (an abort returns nothing; use expect_error for an error)"
    elif kind == "write":
        ok = slot or (
            isinstance(expect, Mapping)
            and expect.get("outcome") != "reserved"
            and _is_reserve_outcome(expect)
        )
        wanted = f"the slot written (an integer >= 0), or {_RESERVE_FORMS} when nothing was written"
    else:  # pin, unpin, free_count
        ok, wanted = slot, "a count, an integer >= 0"
    if not ok:
        raise InvalidConfigError(f"{where}.expect must be {wanted} for a {kind}, got {expect!r}")


def _is_reserve_outcome(expect: Mapping[str, Any]) -> bool:
    outcome = expect.get("outcome")
    if outcome == "reserved":
        return set(expect) == {"outcome", "slot"} and _is_int(expect["slot"])
    if outcome == "already-cached":
        return (
            set(expect) == {"outcome", "slot", "published"}
            and _is_int(expect["slot"])
            and isinstance(expect["published"], bool)
        )
    return dict(expect) == {"outcome": "no-slot"}


def _parse_op(number: int, raw: object, prompts: Mapping[str, list[int]], names: set[str]) -> _Op:
    """One ``[[index.ops]]`` entry; ``names``: reservation names of the earlier reserves
    (a reserve's own ``name`` is added to it)."""
    where = f"index.ops[{number - 1}]"
    if not isinstance(raw, Mapping):
        raise InvalidConfigError(f"{where} must be a table")
    kind = raw.get("op")
    if kind not in _OPS:
        raise InvalidConfigError(f"{where}.op must be one of {', '.join(_OPS)}; got {kind!r}")
    if kind in ("write", "reserve", "lookup"):
        prompt = config_str(raw, "prompt", where)
        if prompt not in prompts:
            raise InvalidConfigError(
                f"{where}.prompt {prompt!r} is not defined under [index.prompts]"
            )
    if kind in ("write", "reserve"):
        config_int(raw, "tokens", where)
    if kind == "lookup":
        config_int(raw, "minimum", where)
        config_int(raw, "maximum", where)
    if kind in ("pin", "unpin"):
        config_int(raw, "slot", where)
    if kind in ("publish", "abort"):
        name = config_str(raw, "reservation", where)
        if name not in names:
            raise InvalidConfigError(
                f"{where}.reservation {name!r} is not the name of an earlier reserve "
                f"(names given so far: {', '.join(sorted(names)) or 'none'})"
            )
    if "name" in raw:
        if kind != "reserve":
            raise InvalidConfigError(f"{where}: only a reserve can be given a name")
        names.add(config_str(raw, "name", where))
    if "expect_error" in raw:
        config_str(raw, "expect_error", where)
        if "expect" in raw:
            raise InvalidConfigError(f"{where} has both expect and expect_error")
    if "expect" in raw:
        _check_expect(kind, raw["expect"], where)
    return _Op(number=number, kind=kind, fields=raw)


def _parse_index(config: Mapping[str, Any]) -> _IndexPlan:
    table = config_table(config, "index", "index")
    prompts = _parse_prompts(table)
    raw_ops = table.get("ops")
    if not isinstance(raw_ops, list) or not raw_ops:
        raise InvalidConfigError("[index] needs a non-empty list of [[index.ops]]")
    names: set[str] = set()
    return _IndexPlan(
        capacity=config_int(table, "capacity", "index", minimum=1),
        first_slot=config_int(table, "first_slot", "index"),
        eviction=config_str(table, "eviction", "index"),
        namespace=config_str(table, "namespace", "index"),
        hash_unit=config_int(table, "hash_unit", "index", minimum=1),
        prompts=prompts,
        ops=tuple(_parse_op(number, raw, prompts, names) for number, raw in enumerate(raw_ops, 1)),
    )


def _parse(config: Mapping[str, Any]) -> _Plan:
    _check_known_keys(config)
    prompt = _parse_prompt(config)
    policies = config_table(config, "placement", "placement")
    if not policies:
        raise InvalidConfigError("[placement] must configure at least one policy")
    for name, params in policies.items():
        if not isinstance(params, Mapping):
            raise InvalidConfigError(f"[placement.{name}] must be a table of parameters")
    return _Plan(
        prompt=prompt,
        policies=policies,
        index=_parse_index(config),
        exactness=parse_exactness(config),
    )


# --- placement -------------------------------------------------------------------------


def _format_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_format_value(item) for item in value) + "]"
    return str(value)


def _positions_text(positions: Sequence[int]) -> str:
    return ", ".join(str(p) for p in positions) if positions else "-"


def _wrapped(label: str, text: str, indent: int) -> str:
    return textwrap.fill(
        text,
        width=_WIDTH,
        initial_indent=f"{label:<{indent}}",
        subsequent_indent=" " * indent,
        break_on_hyphens=False,
    )


def _show_placement(plan: _Plan, policies: Mapping[str, PlacementPolicy], out: TextIO) -> None:
    prompt = plan.prompt
    chunks = chunk_bounds(prompt.length, prompt.chunk_size)
    digits = len(str(prompt.length))
    print(
        f"Placement (DESIGN section 2): positions captured in each prefill chunk of a "
        f"{prompt.length}-token prompt",
        file=out,
    )
    print(
        f"  block size {prompt.block_size}, hash unit {prompt.hash_unit}, "
        f"{len(chunks)} chunks of up to {prompt.chunk_size} tokens",
        file=out,
    )
    print(
        f"  user turns start at {_positions_text(prompt.turn_starts)}; "
        f"branch points {_positions_text(prompt.branch_points)}",
        file=out,
    )
    label_width = 4 + len("chunk [") + 2 * digits + len(", )") + 2
    for name, params in plan.policies.items():
        policy = policies[name]
        settings = " ".join(f"{key}={_format_value(value)}" for key, value in params.items())
        print(file=out)
        print(f"{name:<12} {settings}".rstrip(), file=out)
        captured: set[int] = set()
        for start, end in chunks:
            chunk = PrefillChunk(
                start, end, prompt.length, prompt.turn_starts, prompt.branch_points
            )
            positions = tuple(policy.positions(chunk))
            captured.update(positions)
            label = f"    chunk [{start:>{digits}}, {end:>{digits}})"
            print(_wrapped(label, _positions_text(positions), label_width), file=out)
        union = sorted(captured)
        print(_wrapped(f"    all ({len(union)})", _positions_text(union), label_width), file=out)


# --- index -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Result:
    """What an operation returned: ``value`` is compared with ``expect``, ``text`` shown."""

    value: object
    text: str
    #: The class names of a HyckptError raised, outermost first; "" when the operation
    #: could not be played (no open reservation of that name): a failed check either way.
    error: str | None = None


def _reserve_result(outcome: object) -> _Result:
    if isinstance(outcome, Reservation):
        return _Result(
            {"outcome": "reserved", "slot": outcome.slot}, f"reserved slot {outcome.slot}"
        )
    if isinstance(outcome, AlreadyCached):
        state = "published" if outcome.published else "being written"
        return _Result(
            {"outcome": "already-cached", "slot": outcome.slot, "published": outcome.published},
            f"already cached in slot {outcome.slot} ({state})",
        )
    if isinstance(outcome, NoSlot):
        return _Result({"outcome": "no-slot"}, f"no slot ({outcome.reason})")
    return _Result(outcome, f"unexpected outcome {outcome!r}")


def _expected_text(op: _Op) -> str:
    if "expect_error" in op.fields:
        return f"raises {op.fields['expect_error']}"
    expect = op.fields["expect"]
    if op.kind == "lookup" and isinstance(expect, list):
        return f"hit ({expect[0]}, {expect[1]})" if len(expect) == 2 else "miss"
    if op.kind == "write" and isinstance(expect, int):
        return f"published in slot {expect}"
    if op.kind == "reserve" and isinstance(expect, Mapping):
        outcome = expect.get("outcome")
        if outcome == "reserved":
            return f"reserved slot {expect.get('slot')}"
        if outcome == "already-cached":
            state = "published" if expect.get("published") else "being written"
            return f"already cached in slot {expect.get('slot')} ({state})"
        if outcome == "no-slot":
            return "no slot"
    if op.kind in ("pin", "unpin") and isinstance(expect, int):
        return f"pins = {expect}"
    if op.kind == "free_count" and isinstance(expect, int):
        return f"{expect} free"
    return _format_value(expect)


def _describe(op: _Op) -> str:
    f = op.fields
    if op.kind in ("write", "reserve"):
        text = f"{op.kind} {f['prompt']}[:{f['tokens']}]"
        return f"{text} as {f['name']}" if "name" in f else text
    if op.kind == "lookup":
        return f"lookup {f['prompt']}, {f['minimum']} < tokens <= {f['maximum']}"
    if op.kind in ("publish", "abort"):
        return f"{op.kind} {f['reservation']}"
    if op.kind in ("pin", "unpin"):
        return f"{op.kind} slot {f['slot']}"
    return op.kind


class _Player:
    def __init__(self, plan: _IndexPlan) -> None:
        self.plan = plan
        self.index: CheckpointIndex = make_index(
            plan.capacity,
            first_slot=plan.first_slot,
            eviction=plan.eviction,
            hash_unit=plan.hash_unit,
        )
        self.reservations: dict[str, Reservation] = {}

    def play(self, op: _Op) -> _Result:
        try:
            return self._play(op)
        except HyckptError as error:
            names = " ".join(cls.__name__ for cls in type(error).__mro__)
            return _Result(None, f"raised {type(error).__name__}: {error}", error=names)

    def _reservation(self, name: str) -> Reservation | None:
        return self.reservations.get(name)

    def _play(self, op: _Op) -> _Result:
        f, index, namespace = op.fields, self.index, self.plan.namespace
        if op.kind in ("write", "reserve"):
            prompt = self.plan.prompts[f["prompt"]]
            outcome = index.reserve(namespace, prompt, f["tokens"])
            if op.kind == "reserve":
                if isinstance(outcome, Reservation) and "name" in f:
                    self.reservations[f["name"]] = outcome
                return _reserve_result(outcome)
            if not isinstance(outcome, Reservation):
                result = _reserve_result(outcome)
                return _Result(result.value, f"reserve gave {result.text}, nothing written")
            if index.publish(outcome):
                return _Result(outcome.slot, f"published in slot {outcome.slot}")
            return _Result(None, f"reserved slot {outcome.slot} but publish returned False")
        if op.kind in ("publish", "abort"):
            reservation = self._reservation(f["reservation"])
            if reservation is None:  # its reserve found the key cached, or no slot
                return _Result(None, f"no open reservation named {f['reservation']!r}", error="")
            if op.kind == "abort":
                index.abort(reservation)
                return _Result(None, f"slot {reservation.slot} returned to the free list")
            published = index.publish(reservation)
            return _Result(published, "published" if published else "not published")
        if op.kind == "lookup":
            prompt = self.plan.prompts[f["prompt"]]
            hit = index.lookup(namespace, prompt, f["minimum"], f["maximum"])
            if hit is None:
                return _Result([], "miss")
            return _Result([hit.tokens, hit.slot], f"hit ({hit.tokens}, {hit.slot})")
        if op.kind in ("pin", "unpin"):
            count = index.pin(f["slot"]) if op.kind == "pin" else index.unpin(f["slot"])
            return _Result(count, f"pins = {count}")
        free = index.free_count()
        return _Result(free, f"{free} free")


def _matches(op: _Op, result: _Result) -> bool:
    if "expect_error" in op.fields:
        return result.error is not None and op.fields["expect_error"] in result.error.split()
    if result.error is not None:
        return False
    return "expect" not in op.fields or same_json(result.value, op.fields["expect"])


def _show_index(player: _Player, out: TextIO) -> tuple[int, list[int], list[str]]:
    """Play the operations; return (checked, failed step numbers, seed results)."""
    plan = player.plan
    print(
        f"Index (DESIGN section 3): capacity {plan.capacity} from slot {plan.first_slot}, "
        f"eviction {plan.eviction}, namespace {plan.namespace!r}, hash unit {plan.hash_unit}",
        file=out,
    )
    for name, tokens in plan.prompts.items():
        print(f"  prompt {name}: {_prompt_text(tokens)}", file=out)
    print(file=out)
    rows: list[tuple[str, str, str, str]] = [("#", "operation", "check", "result")]
    checked, failed, seeds = 0, [], []
    for op in plan.ops:
        result = player.play(op)
        check, text = "-", result.text
        if op.has_expect or result.error is not None:
            checked += 1
            if _matches(op, result):
                check = "ok, seed" if op.seed else "ok"
                if op.seed:
                    seeds.append(_seed_text(op, result))
            else:
                failed.append(op.number)
                check = "MISMATCH"
                expected = _expected_text(op) if op.has_expect else "no error"
                text = f"{text}; expected {expected}"
        rows.append((str(op.number), _describe(op), check, text))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for number, description, check, text in rows:
        label = f"  {number:>{widths[0]}}  {description:<{widths[1]}}  {check:<{widths[2]}}  "
        print(_wrapped(label, text, len(label)), file=out)
    return checked, failed, seeds


def _seed_text(op: _Op, result: _Result) -> str:
    f = op.fields
    if op.kind == "lookup" and isinstance(result.value, list) and len(result.value) == 2:
        tokens, slot = result.value
        return f"{f['prompt']} ({f['minimum']}, {f['maximum']}] -> ({tokens}, {slot})"
    return f"{_describe(op)} -> {result.text}"


def _prompt_text(tokens: Sequence[int]) -> str:
    """``0..63`` for a range, with the positions that differ from it listed."""
    base = list(range(tokens[0], tokens[0] + len(tokens)))
    changed = [f"[{i}] = {t}" for i, (t, b) in enumerate(zip(tokens, base, strict=True)) if t != b]
    text = f"tokens {tokens[0]}..{tokens[0] + len(tokens) - 1} ({len(tokens)} tokens)"
    return f"{text} with {', '.join(changed)}" if changed else text


# --- entry point -----------------------------------------------------------------------


def _prepare(config: Mapping[str, Any]) -> tuple[_Plan, dict[str, PlacementPolicy], _Player]:
    """Parse ``config`` and build its policies and index: everything that can fail
    before the demo prints anything."""
    plan = _parse(config)
    policies: dict[str, PlacementPolicy] = {}
    where = ""
    try:
        for name, params in plan.policies.items():
            where = f"placement.{name}"
            policies[name] = make_placement(name, **params)
        where = "index"
        player = _Player(plan.index)
    except (InvalidConfigError, UnknownPolicyError) as error:
        raise type(error)(f"{where}: {error}") from None
    return plan, policies, player


def run_demo(config: Mapping[str, Any] | None = None, out: TextIO | None = None) -> int:
    """Print the placement and index report for ``config``; 0 if all expectations held.

    Args:
        config: a parsed configuration shaped like ``sim/default.toml``; ``None`` uses
            the embedded default.
        out: where to write the report; ``None`` means ``sys.stdout`` at call time.

    Returns:
        0 when every operation with an ``expect`` (or ``expect_error``) produced it,
        1 otherwise.

    Raises:
        InvalidConfigError: ``config`` is malformed, or a placement policy or the index
            rejected its parameters (raised before any output).
        UnknownPolicyError: a placement or eviction policy name is not registered.
    """
    stream = sys.stdout if out is None else out
    plan, policies, player = _prepare(load_default_config() if config is None else config)
    print("hyckpt demo: reference placement policies and checkpoint index", file=stream)
    print("=" * 62, file=stream)
    print(file=stream)
    _show_placement(plan, policies, stream)
    print(file=stream)
    checked, failed, seeds = _show_index(player, stream)
    print(file=stream)
    ok = not failed
    if failed:
        steps = ", ".join(str(n) for n in failed)
        print(
            f"FAILED: {len(failed)} of {checked} index results differ from the expected "
            f"values (steps {steps})",
            file=stream,
        )
    else:
        seed_text = f", seed vectors included ({'; '.join(seeds)})" if seeds else ""
        print(f"OK: all {checked} expected index results reproduced{seed_text}", file=stream)
    if plan.exactness is not None:
        print(file=stream)
        ok = show_exactness(plan.exactness, stream) and ok
    return 0 if ok else 1
