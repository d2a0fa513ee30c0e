"""Prompts as chains of segments: exact prefix sharing without storing token ids.

A **segment** is a pair ``(segment_id, length)``: ``length`` tokens (``1 <= length <=
2**20``) whose ids are a pure function of ``segment_id`` and the offset ``i`` inside the
segment::

    token(segment_id, i) = (segment_id << 20) + i          # 0 <= segment_id < 2**43

so every token id fits a signed 64-bit integer and materialising a segment is
``array('q', range(base, base + length))``, built at C speed (:func:`segment_tokens`). A
segment's tokens never occur in another segment, and a segment always starts at offset 0,
so two prompts share a prefix of ``t`` tokens exactly when they share their leading
segments and then a prefix of one more segment (same id, different lengths):
:func:`common_prefix` computes ``t`` from the segments alone, in O(segments).

A :class:`Prompt` is a node in a tree: a **parent** prompt (or none) plus the segments it
appends. A session's turn ``k + 1`` extends turn ``k``'s prompt, a few-shot request extends
its template's node, a document question extends its document. Materialised tokens
(:meth:`Prompt.tokens`) and chained prefix digests (:meth:`Prompt.hashed`) are cached on
the prompt and built from the nearest ancestor that already has them, so a turn costs
work proportional to its **new** tokens (plus one C-level copy of the history's bytes).

Cache ownership: a prompt built with ``shared=True`` (system prompts, templates,
documents, trace blocks) keeps its caches for all its children. Any other prompt is a
link in a chain (one session's turns): the first child that builds its cache from it
*takes the cache over*, so a session holds one cached copy of its history at a time, not
one per turn. Asking an ancestor again later rebuilds its cache (same result, more work).
:meth:`Prompt.drop_caches` frees a prompt's caches explicitly.

Tiny models: ``tokens(vocab=V)`` maps every id into ``[0, V)`` with a fixed pseudo-random
table (see :func:`map_token`): token ``i`` of segment ``s`` becomes
``table_V[(mix(s) + i) % 16381]``. The map is deterministic and many-to-one, so two
prompts that share ``t`` raw tokens share at least ``t`` mapped tokens (collisions may
make the mapped common prefix longer; that is harmless for a cache, which keys on the
mapped tokens).
"""

from __future__ import annotations

import random
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import TypeVar

from reference.errors import InvalidConfigError
from reference.hashing import HashedPrompt

__all__ = [
    "ID_SPACE_BITS",
    "LOCAL_ID_BITS",
    "MAX_SEGMENT_ID",
    "MAX_SEGMENT_TOKENS",
    "OFFSET_BITS",
    "Prompt",
    "Segment",
    "SegmentIds",
    "common_prefix",
    "map_token",
    "segment_token",
    "segment_tokens",
]

#: ``(segment_id, length)``: ``length`` tokens whose ids depend only on ``segment_id``.
Segment = tuple[int, int]

#: Bits of a token id that hold the offset inside its segment.
OFFSET_BITS = 20
#: Longest segment, in tokens.
MAX_SEGMENT_TOKENS = 1 << OFFSET_BITS
#: Bits of a segment id (``OFFSET_BITS + 43 = 63``: every token id is a positive int64).
SEGMENT_ID_BITS = 43
#: Largest segment id.
MAX_SEGMENT_ID = (1 << SEGMENT_ID_BITS) - 1
#: High bits of a segment id that name the workload component's id space.
ID_SPACE_BITS = 16
#: Low bits of a segment id: ids a single workload component can allocate.
LOCAL_ID_BITS = SEGMENT_ID_BITS - ID_SPACE_BITS

_VOCAB_PERIOD = 16381  # a prime: length of the pseudo-random table behind ``vocab=``
_MASK64 = (1 << 64) - 1


# --- token ids -------------------------------------------------------------------------


def segment_token(segment_id: int, offset: int) -> int:
    """The raw token id at ``offset`` of segment ``segment_id``."""
    return (segment_id << OFFSET_BITS) + offset


def _mix64(value: int) -> int:
    """SplitMix64 finaliser: a fixed bijection of 64-bit integers."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


@lru_cache(maxsize=32)
def _vocab_table(vocab: int) -> array[int]:
    rng = random.Random(f"hyckpt-workloads-vocab:{vocab}")
    return array("q", [rng.randrange(vocab) for _ in range(_VOCAB_PERIOD)])


def _check_vocab(vocab: object) -> int:
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise InvalidConfigError(f"vocab must be a positive int (tokens), got {vocab!r}")
    return vocab


def map_token(token_id: int, vocab: int) -> int:
    """The id in ``[0, vocab)`` that raw token ``token_id`` becomes under ``tokens(vocab)``."""
    table = _vocab_table(_check_vocab(vocab))
    segment_id, offset = divmod(token_id, MAX_SEGMENT_TOKENS)
    return table[(_mix64(segment_id) + offset) % _VOCAB_PERIOD]


def segment_tokens(segment_id: int, length: int, vocab: int | None = None) -> array[int]:
    """The ``length`` token ids of segment ``segment_id`` (raw, or mapped into ``[0, vocab)``).

    C-speed: raw ids are :func:`_raw_tokens` (the spec's ``range``, built as bytes), mapped
    ids a few table slices.
    """
    if vocab is None:
        base = segment_id << OFFSET_BITS
        if (
            type(length) is int
            and length <= MAX_SEGMENT_TOKENS
            and 0 <= segment_id <= MAX_SEGMENT_ID
        ):
            return _raw_tokens(base, length)
        return _raw_tokens_plain(base, length)  # out of the id space: as the spec has it
    table = _vocab_table(_check_vocab(vocab))
    position = _mix64(segment_id) % _VOCAB_PERIOD
    out = table[position : position + length]
    while len(out) < length:
        out += table[: length - len(out)]
    return out


def _raw_tokens_plain(base: int, length: int) -> array[int]:
    """The raw ids ``base, base + 1, ..., base + length - 1`` (the spec of the raw path)."""
    return array("q", range(base, base + length))


#: Tokens per lane run of :func:`_raw_tokens`: ``2**16``.
_RUN = 1 << 16


@lru_cache(maxsize=1)
def _iota_low_bytes() -> tuple[bytes, bytes]:
    """Byte 0 and byte 1 of ``i`` for ``i = 0 .. 2**16 - 1`` (64 KiB each, built once)."""
    iota = range(_RUN)
    return bytes(i & 0xFF for i in iota), bytes(i >> 8 for i in iota)


def _raw_tokens(base: int, length: int) -> array[int]:
    """:func:`_raw_tokens_plain` without a Python int per token, for a ``base`` that is a
    multiple of ``2**16`` (every segment's is) with ``base + length <= 2**63``.

    For ``i < 2**16``, ``base + i == base | i``: its little-endian int64 bytes are
    ``base``'s with bytes 0 and 1 replaced by those of ``i``. So a run of up to ``2**16``
    tokens is ``base``'s eight bytes repeated, then two strided slice assignments from
    :func:`_iota_low_bytes`, all at C speed.
    tests/workloads/test_workloads_generators.py checks it against the plain path.
    """
    low, second = _iota_low_bytes()
    out = array("q")
    for first in range(0, length, _RUN):
        count = min(length - first, _RUN)
        image = bytearray((base + first).to_bytes(8, "little") * count)
        image[0::8] = low[:count]
        image[1::8] = second[:count]
        out.frombytes(image)
    if sys.byteorder == "big":
        out.byteswap()
    return out


# --- segment ids -----------------------------------------------------------------------


class SegmentIds:
    """Allocates fresh segment ids inside one workload component's id space.

    Ids are ``(id_space << LOCAL_ID_BITS) | n`` for ``n = 0, 1, 2, ...``, so components
    with distinct id spaces never share a segment by accident.

    Args:
        id_space: ``0 <= id_space < 2**16``.
    """

    __slots__ = ("_limit", "_next", "id_space")

    def __init__(self, id_space: int) -> None:
        if (
            isinstance(id_space, bool)
            or not isinstance(id_space, int)
            or not 0 <= id_space < 1 << ID_SPACE_BITS
        ):
            raise InvalidConfigError(
                f"id_space must be an integer in [0, {1 << ID_SPACE_BITS}), got {id_space!r}"
            )
        self.id_space = id_space
        self._next = id_space << LOCAL_ID_BITS
        self._limit = (id_space + 1) << LOCAL_ID_BITS

    def reserve(self, count: int) -> int:
        """The first of ``count`` consecutive fresh ids."""
        first = self._next
        if first + count > self._limit:
            raise InvalidConfigError(
                f"a workload component needs more than {1 << LOCAL_ID_BITS} segments "
                f"(id space {self.id_space}); generate fewer requests per component"
            )
        self._next = first + count
        return first

    def next(self) -> int:
        """One fresh id."""
        value = self._next
        if value >= self._limit:
            self.reserve(1)  # raises
        self._next = value + 1
        return value


# --- prompts ---------------------------------------------------------------------------


def _check_segments(segments: Iterable[Segment]) -> tuple[Segment, ...]:
    checked: list[Segment] = []
    for index, segment in enumerate(segments):
        ok = isinstance(segment, tuple) and len(segment) == 2
        if ok:
            segment_id, length = segment
            ok = (
                type(segment_id) is int
                and type(length) is int
                and 0 <= segment_id <= MAX_SEGMENT_ID
                and 1 <= length <= MAX_SEGMENT_TOKENS
            )
        if not ok:
            raise InvalidConfigError(
                f"prompt segment #{index} must be a tuple (segment_id, length) with "
                f"0 <= segment_id <= {MAX_SEGMENT_ID} and 1 <= length <= "
                f"{MAX_SEGMENT_TOKENS} tokens, got {segment!r}"
            )
        checked.append(segment)
    return tuple(checked)


_HashKey = tuple[str, tuple[str, ...], int, int | None]
_K = TypeVar("_K")
_T = TypeVar("_T")


def _identity(tokens: array[int]) -> array[int]:
    return tokens


def _concatenate(base: array[int], tokens: array[int]) -> array[int]:
    return base + tokens


class Prompt:
    """A prompt: its parent's tokens followed by ``own_segments``. Immutable.

    Build roots with ``Prompt(segments)`` and children with :meth:`extend`. Equality is
    structural (same segments, hence same tokens); ``len`` is in tokens.

    Attributes:
        parent: the prompt this one extends, or ``None``.
        own_segments: the segments appended to ``parent``.
        shared: whether children leave this prompt's caches in place (see module doc).
    """

    __slots__ = (
        "__weakref__",
        "_depth",
        "_hashed",
        "_length",
        "_tokens",
        "own_segments",
        "parent",
        "shared",
    )

    parent: Prompt | None
    own_segments: tuple[Segment, ...]
    shared: bool
    _length: int
    _depth: int
    _tokens: dict[int | None, array[int]] | None
    _hashed: dict[_HashKey, HashedPrompt] | None

    def __init__(
        self,
        segments: Iterable[Segment] = (),
        *,
        parent: Prompt | None = None,
        shared: bool = False,
    ) -> None:
        if parent is not None and not isinstance(parent, Prompt):
            raise InvalidConfigError(f"parent must be a Prompt or None, got {parent!r}")
        own = _check_segments(segments)
        self._init(parent, own, sum(length for _, length in own), shared)

    def _init(
        self, parent: Prompt | None, own: tuple[Segment, ...], added: int, shared: bool
    ) -> None:
        self.parent = parent
        self.own_segments = own
        self.shared = shared
        if parent is None:
            self._length, self._depth = added, 1
        else:
            self._length, self._depth = parent._length + added, parent._depth + 1
        self._tokens = None
        self._hashed = None

    @classmethod
    def _make(
        cls, parent: Prompt | None, own: tuple[Segment, ...], added: int, shared: bool = False
    ) -> Prompt:
        """Unchecked constructor for generators: ``added`` is the sum of ``own``'s lengths."""
        prompt = cls.__new__(cls)
        prompt._init(parent, own, added, shared)
        return prompt

    def extend(self, segments: Iterable[Segment], *, shared: bool = False) -> Prompt:
        """A child prompt: ``self`` followed by ``segments``."""
        own = _check_segments(segments)
        return Prompt._make(self, own, sum(length for _, length in own), shared)

    # --- structure -----------------------------------------------------------------

    def __len__(self) -> int:
        return self._length

    @property
    def start(self) -> int:
        """Tokens inherited from the parent (where ``own_segments`` begin)."""
        return 0 if self.parent is None else self.parent._length

    def chain(self) -> list[Prompt]:
        """The prompts from the root down to ``self`` (``self`` last)."""
        nodes: list[Prompt] = []
        node: Prompt | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    @property
    def segments(self) -> tuple[Segment, ...]:
        """Every segment of the prompt, in order (walks the chain: O(segments))."""
        if self.parent is None:
            return self.own_segments
        return tuple(segment for node in self.chain() for segment in node.own_segments)

    def iter_segments(self) -> Iterator[Segment]:
        """The segments in order, without building a tuple."""
        for node in self.chain():
            yield from node.own_segments

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Prompt):
            return NotImplemented
        return self._length == other._length and common_prefix(self, other) == self._length

    def __hash__(self) -> int:
        return hash(self.segments)

    def __repr__(self) -> str:
        return (
            f"Prompt(tokens={self._length}, segments={sum(1 for _ in self.iter_segments())}, "
            f"depth={self._depth})"
        )

    # --- materialisation ----------------------------------------------------------

    def _pending(self, attr: str, key: object) -> tuple[list[Prompt], Prompt | None]:
        """Prompts below the nearest ancestor whose cache ``attr`` holds ``key`` (root first)."""
        pending: list[Prompt] = []
        node: Prompt | None = self
        while node is not None:
            cache = getattr(node, attr)
            if cache is not None and key in cache:
                break
            pending.append(node)
            node = node.parent
        pending.reverse()
        return pending, node

    @staticmethod
    def _new_tokens(pending: Sequence[Prompt], vocab: int | None) -> array[int]:
        out = array("q")
        for node in pending:
            for segment_id, length in node.own_segments:
                out += segment_tokens(segment_id, length, vocab)
        return out

    def _cached(
        self,
        attr: str,
        key: _K,
        vocab: int | None,
        build: Callable[[array[int]], _T],
        grow: Callable[[_T, array[int]], _T],
    ) -> _T:
        """The value cached under ``key`` in cache ``attr``, built from the nearest ancestor.

        A shared prompt on the way up gets its own cache first (so every prompt below it
        reuses it); a non-shared ancestor's cache moves to ``self``.
        """
        cache: dict[_K, _T] | None = getattr(self, attr)
        if cache is not None and key in cache:
            return cache[key]
        pending, ancestor = self._pending(attr, key)
        base: _T | None = None
        for index in range(len(pending) - 2, -1, -1):
            if pending[index].shared:
                ancestor = pending[index]
                base = ancestor._cached(attr, key, vocab, build, grow)
                pending = pending[index + 1 :]
                break
        else:
            if ancestor is not None:
                base = getattr(ancestor, attr)[key]
        new = self._new_tokens(pending, vocab)
        value = build(new) if base is None else grow(base, new)
        if ancestor is not None and not ancestor.shared:
            del getattr(ancestor, attr)[key]
        if cache is None:
            cache = {}
            setattr(self, attr, cache)
        cache[key] = value
        return value

    def tokens(self, vocab: int | None = None) -> array[int]:
        """The prompt's token ids as a new ``array('q')``.

        Args:
            vocab: ``None`` for raw ids (see module doc); an int ``V >= 1`` maps every id
                into ``[0, V)`` deterministically (for a tiny model; collisions allowed).

        Cost: the tokens of segments that neither this prompt nor a cached ancestor has
        materialised, plus C-level copies.
        """
        if vocab is not None:
            _check_vocab(vocab)
        return self._cached("_tokens", vocab, vocab, _identity, _concatenate)[:]

    def hashed(
        self,
        namespace: str,
        unit: int,
        *,
        extras: tuple[str, ...] = (),
        vocab: int | None = None,
    ) -> HashedPrompt:
        """The prompt's :class:`~reference.hashing.HashedPrompt`, cached on the prompt.

        Built as ``ancestor.hashed(...).extend(new_tokens)`` from the nearest ancestor
        that has one (after completing that ancestor's whole-unit digests, so the child
        inherits them): only this prompt's new tokens are materialised and, when digests
        are asked for, hashed. Digests equal those of a ``HashedPrompt`` built from
        scratch on :meth:`tokens`.

        Args:
            namespace: model/deployment identity (part of every key).
            unit: hash unit ``h`` in tokens (``>= 1``).
            extras: adapter ids or salts (part of every key).
            vocab: as for :meth:`tokens`; the digests are of the tokens the model sees.
        """
        if not isinstance(extras, tuple):
            raise InvalidConfigError(f"extras must be a tuple of str, got {extras!r}")
        if vocab is not None:
            _check_vocab(vocab)

        def build(tokens: array[int]) -> HashedPrompt:
            return HashedPrompt(tokens, namespace=namespace, extras=extras, unit=unit)

        def grow(base: HashedPrompt, tokens: array[int]) -> HashedPrompt:
            base.unit_digest(len(base) // unit)  # complete the chain the child copies
            return base.extend(tokens)

        key: _HashKey = (namespace, extras, unit, vocab)
        return self._cached("_hashed", key, vocab, build, grow)

    def drop_caches(self) -> None:
        """Forget this prompt's materialised tokens and hashed prompts (not its ancestors')."""
        self._tokens = None
        self._hashed = None


def common_prefix(a: Prompt, b: Prompt) -> int:
    """Tokens ``a`` and ``b`` share at their start (raw ids), in O(segments).

    Prompts that share a :class:`Prompt` ancestor object skip comparing its segments.
    """
    if a is b:
        return len(a)
    # Climb to the deepest common ancestor object, if any.
    x: Prompt | None = a
    y: Prompt | None = b
    tail_a: list[Prompt] = []
    tail_b: list[Prompt] = []
    while x is not None and y is not None and x._depth > y._depth:
        tail_a.append(x)
        x = x.parent
    while x is not None and y is not None and y._depth > x._depth:
        tail_b.append(y)
        y = y.parent
    while x is not None and y is not None and x is not y:
        tail_a.append(x)
        tail_b.append(y)
        x, y = x.parent, y.parent
    common = 0 if x is None or x is not y else len(x)
    tail_a.reverse()
    tail_b.reverse()
    rest_a = (segment for node in tail_a for segment in node.own_segments)
    rest_b = (segment for node in tail_b for segment in node.own_segments)
    for (id_a, length_a), (id_b, length_b) in zip(rest_a, rest_b, strict=False):
        if id_a != id_b:
            break
        if length_a != length_b:
            common += min(length_a, length_b)
            break
        common += length_a
    return common
