"""A prompt of fixed token ids: the part of a workload prompt the tensor backends read."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any


class Prompt:
    """Fixed token ids (what the backends read of a prompt)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def tokens(self, vocab: int | None = None) -> array[int]:
        return array("q", [t % vocab if vocab else t for t in self.ids])

    def hashed(self, namespace: str, unit: int) -> Any:
        raise NotImplementedError
