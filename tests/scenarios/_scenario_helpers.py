"""Shared by the scenario tests (tests/test_scenarios*.py): the repository root, the
packaged default scenario, a tiny scenario file (``TINY``) and writing a scenario file or
loading one that must fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.scenarios import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]


#: A small, fast scenario (a fraction of a second).
TINY = """\
[scenario]
name = "tiny"
seed = 3

[cache]
block_size = 16
token_budget = 1024
checkpoint_slots = 16

[engine]
max_num_seqs = 16

[placement]
policy = "turns"

[workload]
generator = "chat"
requests = 20

[workload.params]
arrivals = { kind = "poisson", rate_per_s = 2.0 }
think_time = { mean_s = 2.0 }

[expect]
max_lockstep_violations = 0

[sweep]
"eviction.policy" = ["lru", "fifo"]
"cache.checkpoint_slots" = [4, 16]
"""


def write(tmp_path: Path, text: str, name: str = "scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> ScenarioError:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(path) in str(info.value)
    assert info.value.file == str(path)
    return info.value
