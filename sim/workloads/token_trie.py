"""Prompts from explicit token ids, sharing exactly what the ids share.

A trace that gives every request's token ids (Marconi's) is turned into segment prompts
(:mod:`sim.workloads.prompt`) through a compressed trie of the ids seen so far. Each
trie node is one run of token ids and one segment; a request walks the trie from the
root, following a run while its ids agree and a child where they part. Its prompt is a
chain of segments: every node it passes whole, then the prefix ``(segment_id, j)`` of
the node where it ends, and a new node (a fresh segment) holding the rest of its ids
where it leaves everything seen before.

Exactness: where a request goes at position ``p`` depends only on its ids ``[0, p]``
(the trie only grows, and never at a place an earlier walk went through), so two
requests whose ids agree on ``[0, t)`` and differ at ``t`` have the same segments and
offsets at every position below ``t`` and different ones at ``t``:
``common_prefix(a, b) == t`` and their materialised ids and prefix hashes agree exactly
up to ``t`` (the ids are the segment ids' own, not the trace's: equal where the trace's
are equal, and nowhere else).

Memory: the trie holds every distinct run of ids (8 bytes per token) and, through weak
references, the prompt objects of live requests (a prefix stays one object, hashed once,
while any live request uses it).
"""

from __future__ import annotations

import bisect
import weakref
from array import array

from sim.workloads.prompt import Prompt, SegmentIds

__all__ = ["TokenTrie"]


class _Node:
    """One run of token ids: segment ``segment_id``, hanging at offset ``attach`` of
    ``parent``'s run (its full length: after it; less: where the two part)."""

    __slots__ = ("attach", "children", "cuts", "forks", "full", "parent", "segment_id", "tokens")

    def __init__(
        self, segment_id: int, tokens: array[int], parent: _Node | None, attach: int
    ) -> None:
        self.segment_id = segment_id
        self.tokens = tokens
        self.parent = parent
        self.attach = attach
        #: offset in this run -> first token id of the child -> child
        self.children: dict[int, dict[int, _Node]] = {}
        self.forks: list[int] = []  # the offsets of `children`, sorted
        self.full: weakref.ref[Prompt] | None = None  # the prompt ending with the whole run
        self.cuts: dict[int, weakref.ref[Prompt]] = {}  # ... with its first j tokens


def _agree(a: array[int], a_start: int, b: array[int], b_start: int, count: int) -> int:
    """How many of the ``count`` ids from ``a[a_start]`` and ``b[b_start]`` agree before the
    first difference (``count`` if none): binary search over C-speed slice comparisons."""
    if a[a_start : a_start + count] == b[b_start : b_start + count]:
        return count
    low, high = 0, count  # the first `low` agree; the first `high` do not
    while high - low > 1:
        middle = (low + high) // 2
        if a[a_start : a_start + middle] == b[b_start : b_start + middle]:
            low = middle
        else:
            high = middle
    return low


class TokenTrie:
    """Builds prompts from token ids; one per replay (see the module doc).

    Args:
        ids: allocator of the segment ids of new nodes.
    """

    __slots__ = ("_ids", "_root")

    def __init__(self, ids: SegmentIds) -> None:
        self._ids = ids
        self._root = _Node(-1, array("q"), None, 0)

    def prompt(self, tokens: array[int]) -> tuple[Prompt, tuple[int, ...]]:
        """The prompt of ``tokens`` (at least one id, at most ``2**20``) and its branch
        points: the positions ``0 < p < len(tokens)`` of its path where the trie forks,
        this walk included (a node's run goes on one way and a child hangs there, or two
        children hang at the end of a run), that is where the path parts from a prefix an
        earlier walk shares, or passes a place where two earlier walks parted.
        """
        count = len(tokens)
        if count < 1:
            raise ValueError("a prompt needs at least one token id")
        node = self._root
        offset = 0  # tokens of `node`'s run matched
        position = 0  # tokens of `tokens` matched
        branch: list[int] = []
        while True:
            run = node.tokens
            if offset < len(run):
                entry = offset
                matched = _agree(
                    run, offset, tokens, position, min(len(run) - offset, count - position)
                )
                offset += matched
                position += matched
                # Forks this walk passes inside the run (offset 0 of a run has none).
                forks = node.forks
                low = bisect.bisect_right(forks, entry)
                high = bisect.bisect_left(forks, offset)
                branch.extend(position - offset + j for j in forks[low:high])
                if position == count:
                    break
            hanging = node.children.get(offset)
            if hanging is None:
                hanging = node.children[offset] = {}
                bisect.insort(node.forks, offset)
            first = tokens[position]
            child = hanging.get(first)
            if child is None:
                child = hanging[first] = _Node(self._ids.next(), tokens[position:], node, offset)
            if (offset < len(run) or len(hanging) > 1) and position > 0:
                branch.append(position)
            node, offset = child, 0
        return self._prompt(node, offset), tuple(branch)

    def _prompt(self, node: _Node, offset: int) -> Prompt:
        """The prompt object ending ``offset`` tokens into ``node``'s run (``offset >= 1``):
        the live one, or a new one (and, as needed, new ancestors)."""
        pending: list[tuple[_Node, int]] = []
        found: Prompt | None = None
        while node is not self._root:
            ref = node.full if offset == len(node.tokens) else node.cuts.get(offset)
            found = None if ref is None else ref()
            if found is not None:
                break
            pending.append((node, offset))
            assert node.parent is not None
            node, offset = node.parent, node.attach
        prompt = found
        for node, offset in reversed(pending):
            whole = offset == len(node.tokens)
            # A prefix of a run, or a run other walks go on from, keeps its caches for
            # all of them; a run one chain goes through hands its caches down.
            shared = not whole or offset in node.children
            prompt = Prompt._make(prompt, ((node.segment_id, offset),), offset, shared)
            if whole:
                node.full = weakref.ref(prompt)
            else:
                node.cuts[offset] = weakref.ref(prompt)
        assert prompt is not None
        return prompt
