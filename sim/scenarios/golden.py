"""Golden summary numbers of the shipped scenarios (``tests/golden/<scenario>.json``).

Each file holds :func:`golden_summary` of the scenario's run with its own seed. The test
suite reruns every scenario and compares (integers exactly, floats to 1e-12 relative).
After an intended semantic change, regenerate them and review the diff::

    python -m sim.scenarios.golden --write            # every scenario
    python -m sim.scenarios.golden --write NAME ...   # some of them
    python -m sim.scenarios.golden                    # compare only (exit 1 on a change)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sim.engine.result import SimResult
from sim.scenarios.loader import SCENARIO_DIR, Scenario, load_scenario
from sim.scenarios.runner import run_scenario

#: Where the golden files live (``tests/golden`` at the repository root).
GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "golden"
#: Relative tolerance of float comparisons.
REL_TOL = 1e-12
#: What to tell a reader whose golden comparison failed.
REGENERATE = "python -m sim.scenarios.golden --write"


def golden_summary(result: SimResult) -> dict[str, Any]:
    """The numbers a golden file pins: hit rates, tokens, captures, restores, evictions by
    reason, requests, preemptions, steps, simulated seconds and lockstep counts."""
    t = result.totals
    captures = t["captures"]
    return {
        "seed": result.seed,
        "token_hit_rate": t["token_hit_rate"],
        "request_hit_rate": t["request_hit_rate"],
        "prompt_tokens": t["prompt_tokens"],
        "hit_tokens": t["hit_tokens"],
        "recomputed_tokens": t["recomputed_tokens"],
        "decode_tokens": t["decode_tokens"],
        "flops_saved": t["flops_saved"],
        "requests": dict(t["requests"]),
        "preemptions": t["preemptions"],
        "steps": t["steps"],
        "sim_time_s": t.get("sim_time_s"),  # absent in a cache-only replay
        "captures": {
            key: captures[key]
            for key in ("planned", "reserved", "already_cached", "no_slot", "aborted", "published")
        },
        "restores": t["restores"]["count"],
        "evictions": dict(t["evictions"]),
        "speculative": dict(t["speculative"]),
        "checkpoint_slots": result.pools["checkpoint_slots"],
        "kv_blocks": result.pools["kv_blocks"],
        "lockstep_ok": result.ok,
        "lockstep_counts": result.violation_counts,
    }


def golden_path(name: str) -> Path:
    """``tests/golden/<name>.json``."""
    return GOLDEN_DIR / f"{name}.json"


def compare(expected: Any, actual: Any, where: str = "") -> list[str]:
    """Differences between two summaries: ``key: expected X, got Y`` lines."""
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        out: list[str] = []
        for key in sorted(set(expected) | set(actual)):
            path = f"{where}.{key}" if where else str(key)
            if key not in actual:
                out.append(f"{path}: expected {expected[key]!r}, missing now")
            elif key not in expected:
                out.append(f"{path}: new key, now {actual[key]!r}")
            else:
                out.extend(compare(expected[key], actual[key], path))
        return out
    floats = isinstance(expected, float) or isinstance(actual, float)
    numbers = all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in (expected, actual)
    )
    if floats and numbers:
        same = math.isclose(expected, actual, rel_tol=REL_TOL, abs_tol=0.0)
    else:
        same = type(expected) is type(actual) and expected == actual
    return [] if same else [f"{where}: expected {expected!r}, got {actual!r}"]


def check_golden(scenario: Scenario) -> list[str]:
    """Rerun ``scenario`` and compare with its golden file (differences, empty if none)."""
    path = golden_path(scenario.name)
    if not path.is_file():
        return [f"no golden file {path}; run `{REGENERATE} {scenario.name}`"]
    expected = json.loads(path.read_text(encoding="utf-8"))
    actual = json.loads(json.dumps(golden_summary(run_scenario(scenario))))
    return compare(expected, actual)


def write_golden(scenario: Scenario) -> Path:
    """Run ``scenario`` and write its golden file; return the path."""
    path = golden_path(scenario.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = golden_summary(run_scenario(scenario))
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim.scenarios.golden [--write] [NAME ...]``; exit 1 on a difference."""
    parser = argparse.ArgumentParser(prog="python -m sim.scenarios.golden", description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the golden files")
    parser.add_argument("names", nargs="*", help="scenario names (default: every one)")
    args = parser.parse_args(argv)
    paths = sorted(SCENARIO_DIR.glob("*.toml"))
    scenarios = [load_scenario(path) for path in paths]
    if args.names:
        unknown = set(args.names) - {s.name for s in scenarios}
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        scenarios = [s for s in scenarios if s.name in args.names]
    status = 0
    for scenario in scenarios:
        if args.write:
            print(f"wrote {write_golden(scenario)}")
            continue
        differences = check_golden(scenario)
        print(f"{scenario.name}: " + ("ok" if not differences else "CHANGED"))
        for line in differences:
            print(f"  {line}")
        status |= bool(differences)
    return status


if __name__ == "__main__":
    sys.exit(main())
