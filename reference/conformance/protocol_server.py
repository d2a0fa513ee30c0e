"""Serve an implementation's placement policies and index over the stdio protocol.

``python -m reference.conformance.protocol_server [--impl module:factory]`` (or ``hyckpt
serve-protocol``) reads one request per line on stdin and writes one response per line
on stdout (docs/PROTOCOL.md). Without ``--impl`` it serves the reference; any Python
:class:`~reference.api.Implementation` can be served, which is how the tests build
deliberately wrong servers.

:class:`Session` is the dispatcher, usable in-process: the vector replayer runs it
directly against a Python implementation, and the vector generator records the
reference's answers through it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, TextIO

from reference import eviction as reference_eviction
from reference import index as reference_index
from reference import placement as reference_placement
from reference.api import (
    CheckpointIndex,
    Implementation,
    PlacementPolicy,
    PrefillChunk,
    Reservation,
    ReservationState,
    check_count,
)
from reference.conformance.protocol import (
    ALL_OPS,
    INDEX_CAPABILITIES,
    NOT_SERVED_CAPABILITIES,
    PROTOCOL_VERSION,
    ProtocolError,
    check_args,
    error_line,
    error_name,
    ok_line,
    parse_request,
)
from reference.conformance.protocol_codec import (
    chunk_arg,
    cost_arg,
    encode_hit,
    encode_key,
    encode_outcome,
    encode_slot_state,
    extras_arg,
    key_arg,
    params_arg,
    prompt_arg,
)
from reference.errors import AllocationTooLargeError, ForeignReservationError, HyckptError

#: Placement policies kept built, by (name, parameters); older ones are dropped.
_POLICY_CACHE_SIZE = 64
#: Most slots an ``index.new`` may ask for: 2**22 (4,194,304), far beyond any checkpoint
#: pool, and about 0.2 GB for the reference index (a few Python objects per slot).
MAX_CAPACITY = 2**22
#: Longest prompt, in tokens, a placement request may describe (``chunk.prompt_len`` and
#: each ``seq_lens`` entry): 2**22 (4,194,304), beyond any model's context. An answer then
#: lists at most that many positions; a policy may build its whole target set first.
MAX_PROMPT_TOKENS = 2**22


def reference_implementation() -> Implementation:
    """The reference's placement and index, without storage (which is not served).

    Importing it does not import torch, so a server starts in a fraction of a second.
    """
    return Implementation(
        name="reference",
        make_placement=reference_placement.make_placement,
        make_index=reference_index.make_index,
        placement_policies=frozenset(reference_placement.POLICIES),
        eviction_policies=frozenset(reference_eviction.POLICIES),
        capabilities=INDEX_CAPABILITIES,
    )


class _Args:
    """The ``args`` object of one request (already checked by
    :func:`~reference.conformance.protocol.check_args`), with the operation's name for messages."""

    def __init__(self, op: str, args: dict[str, Any]) -> None:
        self.op, self.args = op, args

    def get(self, name: str, default: object = None) -> Any:
        return self.args.get(name, default)

    def has(self, name: str) -> bool:
        return name in self.args

    def handle(self, name: str) -> int:
        value = self.args.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{self.op}: {name!r} must be an integer handle, got {value!r:.80}")
        return value


class Session:
    """The state of one connection: index handles and reservation handles.

    Args:
        implementation: what to serve; its storage and exporter are not used.
    """

    def __init__(self, implementation: Implementation) -> None:
        self.implementation = implementation
        self._next_handle = 1
        self._indexes: dict[int, CheckpointIndex] = {}
        #: every reservation handed out, by handle, with the handle of its index
        self._reservations: dict[int, tuple[int, Reservation]] = {}
        #: per index: handles of reservations still open (to report cancellations)
        self._open: dict[int, dict[int, Reservation]] = {}
        self._policies: dict[str, PlacementPolicy] = {}
        self._ops: dict[str, Callable[[_Args], object]] = {
            "hello": self._hello,
            "placement.check": self._placement_check,
            "placement.positions": self._placement_positions,
            "placement.vllm_align_batch": self._vllm_align_batch,
            "index.new": self._index_new,
            "index.drop": self._index_drop,
            "index.make_key": self._make_key,
            "index.lookup": self._lookup,
            "index.reserve": self._reserve,
            "index.publish": self._publish,
            "index.abort": self._abort,
            "index.pin": lambda a: self._index(a).pin(a.get("slot")),
            "index.unpin": lambda a: self._index(a).unpin(a.get("slot")),
            "index.pins": lambda a: self._index(a).pins(a.get("slot")),
            "index.slot_state": lambda a: encode_slot_state(
                self._index(a).slot_state(a.get("slot"))
            ),
            "index.invalidate": self._invalidate,
            "index.clear": self._clear,
            "index.free_count": lambda a: self._index(a).free_count(),
        }
        assert set(self._ops) == set(ALL_OPS)

    # --- entry points -------------------------------------------------------------------

    def execute(self, op: str, args: dict[str, Any]) -> object:
        """Run one operation and return its JSON result.

        Raises:
            ProtocolError: unknown operation, missing or unknown argument, bad handle.
            HyckptError: whatever the implementation raised.
        """
        check_args(op, args)
        return self._ops[op](_Args(op, args))

    def handle_line(self, line: str | bytes) -> str:
        """Answer one request line with one response line (neither ends in ``\\n``)."""
        try:
            request = parse_request(line)
        except ProtocolError as error:
            request_id = error.request_id
            return error_line(
                request_id if isinstance(request_id, int) else None, "ProtocolError", str(error)
            )
        except Exception as error:  # a line the parser could not even read: answer, go on
            return error_line(None, "ProtocolError", f"unreadable request line: {error!r:.200}")
        try:
            result = self.execute(request.op, request.args)
            return ok_line(request.id, result)
        except MemoryError:  # a size no limit below caught: still a typed answer
            return error_line(
                request.id,
                AllocationTooLargeError.__name__,
                f"{request.op}: the server ran out of memory answering it; ask for less "
                f"(index.new capacity <= {MAX_CAPACITY} slots, prompts <= "
                f"{MAX_PROMPT_TOKENS} tokens)",
            )
        except Exception as error:  # every failure becomes a response; the server goes on
            return error_line(request.id, error_name(error), str(error))

    # --- hello and placement --------------------------------------------------------------

    def _hello(self, args: _Args) -> object:
        impl = self.implementation
        return {
            "version": PROTOCOL_VERSION,
            "name": impl.name,
            "capabilities": sorted(impl.capabilities - NOT_SERVED_CAPABILITIES),
            "placement_policies": sorted(impl.placement_policies),
            "eviction_policies": sorted(impl.eviction_policies),
            "ops": list(ALL_OPS),
        }

    def _policy(self, name: object, params: object) -> PlacementPolicy:
        decoded = params_arg(params)
        cache_key = json.dumps([name, params], sort_keys=True)
        policy = self._policies.get(cache_key)
        if policy is None:
            policy = self.implementation.make_placement(name, **decoded)
            if len(self._policies) >= _POLICY_CACHE_SIZE:
                self._policies.pop(next(iter(self._policies)))
            self._policies[cache_key] = policy
        return policy

    def _placement_check(self, args: _Args) -> object:
        self._policy(args.get("policy"), args.get("params", {}))
        return None

    def _placement_positions(self, args: _Args) -> object:
        policy = self._policy(args.get("policy"), args.get("params", {}))
        chunk = chunk_arg(args.get("chunk"))
        _check_prompt_len(args.op, "chunk.prompt_len", chunk.prompt_len)
        return list(policy.positions(chunk))

    def _vllm_align_batch(self, args: _Args) -> object:
        params = args.get("params")
        policy = self._policy("vllm-align", params)
        seq_lens, query_lens = args.get("seq_lens"), args.get("query_lens")
        for name, value in (("seq_lens", seq_lens), ("query_lens", query_lens)):
            if not isinstance(value, list):
                raise ProtocolError(f"{name} must be an array of token counts, got {value!r:.80}")
        for row, seq_len in enumerate(seq_lens):
            _check_prompt_len(args.op, f"seq_lens[{row}]", seq_len)
        if isinstance(policy, reference_placement.VllmAlign):
            offsets, columns = reference_placement.vllm_align_batch(seq_lens, query_lens, policy)
        else:
            offsets, columns = _batch_from_positions(
                policy, params_arg(params).get("block_size"), seq_lens, query_lens
            )
        return {"offsets": offsets, "columns": columns}

    # --- index ----------------------------------------------------------------------------

    def _new_handle(self) -> int:
        handle = self._next_handle
        self._next_handle += 1
        return handle

    def _index(self, args: _Args) -> CheckpointIndex:
        handle = args.handle("index")
        index = self._indexes.get(handle)
        if index is None:
            raise ProtocolError(f"{args.op}: no index has handle {handle} (dropped, or never made)")
        return index

    def _index_new(self, args: _Args) -> object:
        capacity = args.get("capacity")
        if _is_int(capacity) and capacity > MAX_CAPACITY:
            raise AllocationTooLargeError(
                f"index.new: capacity={capacity} is more than the {MAX_CAPACITY} slots this "
                "server allocates for one index; pass a smaller capacity (size it from the "
                "checkpoint byte budget with capacity_for_budget)"
            )
        options: dict[str, Any] = {}
        for name in ("first_slot", "eviction", "hash_unit", "bytes_per_slot"):
            if args.has(name):
                options[name] = args.get(name)
        params = params_arg(args.get("params", {}))
        clash = set(params) & {"capacity", *options}
        if clash:
            raise ProtocolError(f"index.new: params repeat the argument(s) {sorted(clash)}")
        index = self.implementation.make_index(args.get("capacity"), **options, **params)
        handle = self._new_handle()
        self._indexes[handle] = index
        self._open[handle] = {}
        return {"index": handle, "capacity": index.capacity, "first_slot": index.first_slot}

    def _index_drop(self, args: _Args) -> object:
        handle = args.handle("index")
        if self._indexes.pop(handle, None) is None:
            raise ProtocolError(f"index.drop: no index has handle {handle}")
        self._open.pop(handle)
        for reservation in [r for r, (i, _) in self._reservations.items() if i == handle]:
            del self._reservations[reservation]
        return None

    def _prompt_args(self, args: _Args) -> tuple[Any, Any, Any]:
        extras = extras_arg(args.get("extras", []))
        return args.get("namespace"), prompt_arg(args.get("prompt")), extras

    def _make_key(self, args: _Args) -> object:
        index = self._index(args)
        namespace, prompt, extras = self._prompt_args(args)
        return encode_key(index.make_key(namespace, prompt, args.get("tokens"), extras))

    def _lookup(self, args: _Args) -> object:
        index = self._index(args)
        namespace, prompt, extras = self._prompt_args(args)
        hit = index.lookup(namespace, prompt, args.get("minimum"), args.get("maximum"), extras)
        return encode_hit(hit)

    def _reserve(self, args: _Args) -> object:
        index_handle = args.handle("index")
        index = self._index(args)
        namespace, prompt, extras = self._prompt_args(args)
        cost: Any = cost_arg(args.get("cost"))
        outcome = index.reserve(namespace, prompt, args.get("tokens"), extras, cost)
        if not isinstance(outcome, Reservation):
            return encode_outcome(outcome)
        handle = self._new_handle()
        self._reservations[handle] = (index_handle, outcome)
        self._open[index_handle][handle] = outcome
        return encode_outcome(outcome, handle)

    def _reservation(self, args: _Args, verb: str) -> Reservation:
        value = args.get("reservation")
        found = (
            self._reservations.get(value)
            if isinstance(value, int) and not isinstance(value, bool)
            else None
        )
        if found is None:
            raise ForeignReservationError(
                f"cannot {verb} reservation {value!r}: it was not issued by this index "
                "(no open or settled reservation of this server has that handle); pass the "
                "handle that this index's reserve returned"
            )
        return found[1]

    def _settle(self, args: _Args, verb: str) -> tuple[int, CheckpointIndex, Reservation, int]:
        index_handle = args.handle("index")
        index = self._index(args)
        reservation = self._reservation(args, verb)
        return index_handle, index, reservation, args.get("reservation")

    def _publish(self, args: _Args) -> object:
        index_handle, index, reservation, handle = self._settle(args, "publish")
        published = index.publish(reservation)
        if reservation.state is not ReservationState.OPEN:
            self._open[index_handle].pop(handle, None)
        return published

    def _abort(self, args: _Args) -> object:
        index_handle, index, reservation, handle = self._settle(args, "abort")
        index.abort(reservation)
        if reservation.state is not ReservationState.OPEN:
            self._open[index_handle].pop(handle, None)
        return None

    def _cancelled(self, index_handle: int) -> list[int]:
        open_ = self._open[index_handle]
        gone = [h for h, r in open_.items() if r.state is ReservationState.CANCELLED]
        for handle in gone:
            del open_[handle]
        return sorted(gone)

    def _invalidate(self, args: _Args) -> object:
        index_handle = args.handle("index")
        key: Any = key_arg(args.get("key"))
        found = self._index(args).invalidate(key)
        return {"found": found, "cancelled": self._cancelled(index_handle)}

    def _clear(self, args: _Args) -> object:
        index_handle = args.handle("index")
        self._index(args).clear()
        return {"cancelled": self._cancelled(index_handle)}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_prompt_len(op: str, name: str, value: object) -> None:
    """Refuse a prompt length above :data:`MAX_PROMPT_TOKENS` before a policy builds
    anything for it (other bad values go on to the implementation, which checks them).

    Raises:
        AllocationTooLargeError: naming the operation, the argument and the limit.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_PROMPT_TOKENS:
        raise AllocationTooLargeError(
            f"{op}: {name}={value} is more than the {MAX_PROMPT_TOKENS} tokens a prompt may "
            "have on this server (docs/PROTOCOL.md §8); describe a prompt of at most "
            f"{MAX_PROMPT_TOKENS} tokens"
        )


def _batch_from_positions(
    policy: PlacementPolicy, block_size: object, seq_lens: list[Any], query_lens: list[Any]
) -> tuple[list[int], list[int]]:
    """The batch form of ``vllm-align`` from ``positions`` alone (for implementations other
    than the reference): row ``i`` is the chunk ``[seq - query, seq)`` of a ``seq``-token
    prompt; its offset is ``p - start`` and its column ``cdiv(seq, block_size) - 2`` when
    the chunk holds a position ``p``, else ``(0, -1)``."""
    from reference.errors import InvalidTokenCountError

    if len(seq_lens) != len(query_lens):
        raise InvalidTokenCountError(
            f"seq_lens and query_lens must have one entry per row, got {len(seq_lens)} "
            f"and {len(query_lens)} entries"
        )
    block = check_count("block_size", block_size, minimum=1)
    offsets: list[int] = []
    columns: list[int] = []
    for row, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        check_count(f"seq_lens[{row}]", seq_len, minimum=1)
        check_count(f"query_lens[{row}]", query_len, minimum=1)
        if query_len > seq_len:
            raise InvalidTokenCountError(
                f"row {row}: query_len={query_len} exceeds seq_len={seq_len}"
            )
        start = seq_len - query_len
        found = policy.positions(PrefillChunk(start, seq_len, seq_len))
        offsets.append(found[0] - start if found else 0)
        columns.append(-(-seq_len // block) - 2 if found else -1)
    return offsets, columns


def serve(session: Session, stdin: BinaryIO, stdout: TextIO) -> int:
    """Answer request lines from ``stdin`` until it ends; returns the exit code (0).

    Blank lines are skipped; every other line gets one response line, flushed at once.
    """
    try:
        for raw in stdin:
            if not raw.strip():
                continue
            stdout.write(session.handle_line(raw) + "\n")
            stdout.flush()
    except BrokenPipeError:
        # The client went away: nothing left to answer. Point stdout at devnull so the
        # interpreter's final flush does not raise again.
        with contextlib.suppress(OSError, ValueError):  # io.UnsupportedOperation: ValueError
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the server command."""
    parser.add_argument(
        "--impl",
        metavar="MODULE:FACTORY",
        default=None,
        help="serve this Python implementation instead of the reference",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve on this process's stdin/stdout (see :func:`serve`)."""
    parser = argparse.ArgumentParser(
        prog="python -m reference.conformance.protocol_server",
        description="Serve placement and index over the hyckpt JSON-lines stdio protocol.",
    )
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except HyckptError as error:  # the implementation could not be loaded
        print(f"protocol server: error: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """Load ``args.impl`` (default: the reference) and serve it on stdin/stdout."""
    if args.impl:
        from reference.conformance.loading import load_implementation

        implementation = load_implementation(args.impl)
    else:
        implementation = reference_implementation()
    # Responses own stdout: anything the implementation prints goes to stderr instead.
    responses, sys.stdout = sys.stdout, sys.stderr
    try:
        return serve(Session(implementation), sys.stdin.buffer, responses)
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout = responses


if __name__ == "__main__":
    raise SystemExit(main())
