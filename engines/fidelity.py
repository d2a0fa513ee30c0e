"""hyckpt's ``vllm`` preset against vLLM 0.33's own prefix-cache manager, request by request.

``python -m engines.fidelity [--requests N] [--budget-gib G ...] [--seed S]`` (in the
venv ``scripts/engine-venv.sh`` builds, ``.venv-engines/bin/python``):

1. builds the workload of the shipped scenario ``engine-presets`` (multi-turn chat,
   ``nemotron-h-8b``, the preset ``engine = "vllm"``, cache-only replay) for the seed;
2. runs hyckpt's replay through the public API (``run_simulation`` with the scenario's
   ``SimConfig`` at the budget), with a shadow backend that also records each request's
   restore (:class:`HitRecorder`): the per-request hit, which ``SimResult`` does not carry;
3. runs :mod:`engines.vllm_replay` (vLLM's ``KVCacheManager``) on the same requests: each
   request's prompt token ids and, as output tokens, the tokens of its ``answer`` after the
   prompt (what a follow-up turn's prompt continues with);
4. prints both token hit rates, how many requests' hits differ and the first differing
   requests with both hits.

``--ssm-dtype vllm`` runs both with the SSM-state dtype vLLM 0.33 picks for Nemotron-H
(float32, ``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``) instead of hyckpt's
bfloat16: hyckpt then gets ``[model] base = "nemotron-h-8b", ssm_state_dtype = "float32"``
and its preset derives the block size from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from sim.engine.backends.shadow import ShadowBackend

GIB = 1 << 30
#: The scenario whose workload and preset are compared.
SCENARIO = "engine-presets"


class HitRecorder(ShadowBackend):
    """The shadow backend, recording each request's prompt length and restored hit."""

    def __init__(self, implementation: Any) -> None:
        super().__init__(implementation)
        self.prompt_tokens: dict[str, int] = {}
        self.hits: dict[str, int] = {}

    def start(self, request: Any, batch_slot: int) -> None:
        self.prompt_tokens.setdefault(request.request_id, len(request.prompt))

    def restore(
        self, request_id: str, batch_slot: int, slot: int, tokens: int, block_table: Sequence[int]
    ) -> None:
        self.hits.setdefault(request_id, tokens)  # a replay never preempts: one each


@dataclasses.dataclass
class Comparison:
    """One budget's result.

    Attributes:
        budget_bytes: the cache budget.
        request_ids: the requests in order.
        prompt_tokens: per request.
        hyckpt: hyckpt's hit per request.
        vllm: vLLM's hit per request.
        hyckpt_rate, vllm_rate: token hit rates (total hits / total prompt tokens).
        hyckpt_totals_rate: ``SimResult.totals["token_hit_rate"]`` (a check of the recorder).
        hyckpt_s, vllm_s: wall seconds of each run.
        plan: vLLM's pool plan (block size, blocks, groups).
        hyckpt_pool: hyckpt's pool description (``SimResult.pools``).
        vllm_detail: per request, vLLM's junction and chunks.
    """

    budget_bytes: int
    request_ids: list[str]
    prompt_tokens: list[int]
    hyckpt: list[int]
    vllm: list[int]
    hyckpt_rate: float
    vllm_rate: float
    hyckpt_totals_rate: float
    hyckpt_s: float
    vllm_s: float
    plan: Any
    hyckpt_pool: dict[str, Any]
    vllm_detail: list[tuple[int, tuple[int, ...]]]

    def differing(self) -> list[int]:
        """Indices of the requests whose hits differ."""
        return [i for i, (a, b) in enumerate(zip(self.hyckpt, self.vllm, strict=True)) if a != b]


def build_scenario(ssm_dtype: str, budget_bytes: int, seed: int, requests: int | None) -> Any:
    """The engine-presets scenario (preset ``vllm``) at ``budget_bytes`` for ``seed``, with
    ``requests`` requests (``None``: the scenario's 600); ``ssm_dtype="vllm"`` gives the
    model vLLM's float32 SSM state."""
    from sim.scenarios.command import resolve

    scenario = resolve(SCENARIO, check_sweep=False)
    overrides: dict[str, object] = {
        "cache.cache_budget_bytes": budget_bytes,
        "scenario.seed": seed,
    }
    if requests is not None:
        overrides["workload.requests"] = requests
    if ssm_dtype == "vllm":
        model = scenario.data["model"]
        overrides["model"] = {
            "base": model["name"],
            "name": f"{model['name']}-fp32-state",
            "ssm_state_dtype": "float32",
            "gpu": model.get("gpu", "h200"),
        }
    return scenario.with_overrides(overrides, check_sweep=False)


def workload(scenario: Any) -> list[Any]:
    """The scenario's requests for its seed, in arrival order."""
    make, _ = scenario.workload.build(scenario.seed)
    return list(make())


def to_replay_requests(requests: Sequence[Any]) -> list[Any]:
    """hyckpt requests as :class:`engines.vllm_replay.ReplayRequest`: the prompt's token
    ids, and the ``output_tokens`` (at least one, as hyckpt serves) tokens of the answer
    after the prompt, which the next turn's prompt repeats."""
    from engines.vllm_replay import ReplayRequest

    converted = []
    for request in requests:
        n, out = len(request.prompt), max(1, request.output_tokens)
        if request.answer is None:
            raise ValueError(f"{request.request_id}: the workload does not know its answer")
        tokens = request.answer.tokens()
        if len(tokens) < n + out:
            raise ValueError(f"{request.request_id}: its answer is shorter than prompt + output")
        converted.append(
            ReplayRequest(request.request_id, tokens[:n].tolist(), tokens[n : n + out].tolist())
        )
    return converted


def run_hyckpt(scenario: Any, requests: Sequence[Any]) -> tuple[HitRecorder, Any, float]:
    """hyckpt's replay of ``requests`` with the scenario's configuration: the recorder,
    the :class:`~sim.engine.result.SimResult` and the seconds it took."""
    from reference.conformance.loading import load_implementation
    from sim.engine.run import run_simulation

    config = dataclasses.replace(scenario.sim_config, seed=scenario.seed)
    recorder = HitRecorder(load_implementation(config.impl or "reference.impl:implementation"))
    started = time.perf_counter()
    result = run_simulation(config, iter(requests), backend=recorder)
    return recorder, result, time.perf_counter() - started


def compare(
    budget_bytes: int, seed: int = 1, requests: int | None = None, ssm_dtype: str = "model"
) -> Comparison:
    """Run both on the scenario's workload at ``budget_bytes``."""
    from engines import vllm_replay
    from reference.sizes import get_model

    scenario = build_scenario(ssm_dtype, budget_bytes, seed, requests)
    items = workload(scenario)
    recorder, result, hyckpt_s = run_hyckpt(scenario, items)
    config = scenario.sim_config
    model = config.model_sizes if config.model_sizes is not None else get_model(config.model)
    hybrid = vllm_replay.HybridModel.from_hyckpt(model, "model")
    hits, plan, vllm_s = vllm_replay.replay(
        hybrid, to_replay_requests(items), budget_bytes, config.token_budget
    )
    if plan.block_size != config.block_size:
        raise RuntimeError(
            f"vLLM picks block size {plan.block_size}, hyckpt's preset {config.block_size}"
        )
    ids = [r.request_id for r in items]
    prompts = [len(r.prompt) for r in items]
    ours = [recorder.hits.get(i, 0) for i in ids]
    theirs = [h.hit_tokens for h in hits]
    total = sum(prompts)
    return Comparison(
        budget_bytes=budget_bytes,
        request_ids=ids,
        prompt_tokens=prompts,
        hyckpt=ours,
        vllm=theirs,
        hyckpt_rate=sum(ours) / total,
        vllm_rate=sum(theirs) / total,
        hyckpt_totals_rate=float(result.totals["token_hit_rate"]),
        hyckpt_s=hyckpt_s,
        vllm_s=vllm_s,
        plan=plan,
        hyckpt_pool=dict(result.pools),
        vllm_detail=[(h.shared_prefix_boundary, h.chunks) for h in hits],
    )


def report(comparison: Comparison, show: int, out: TextIO) -> None:
    """Print one budget's comparison."""
    c, plan = comparison, comparison.plan
    diff = c.differing()
    print(f"budget {c.budget_bytes / GIB:g} GiB ({c.budget_bytes} bytes)", file=out)
    print(
        f"  vLLM: block {plan.block_size}, {plan.num_blocks} blocks of {plan.bytes_per_block} "
        f"bytes (block 0 is the null block), {len(plan.groups)} groups, SSM state "
        f"{plan.ssm_state_dtype}; hyckpt: {c.hyckpt_pool['kv_blocks']} pages, block "
        f"{c.hyckpt_pool['block_size']}, checkpoint slot {c.hyckpt_pool['checkpoint_slot_bytes']}"
        " bytes",
        file=out,
    )
    print(
        f"  token hit rate: hyckpt {c.hyckpt_rate:.4f} (totals {c.hyckpt_totals_rate:.4f}), "
        f"vLLM {c.vllm_rate:.4f}; requests {len(c.request_ids)}, hits differ for {len(diff)}; "
        f"hyckpt {c.hyckpt_s:.1f} s, vLLM {c.vllm_s:.1f} s",
        file=out,
    )
    for i in diff[:show]:
        junction, chunks = c.vllm_detail[i]
        print(
            f"    #{i} {c.request_ids[i]}: prompt {c.prompt_tokens[i]}, hyckpt {c.hyckpt[i]}, "
            f"vLLM {c.vllm[i]} (vLLM junction {junction}, chunks {list(chunks)})",
            file=out,
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The command (module docstring); exit 0 when every hit agrees, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m engines.fidelity", description=__doc__)
    parser.add_argument("--requests", type=int, default=None, help="default: the scenario's")
    parser.add_argument("--budget-gib", type=float, nargs="+", default=[5.0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=8, help="differing requests to print")
    parser.add_argument("--ssm-dtype", choices=("model", "vllm"), default="model")
    parser.add_argument("--json", type=Path, default=None, help="write per-request hits")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    agree = True
    dump = []
    for gib in args.budget_gib:
        comparison = compare(int(gib * GIB), args.seed, args.requests, args.ssm_dtype)
        report(comparison, args.show, out)
        agree = agree and not comparison.differing()
        dump.append(dataclasses.asdict(comparison))
    if args.json is not None:
        args.json.write_text(json.dumps(dump, indent=1))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
