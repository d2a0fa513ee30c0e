"""hyckpt's ``sglang`` preset against SGLang 0.5.23's own radix cache, request by request.

``python -m engines.sglang_fidelity [--requests N] [--budget-gib G ...] [--seed S]`` (in the
venv ``scripts/engine-venv-sglang.sh`` builds, ``.venv-sglang/bin/python``):

1. builds the workload of the shipped scenario ``engine-presets`` (multi-turn chat,
   ``nemotron-h-8b``, cache-only replay) for the seed, with ``cache.engine = "sglang"`` and
   ``cache.cache_budget_bytes`` = the budget;
2. runs hyckpt's replay through the public API, as ``hyckpt replay`` / ``hyckpt run`` do
   (``run_simulation`` with the scenario's ``SimConfig``), with a shadow backend that also
   records each request's restore (:class:`HitRecorder`): the per-request hit, which
   ``SimResult`` does not carry;
3. runs :mod:`engines.sglang_replay` (SGLang's ``UnifiedRadixCache``) on the same requests:
   each request's prompt token ids and, as output tokens, the ``output_tokens`` tokens of
   its ``answer`` after the prompt (what the next turn's prompt continues with);
4. prints both token hit rates, how many requests' hits differ and the first differing
   requests with both hits; exit 0 when every hit agrees, 1 otherwise.

``--ssm-dtype sglang`` prices the Mamba state with SGLang's default SSM dtype (float32;
``configs/mamba_utils.py`` ``mamba2_state_dtype``) on both sides: hyckpt then gets
``[model] base = "nemotron-h-8b", ssm_state_dtype = "float32"``. The default keeps hyckpt's
model (bfloat16), what SGLang allocates with ``--mamba-ssm-dtype bfloat16``.
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
#: The scenario whose workload and model are compared.
SCENARIO = "engine-presets"


class HitRecorder(ShadowBackend):
    """The shadow backend, also recording each request's restored hit (tokens)."""

    def __init__(self, implementation: Any) -> None:
        super().__init__(implementation)
        self.hits: dict[str, int] = {}

    def restore(
        self, request_id: str, batch_slot: int, slot: int, tokens: int, block_table: Sequence[int]
    ) -> None:
        super().restore(request_id, batch_slot, slot, tokens, block_table)
        self.hits.setdefault(request_id, tokens)  # a replay never preempts: one each


def scenario(
    budget_bytes: int,
    seed: int,
    requests: int | None,
    ssm_dtype: str = "model",
    token_budget: int | None = None,
) -> Any:
    """The ``engine-presets`` scenario with the ``sglang`` preset at ``budget_bytes``
    (``token_budget``: the prefill chunk, default the scenario's)."""
    from sim.scenarios.command import resolve

    base = resolve(SCENARIO, check_sweep=False)
    overrides: dict[str, object] = {
        "cache.engine": "sglang",
        "cache.cache_budget_bytes": budget_bytes,
        "scenario.seed": seed,
    }
    if requests is not None:
        overrides["workload.requests"] = requests
    if token_budget is not None:
        overrides["cache.token_budget"] = token_budget
    if ssm_dtype == "sglang":
        model = base.data["model"]
        overrides["model"] = {
            "base": model["name"],
            "name": f"{model['name']}-fp32-state",
            "ssm_state_dtype": "float32",
            "gpu": model.get("gpu", "h200"),
        }
    return base.with_overrides(overrides, check_sweep=False)


def workload(scn: Any) -> list[Any]:
    """The scenario's requests for its seed, in arrival order."""
    make, _ = scn.workload.build(scn.seed)
    return list(make())


def to_replay_requests(requests: Sequence[Any]) -> list[Any]:
    """hyckpt requests as :class:`engines.sglang_replay.ReplayRequest`: the prompt's token
    ids and the ``output_tokens`` (at least one, as hyckpt serves) tokens of the answer
    after the prompt."""
    from engines.sglang_replay import ReplayRequest

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


def run_hyckpt(scn: Any, requests: Sequence[Any]) -> tuple[HitRecorder, Any, float]:
    """hyckpt's replay of ``requests`` with the scenario's configuration: the recorder,
    the :class:`~sim.engine.result.SimResult` and the seconds it took."""
    from reference.conformance.loading import load_implementation
    from sim.engine.run import run_simulation

    config = dataclasses.replace(scn.sim_config, seed=scn.seed)
    recorder = HitRecorder(load_implementation(config.impl or "reference.impl:implementation"))
    started = time.perf_counter()
    result = run_simulation(config, iter(requests), backend=recorder)
    return recorder, result, time.perf_counter() - started


@dataclasses.dataclass
class Comparison:
    """One budget's result.

    Attributes:
        budget_bytes: the cache budget.
        request_ids, prompt_tokens: per request, in order.
        hyckpt, sglang: each one's hit per request (tokens).
        sglang_full_kv: how far SGLang's KV alone matched before each lookup.
        hyckpt_rate, sglang_rate: token hit rates (total hits / total prompt tokens).
        hyckpt_totals_rate: ``SimResult.totals["token_hit_rate"]`` (checks the recorder).
        hyckpt_s, sglang_s: wall seconds of each run.
        plan: SGLang's pools (:class:`engines.sglang_replay.PoolPlan`, as a dict).
        hyckpt_pool: hyckpt's pools (``SimResult.pools``).
        tree_core: SGLang's tree core class.
    """

    budget_bytes: int
    request_ids: list[str]
    prompt_tokens: list[int]
    hyckpt: list[int]
    sglang: list[int]
    sglang_full_kv: list[int]
    hyckpt_rate: float
    sglang_rate: float
    hyckpt_totals_rate: float
    hyckpt_s: float
    sglang_s: float
    plan: dict[str, Any]
    hyckpt_pool: dict[str, Any]
    tree_core: str

    def differing(self) -> list[int]:
        """Indices of the requests whose hits differ."""
        pairs = zip(self.hyckpt, self.sglang, strict=True)
        return [i for i, (a, b) in enumerate(pairs) if a != b]


def compare(
    budget_bytes: int,
    seed: int = 1,
    requests: int | None = None,
    ssm_dtype: str = "model",
    tree_core: str | None = None,
    token_budget: int | None = None,
) -> Comparison:
    """Run both on the scenario's workload at ``budget_bytes``."""
    from engines import sglang_replay
    from reference.sizes import get_model

    scn = scenario(budget_bytes, seed, requests, ssm_dtype, token_budget)
    items = workload(scn)
    recorder, result, hyckpt_s = run_hyckpt(scn, items)
    config = scn.sim_config
    model = config.model_sizes if config.model_sizes is not None else get_model(config.model)
    hybrid = sglang_replay.HybridModel.from_hyckpt(model, "model")
    replayed = sglang_replay.replay(
        hybrid, to_replay_requests(items), budget_bytes, config.token_budget, tree_core=tree_core
    )
    ids = [r.request_id for r in items]
    prompts = [len(r.prompt) for r in items]
    ours = [recorder.hits.get(i, 0) for i in ids]
    theirs = [h.hit_tokens for h in replayed.hits]
    total = sum(prompts)
    return Comparison(
        budget_bytes=budget_bytes,
        request_ids=ids,
        prompt_tokens=prompts,
        hyckpt=ours,
        sglang=theirs,
        sglang_full_kv=[h.full_kv_hit for h in replayed.hits],
        hyckpt_rate=sum(ours) / total,
        sglang_rate=sum(theirs) / total,
        hyckpt_totals_rate=float(result.totals["token_hit_rate"]),
        hyckpt_s=hyckpt_s,
        sglang_s=replayed.seconds,
        plan=dataclasses.asdict(replayed.plan),
        hyckpt_pool={k: v for k, v in result.pools.items() if k != "memory"},
        tree_core=replayed.tree_core,
    )


def report(comparison: Comparison, show: int, out: TextIO) -> None:
    """Print one budget's comparison."""
    c, plan = comparison, comparison.plan
    diff = c.differing()
    print(f"budget {c.budget_bytes / GIB:g} GiB ({c.budget_bytes} bytes)", file=out)
    print(
        f"  SGLang: {plan['max_mamba_cache_size']} Mamba slots of {plan['per_req_bytes']} bytes "
        f"(SSM state {plan['ssm_state_dtype']}), {plan['max_total_num_tokens']} KV tokens, "
        f"{c.tree_core}; hyckpt: {c.hyckpt_pool['checkpoint_slots']} checkpoint slots of "
        f"{c.hyckpt_pool['checkpoint_slot_bytes']} bytes, {c.hyckpt_pool['kv_blocks']} KV "
        f"blocks of {c.hyckpt_pool['block_size']} tokens",
        file=out,
    )
    print(
        f"  token hit rate: hyckpt {c.hyckpt_rate:.4f} (totals {c.hyckpt_totals_rate:.4f}), "
        f"SGLang {c.sglang_rate:.4f}; requests {len(c.request_ids)}, hits differ for "
        f"{len(diff)}; hyckpt {c.hyckpt_s:.1f} s, SGLang {c.sglang_s:.1f} s",
        file=out,
    )
    for i in diff[:show]:
        print(
            f"    #{i} {c.request_ids[i]}: prompt {c.prompt_tokens[i]}, hyckpt {c.hyckpt[i]}, "
            f"SGLang {c.sglang[i]} (SGLang's KV matched {c.sglang_full_kv[i]})",
            file=out,
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The command (module docstring); exit 0 when every hit agrees, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m engines.sglang_fidelity", description=__doc__)
    parser.add_argument("--requests", type=int, default=None, help="default: the scenario's")
    parser.add_argument("--budget-gib", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=5, help="differing requests to print")
    parser.add_argument("--ssm-dtype", choices=("model", "sglang"), default="model")
    parser.add_argument("--tree-core", choices=("rust", "python"), default=None)
    parser.add_argument(
        "--token-budget", type=int, default=None, help="prefill chunk (default: the scenario's)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write per-request hits")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    agree = True
    dump = []
    for gib in args.budget_gib:
        comparison = compare(
            int(gib * GIB),
            args.seed,
            args.requests,
            args.ssm_dtype,
            args.tree_core,
            args.token_budget,
        )
        report(comparison, args.show, out)
        agree = agree and not comparison.differing()
        dump.append(dataclasses.asdict(comparison))
    if args.json is not None:
        args.json.write_text(json.dumps(dump, indent=1))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
