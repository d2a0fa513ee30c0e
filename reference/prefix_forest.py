"""The prefix tree over published checkpoints, for eviction policies that need it.

Marconi's eviction (:class:`reference.eviction.MarconiPolicy`) reasons about a radix
tree: a checkpoint's *parent* is the checkpoint a lookup would fall back to if it were
gone, and a checkpoint with two or more children is a branch point several prompts
share. hyckpt's index is a hash map, not a tree, so the index keeps this relation for a
policy that asks for it (``uses_prefix_tree = True``):

- the **parent** of a published checkpoint ``c`` (``namespace``, ``extras``, prompt
  prefix of ``t`` tokens) is the published checkpoint of the same namespace and extras
  with the largest ``t' < t`` whose prompt prefix is ``prompt[:t']``; none means ``c``
  is a root;
- its **children** are the published checkpoints whose parent it is.

A checkpoint is in the forest from its ``publish`` until it leaves lookup (eviction,
invalidation, ``clear``); then its children pass to its parent. Reserved (unpublished)
entries are not in it. Every operation costs O(children of the parent) digest
comparisons after the parent search, which the index does as a lookup does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference.hashing import HashedPrompt

#: Roots are grouped by ``(namespace, extras)``: checkpoints of two groups never nest.
_Group = tuple[str, tuple[str, ...]]


@dataclass(eq=False)
class _Node:
    slot: int
    group: _Group
    tokens: int
    digest: bytes
    prompt: HashedPrompt  # a prompt whose first ``tokens`` tokens are this checkpoint's
    parent: _Node | None = None
    children: dict[int, _Node] = field(default_factory=dict)  # slot → node, in order added


class PrefixForest:
    """Parent / child relation of the published checkpoints (see the module docstring)."""

    def __init__(self) -> None:
        self._nodes: dict[int, _Node] = {}
        self._roots: dict[_Group, dict[int, _Node]] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, slot: object) -> bool:
        return slot in self._nodes

    def parent(self, slot: int) -> int | None:
        """Slot of ``slot``'s parent checkpoint, ``None`` for a root."""
        parent = self._nodes[slot].parent
        return None if parent is None else parent.slot

    def children(self, slot: int) -> list[int]:
        """Slots of ``slot``'s children, in the order they became its children."""
        return list(self._nodes[slot].children)

    def child_count(self, slot: int) -> int:
        return len(self._nodes[slot].children)

    def add(
        self,
        slot: int,
        group: _Group,
        tokens: int,
        digest: bytes,
        prompt: HashedPrompt,
        parent_slot: int | None,
    ) -> None:
        """Add a just-published checkpoint under ``parent_slot`` (found by the index: the
        longest published proper prefix). Children of that parent that extend the new
        checkpoint move under it.

        Args:
            slot: the checkpoint's slot (not in the forest yet).
            group: its ``(namespace, extras)``.
            tokens: its prefix length.
            digest: the digest of ``prompt[:tokens]`` (its key's digest).
            prompt: a hashed prompt at least ``tokens`` long that it was captured from.
            parent_slot: its parent, or ``None`` for a root.
        """
        assert slot not in self._nodes, f"slot {slot} is already in the prefix forest"
        parent = None if parent_slot is None else self._nodes[parent_slot]
        node = _Node(slot, group, tokens, digest, prompt, parent)
        siblings = self._siblings(parent, group)

        def extends(other: _Node) -> bool:
            return other.tokens > tokens and other.prompt.digest(tokens) == digest

        for other in [other for other in siblings.values() if extends(other)]:
            del siblings[other.slot]
            other.parent = node
            node.children[other.slot] = other
        siblings[slot] = node
        self._nodes[slot] = node

    def remove(self, slot: int) -> None:
        """``slot`` left lookup: its children pass to its parent (or become roots)."""
        node = self._nodes.pop(slot)
        siblings = self._siblings(node.parent, node.group)
        del siblings[slot]
        for child in node.children.values():
            child.parent = node.parent
            siblings[child.slot] = child
        node.children.clear()
        node.parent = None

    def _siblings(self, parent: _Node | None, group: _Group) -> dict[int, _Node]:
        if parent is not None:
            return parent.children
        return self._roots.setdefault(group, {})
