"""The reference's own construction of the engine-mirroring placement policies
(``vllm-retention``, ``chunk-end``, ``chunk-grid``; docs/SEMANTICS.md §1.1), not part of
the conformance suite (``tests/conformance/test_placement_engines.py``): registered frozen
values, and the wording of a bad retention interval.
"""

from __future__ import annotations

import dataclasses

import pytest

from reference import placement as ref
from reference.api import PlacementPolicy
from reference.errors import InvalidConfigError

ENGINE_POLICIES = {
    "vllm-retention": {"hash_unit": 16},
    "chunk-end": {},
    "chunk-grid": {"grid": 128},
}


# --- construction and bad parameters ---------------------------------------------------


def test_retention_interval_message_says_multiple() -> None:
    with pytest.raises(InvalidConfigError, match="'retention_interval'=24 must be a multiple"):
        ref.make_placement("vllm-retention", hash_unit=16, retention_interval=24)


@pytest.mark.parametrize("name", sorted(ENGINE_POLICIES))
def test_engine_policies_are_registered_frozen_values(name: str) -> None:
    params = ENGINE_POLICIES[name]
    policy = ref.make_placement(name, **params)
    assert isinstance(policy, PlacementPolicy) and policy.name == name
    assert type(policy) is ref.POLICIES[name] and type(policy).name == name
    assert dataclasses.is_dataclass(policy)
    assert policy == ref.make_placement(name, **params) and len({policy, policy}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(policy, dataclasses.fields(policy)[0].name, 1)
    assert ref.Branch(hash_unit=16).end_of_input is True  # the default keeps the end
    assert ref.ChunkGrid(grid=128).hash_unit == 128  # the hash unit defaults to the grid
