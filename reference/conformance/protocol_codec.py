"""JSON encodings of hyckpt's value types for the stdio protocol (docs/PROTOCOL.md §4).

Two directions, two disciplines:

- ``encode_*`` turn reference values into JSON values; ``decode_*`` read what a *server*
  answered and are strict: anything malformed is a
  :class:`~reference.conformance.protocol.ProtocolError`.
- ``*_arg`` read what a *client* sent as an argument and are lenient: a well-formed
  encoding becomes the reference type, anything else is passed on unchanged, so that the
  implementation itself rejects it with its own typed error (a cost of ``24`` reaches the
  index as ``24`` and raises the index's ``InvalidConfigError``, as in Python).

Units: token counts and positions in tokens, slots as integer indices, bytes in bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reference.api import (
    AlreadyCached,
    CheckpointKey,
    EntryCost,
    LookupHit,
    NoSlot,
    PrefillChunk,
    Reservation,
    ReserveOutcome,
    SlotState,
)
from reference.conformance.protocol import NONFINITE, ProtocolError
from reference.hashing import HashedPrompt


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need_int(what: str, value: object) -> int:
    if not _is_int(value):
        raise ProtocolError(f"{what} must be an integer, got {value!r:.80}")
    assert isinstance(value, int)
    return value


def _need_object(what: str, value: object, fields: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict) or not set(fields) <= set(value):
        raise ProtocolError(f"{what} must be an object with {list(fields)}, got {value!r:.200}")
    return value


# --- generic ------------------------------------------------------------------------


def jsonable(value: object) -> Any:
    """``value`` as plain JSON data, for arguments a client sends.

    Tuples and other sequences become arrays, mappings objects (keys as strings), a
    non-finite float the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, and
    anything JSON cannot carry (bytes, objects) its ``repr`` as a string: the server then
    rejects it with the implementation's typed error, as Python would.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | range):
        return [jsonable(item) for item in value]
    return repr(value)


def number_arg(value: object) -> object:
    """A number argument: the strings of :data:`~reference.conformance.protocol.NONFINITE`
    become floats."""
    if isinstance(value, str) and value in NONFINITE:
        return NONFINITE[value]
    return value


def params_arg(value: object, what: str = "params") -> dict[str, object]:
    """Keyword parameters (of a policy): a JSON object; non-finite strings become floats."""
    if not isinstance(value, dict):
        raise ProtocolError(
            f"{what} must be a JSON object of keyword parameters, got {value!r:.80}"
        )
    return {key: number_arg(item) for key, item in value.items()}


# --- placement ----------------------------------------------------------------------


def encode_chunk(chunk: PrefillChunk) -> dict[str, Any]:
    """``{"start", "end", "prompt_len", "turn_starts", "branch_points"}`` (tokens)."""
    return {
        "start": chunk.start,
        "end": chunk.end,
        "prompt_len": chunk.prompt_len,
        "turn_starts": list(chunk.turn_starts),
        "branch_points": list(chunk.branch_points),
    }


def chunk_arg(value: object) -> PrefillChunk:
    """A chunk argument. The hints may be left out (no hints).

    Raises:
        ProtocolError: not an object with ``start``, ``end`` and ``prompt_len``.
        InvalidTokenCountError: the chunk itself is malformed (``PrefillChunk`` checks it).
    """
    fields = _need_object("chunk", value, ("start", "end", "prompt_len"))
    extra = set(fields) - {"start", "end", "prompt_len", "turn_starts", "branch_points"}
    if extra:
        raise ProtocolError(f"chunk has unknown field(s) {sorted(extra)}")
    return PrefillChunk(
        fields["start"],
        fields["end"],
        fields["prompt_len"],
        fields.get("turn_starts", []),
        fields.get("branch_points", []),
    )


def decode_positions(value: object) -> tuple[int, ...]:
    """A ``placement.positions`` result: an array of integer positions (tokens)."""
    if not isinstance(value, list):
        raise ProtocolError(f"positions must be an array of integers, got {value!r:.80}")
    return tuple(_need_int("a position", p) for p in value)


# --- prompts and keys ---------------------------------------------------------------


def encode_prompt(prompt: object) -> Any:
    """A prompt: an array of token ids, or for a :class:`HashedPrompt`
    ``{"tokens": [...], "namespace": str, "extras": [str], "unit": int}``."""
    if isinstance(prompt, HashedPrompt):
        return {
            "tokens": prompt.tokens(),
            "namespace": prompt.namespace,
            "extras": jsonable(prompt.extras),
            "unit": prompt.unit,
        }
    if isinstance(prompt, list):
        return prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, str | bytes):
        return list(prompt)
    return jsonable(prompt)


def prompt_arg(value: object) -> object:
    """A prompt argument: an array stays a list of token ids (the index checks them); a
    hashed-prompt object becomes a :class:`HashedPrompt`; anything else passes unchanged.

    Raises:
        InvalidConfigError, InvalidTokenCountError: building the ``HashedPrompt`` failed.
    """
    if isinstance(value, dict) and set(value) == {"tokens", "namespace", "extras", "unit"}:
        extras = value["extras"]
        return HashedPrompt(
            value["tokens"],
            namespace=value["namespace"],
            extras=tuple(extras) if isinstance(extras, list) else extras,
            unit=value["unit"],
        )
    return value


def extras_arg(value: object) -> object:
    """Extras: an array of strings becomes a tuple; anything else passes unchanged."""
    return tuple(value) if isinstance(value, list) else value


def encode_key(key: CheckpointKey) -> dict[str, Any]:
    """``{"namespace": str, "extras": [str], "digest": lowercase hex, "tokens": int}``."""
    return {
        "namespace": key.namespace,
        "extras": list(key.extras),
        "digest": key.digest.hex(),
        "tokens": key.tokens,
    }


def _key_or_none(value: object) -> CheckpointKey | None:
    if not isinstance(value, dict) or set(value) != {"namespace", "extras", "digest", "tokens"}:
        return None
    namespace, extras, digest, tokens = (
        value["namespace"],
        value["extras"],
        value["digest"],
        value["tokens"],
    )
    if not isinstance(namespace, str) or not _is_int(tokens) or not isinstance(digest, str):
        return None
    if not isinstance(extras, list) or not all(isinstance(x, str) for x in extras):
        return None
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return None
    return CheckpointKey(namespace, tuple(extras), raw, tokens)


def decode_key(value: object) -> CheckpointKey:
    """A key a server sent. Raises :class:`ProtocolError` if it is not one."""
    key = _key_or_none(value)
    if key is None:
        raise ProtocolError(
            "a key must be {'namespace': str, 'extras': [str], 'digest': hex str, "
            f"'tokens': int}}, got {value!r:.200}"
        )
    return key


def key_arg(value: object) -> object:
    """A key argument: a well-formed key object becomes a :class:`CheckpointKey`, anything
    else passes unchanged (``invalidate`` rejects it)."""
    key = _key_or_none(value)
    return value if key is None else key


# --- costs --------------------------------------------------------------------------


def encode_cost(cost: object) -> Any:
    """``{"tokens": int, "bytes": int, "flops_saved": number}``; ``None`` → ``null``;
    a non-finite ``flops_saved`` as a string of
    :data:`~reference.conformance.protocol.NONFINITE`."""
    if isinstance(cost, EntryCost):
        return {
            "tokens": jsonable(cost.tokens),
            "bytes": jsonable(cost.bytes),
            "flops_saved": jsonable(cost.flops_saved),
        }
    return jsonable(cost)


def cost_arg(value: object) -> object:
    """A cost argument: an object with ``tokens`` (and optionally ``bytes``,
    ``flops_saved``) becomes an :class:`EntryCost` with the values as sent (the index
    checks them); anything else passes unchanged."""
    if (
        isinstance(value, dict)
        and "tokens" in value
        and set(value)
        <= {
            "tokens",
            "bytes",
            "flops_saved",
        }
    ):
        return EntryCost(
            tokens=value["tokens"],
            bytes=value.get("bytes", 1),
            flops_saved=number_arg(value.get("flops_saved", 0.0)),  # type: ignore[arg-type]
        )
    return value


# --- lookup hits, reserve outcomes, slot states -------------------------------------


def encode_hit(hit: LookupHit | None) -> dict[str, int] | None:
    """``{"tokens": int, "slot": int}``, or ``null`` for no hit."""
    return None if hit is None else {"tokens": hit.tokens, "slot": hit.slot}


def decode_hit(value: object) -> LookupHit | None:
    """A lookup result a server sent."""
    if value is None:
        return None
    fields = _need_object("a lookup hit", value, ("tokens", "slot"))
    return LookupHit(
        _need_int("hit tokens", fields["tokens"]), _need_int("hit slot", fields["slot"])
    )


def encode_outcome(outcome: ReserveOutcome, handle: int | None = None) -> dict[str, Any]:
    """A reserve outcome, tagged by ``"type"``:

    - ``{"type": "reservation", "reservation": handle, "slot": int, "key": KEY}``
    - ``{"type": "already_cached", "slot": int, "published": bool}``
    - ``{"type": "no_slot", "reason": str}``
    """
    if isinstance(outcome, Reservation):
        if handle is None:
            raise ValueError("a reservation needs its handle to go on the wire")
        return {
            "type": "reservation",
            "reservation": handle,
            "slot": outcome.slot,
            "key": encode_key(outcome.key),
        }
    if isinstance(outcome, AlreadyCached):
        return {"type": "already_cached", "slot": outcome.slot, "published": outcome.published}
    if isinstance(outcome, NoSlot):
        return {"type": "no_slot", "reason": outcome.reason}
    raise TypeError(f"not a reserve outcome: {outcome!r}")


#: Builds the client's reservation handle from ``(handle, key, slot)``.
ReservationFactory = Callable[[int, CheckpointKey, int], Reservation]


def decode_outcome(value: object, make_reservation: ReservationFactory) -> ReserveOutcome:
    """A reserve outcome a server sent; a reservation is built by ``make_reservation``."""
    fields = _need_object("a reserve outcome", value, ("type",))
    kind = fields["type"]
    if kind == "reservation":
        _need_object("a reservation", fields, ("reservation", "slot", "key"))
        return make_reservation(
            _need_int("reservation handle", fields["reservation"]),
            decode_key(fields["key"]),
            _need_int("reservation slot", fields["slot"]),
        )
    if kind == "already_cached":
        _need_object("already_cached", fields, ("slot", "published"))
        if not isinstance(fields["published"], bool):
            raise ProtocolError(f"'published' must be true or false, got {fields['published']!r}")
        return AlreadyCached(_need_int("slot", fields["slot"]), fields["published"])
    if kind == "no_slot":
        _need_object("no_slot", fields, ("reason",))
        if not isinstance(fields["reason"], str):
            raise ProtocolError(f"'reason' must be a string, got {fields['reason']!r}")
        return NoSlot(fields["reason"])
    raise ProtocolError(
        f"unknown reserve outcome type {kind!r}; expected reservation, already_cached or no_slot"
    )


def encode_slot_state(state: SlotState) -> str:
    """``"free"``, ``"reserved"``, ``"published"`` or ``"doomed"``."""
    return state.value


def decode_slot_state(value: object) -> SlotState:
    """A slot state a server sent."""
    try:
        return SlotState(value)
    except ValueError:
        known = ", ".join(s.value for s in SlotState)
        raise ProtocolError(f"unknown slot state {value!r}; expected one of {known}") from None


def decode_bool(what: str, value: object) -> bool:
    """A boolean result a server sent."""
    if not isinstance(value, bool):
        raise ProtocolError(f"{what} must be true or false, got {value!r:.80}")
    return value


def decode_int(what: str, value: object) -> int:
    """An integer result a server sent."""
    return _need_int(what, value)
