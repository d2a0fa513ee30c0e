"""Shared content in a session JSONL trace: the optional ``segments`` of a line.

A line may describe its input as a list of segments instead of (or besides) one
``input_tokens`` count::

    {"session_id": "c17", "turn_id": 0, "ts": 3.5, "output_tokens": 212,
     "segments": [{"shared": "system-v2", "tokens": 1500}, {"tokens": 80}]}

* ``{"shared": ID, "tokens": N}``: content ``ID`` (a non-empty string or an integer; ``7``
  and ``"7"`` are the same id) of ``N`` tokens. One id is one token sequence wherever it
  appears: the same segment (the same token ids), and always the same ``N`` (another count
  is an error naming the line and the line that first gave the id).
* ``{"tokens": N}``: ``N`` tokens of private content (a fresh segment).

``1 <= N <= 2**20``, and a line's segments hold at most 2**20 tokens in all. The
**leading** shared segments of a session's first turn are one shared prefix for every
session that starts with the same ids, as in production: the same prompt objects (a
prefix tree held through weak references, as the Mooncake reader's blocks), hence the same
prefix hashes, computed once while any request uses them. A shared segment after private
content has the same token ids, but the prefix before it differs, so no cache can reuse it
there (nor would a serving engine's).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from sim.workloads.errors import TraceFormatError
from sim.workloads.prompt import MAX_SEGMENT_TOKENS, Prompt, Segment, SegmentIds

__all__ = ["SEGMENT_KEYS", "SegmentReader", "TraceSegment", "own_segments"]

#: The keys a segment object may have.
SEGMENT_KEYS = ("shared", "tokens")

_EXPECTED = 'a list of segments, each {"tokens": N} or {"shared": ID, "tokens": N}'


@dataclass(frozen=True, slots=True)
class TraceSegment:
    """One segment of a line: its segment id, length (tokens), and whether it is shared
    content (and so may start a prefix other sessions share)."""

    segment_id: int
    tokens: int
    shared: bool


@dataclass(frozen=True, slots=True)
class _Content:
    segment_id: int
    tokens: int
    line: int


class SegmentReader:
    """Reads the ``segments`` of one trace file's lines; one per replay.

    Memory: one entry per distinct content id, plus the live shared prefixes.
    """

    __slots__ = ("_contents", "_file", "_ids", "_nodes")

    def __init__(self, file: str, ids: SegmentIds) -> None:
        self._file = file
        self._ids = ids
        self._contents: dict[str, _Content] = {}
        # (id of the parent prompt, segment id) -> node; a live node keeps its parent
        # alive, so the parent's id is not reused while the entry exists.
        self._nodes: weakref.WeakValueDictionary[tuple[int, int], Prompt] = (
            weakref.WeakValueDictionary()
        )

    def read(self, line: int, raw: Any) -> list[TraceSegment]:
        """The segments of ``raw`` (the line's ``segments`` value), validated.

        Raises:
            TraceFormatError: not a list of segment objects, an unknown key, a bad count,
                a bad content id, a content id with another count than before, or more
                than 2**20 tokens in all.
        """
        file = self._file
        if not isinstance(raw, list):
            raise TraceFormatError(file, line, "segments", raw, _EXPECTED)
        out: list[TraceSegment] = []
        total = 0
        for index, item in enumerate(raw):
            where = f"segments[{index}]"
            if not isinstance(item, dict):
                raise TraceFormatError(file, line, where, item, _EXPECTED)
            unknown = sorted(set(item) - set(SEGMENT_KEYS))
            if unknown:
                raise TraceFormatError(
                    file,
                    line,
                    where,
                    item,
                    f"only the keys {', '.join(SEGMENT_KEYS)} "
                    f"(unknown: {', '.join(map(repr, unknown))})",
                )
            tokens = item.get("tokens")
            if isinstance(tokens, float) and tokens.is_integer():
                tokens = int(tokens)
            if (
                isinstance(tokens, bool)
                or not isinstance(tokens, int)
                or not 1 <= tokens <= MAX_SEGMENT_TOKENS
            ):
                expected = f"an integer in [1, {MAX_SEGMENT_TOKENS}]"
                if "tokens" not in item:
                    expected += " (the key is missing)"
                raise TraceFormatError(file, line, f"{where}.tokens", tokens, expected)
            total += tokens
            if total > MAX_SEGMENT_TOKENS:
                raise TraceFormatError(
                    file, line, "segments", total, f"at most {MAX_SEGMENT_TOKENS} tokens in all"
                )
            if "shared" not in item:
                out.append(TraceSegment(self._ids.next(), tokens, False))
                continue
            content = item["shared"]
            if isinstance(content, bool) or not isinstance(content, str | int) or content == "":
                raise TraceFormatError(
                    file, line, f"{where}.shared", content, "a non-empty string or an integer"
                )
            key = str(content)
            known = self._contents.get(key)
            if known is None:
                known = _Content(self._ids.next(), tokens, line)
                self._contents[key] = known
            elif known.tokens != tokens:
                raise TraceFormatError(
                    file,
                    line,
                    f"{where}.tokens",
                    tokens,
                    f"{known.tokens}, the tokens of shared content {key!r} on line "
                    f"{known.line} (one content id is one token sequence)",
                )
            out.append(TraceSegment(known.segment_id, tokens, True))
        return out

    def first_prompt(self, segments: list[TraceSegment]) -> tuple[Prompt, tuple[int, ...]]:
        """A session's first prompt from its segments (at least one token), and the end of
        every leading shared segment (where it may leave a prefix other sessions share).

        The leading shared segments are nodes of the shared prefix tree; the rest is one
        node of this session's own.
        """
        parent: Prompt | None = None
        ends: list[int] = []
        position = 0
        count = 0
        for segment in segments:
            if not segment.shared:
                break
            key = (id(parent), segment.segment_id)
            node = self._nodes.get(key)
            if node is None or node.parent is not parent:
                own = ((segment.segment_id, segment.tokens),)
                node = Prompt._make(parent, own, segment.tokens, True)
                self._nodes[key] = node
            parent = node
            position += segment.tokens
            ends.append(position)
            count += 1
        rest: tuple[Segment, ...] = tuple((s.segment_id, s.tokens) for s in segments[count:])
        if rest:
            prompt = Prompt._make(parent, rest, sum(length for _, length in rest))
        else:
            assert parent is not None  # a first turn has at least one token
            prompt = parent
        return prompt, tuple(ends)


def own_segments(segments: list[TraceSegment]) -> tuple[Segment, ...]:
    """``(segment_id, tokens)`` of each segment, for a prompt that extends a history."""
    return tuple((s.segment_id, s.tokens) for s in segments)
