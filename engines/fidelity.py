"""hyckpt's ``vllm`` preset against vLLM 0.33's own prefix-cache manager, request by request.

``python -m engines.fidelity [--requests N] [--budget-gib G ...] [--seed S]`` (in the
venv ``scripts/engine-venv.sh`` builds, ``.venv-engines/bin/python``):

1. builds the workload of the shipped scenario ``engine-presets`` (multi-turn chat,
   ``nemotron-h-8b``, the preset ``engine = "vllm"``, cache-only replay) for the seed;
2. runs hyckpt's replay through the public API (``run_simulation`` with the scenario's
   ``SimConfig`` at the budget), with a shadow backend that also records each request's
   restore (:class:`engines.fidelity_common.HitRecorder`): the per-request hit, which
   ``SimResult`` does not carry;
3. runs :mod:`engines.vllm_replay` (vLLM's ``KVCacheManager``) on the same requests: each
   request's prompt token ids and, as output tokens, the tokens of its ``answer`` after the
   prompt (what a follow-up turn's prompt continues with);
4. prints both token hit rates, how many requests' hits differ and the first differing
   requests with both hits.

``--ssm-dtype vllm`` (the default) runs both with the SSM-state dtype vLLM 0.33 picks for
Nemotron-H (float32, ``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``), which
the preset chooses too (``cache.ssm_state_dtype``) and derives the block size from;
``--ssm-dtype model`` runs both with the model's bfloat16 (vLLM's
``--mamba-ssm-cache-dtype bfloat16``).

hyckpt's side, the workload and the command's loop are shared with
:mod:`engines.sglang_fidelity` (:mod:`engines.fidelity_common`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from engines import fidelity_common as common


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
        return common.differing(self.hyckpt, self.vllm)


def build_scenario(
    ssm_dtype: str,
    budget_bytes: int,
    seed: int,
    requests: int | None,
    workload: str | None = None,
) -> Any:
    """The engine-presets scenario (preset ``vllm``) at ``budget_bytes`` for ``seed``, with
    ``requests`` requests (``None``: the scenario's 600); ``ssm_dtype="vllm"`` gives the
    model vLLM's float32 SSM state."""
    return common.engine_presets_scenario(
        budget_bytes, seed, requests, float32_state=ssm_dtype == "vllm", workload=workload
    )


def compare(
    budget_bytes: int,
    seed: int = 1,
    requests: int | None = None,
    ssm_dtype: str = "model",
    workload: str | None = None,
) -> Comparison:
    """Run both on the scenario's workload (or ``workload``'s) at ``budget_bytes``."""
    from engines import vllm_replay

    ours = common.replay_hyckpt(build_scenario(ssm_dtype, budget_bytes, seed, requests, workload))
    config = ours.config
    hybrid = vllm_replay.HybridModel.from_hyckpt(ours.model, "model")
    hits, plan, vllm_s = vllm_replay.replay(
        hybrid, common.to_replay_requests(ours.items), budget_bytes, config.token_budget
    )
    if plan.block_size != config.block_size:
        raise RuntimeError(
            f"vLLM picks block size {plan.block_size}, hyckpt's preset {config.block_size}"
        )
    theirs = [h.hit_tokens for h in hits]
    return Comparison(
        budget_bytes=budget_bytes,
        request_ids=ours.request_ids,
        prompt_tokens=ours.prompt_tokens,
        hyckpt=ours.hits,
        vllm=theirs,
        hyckpt_rate=ours.rate(ours.hits),
        vllm_rate=ours.rate(theirs),
        hyckpt_totals_rate=float(ours.result.totals["token_hit_rate"]),
        hyckpt_s=ours.seconds,
        vllm_s=vllm_s,
        plan=plan,
        hyckpt_pool=dict(ours.result.pools),
        vllm_detail=[(h.shared_prefix_boundary, h.chunks) for h in hits],
    )


def report(comparison: Comparison, show: int, out: TextIO) -> None:
    """Print one budget's comparison."""
    c, plan = comparison, comparison.plan
    diff = c.differing()
    common.print_budget(c.budget_bytes, out)
    print(
        f"  vLLM: block {plan.block_size}, {plan.num_blocks} blocks of {plan.bytes_per_block} "
        f"bytes (block 0 is the null block), {len(plan.groups)} groups, SSM state "
        f"{plan.ssm_state_dtype}; hyckpt: {c.hyckpt_pool['kv_blocks']} pages, block "
        f"{c.hyckpt_pool['block_size']}, checkpoint slot {c.hyckpt_pool['checkpoint_slot_bytes']}"
        " bytes",
        file=out,
    )
    rates = (c.hyckpt_rate, c.hyckpt_totals_rate, c.vllm_rate)
    common.print_rates("vLLM", rates, len(c.request_ids), len(diff), (c.hyckpt_s, c.vllm_s), out)
    for i in diff[:show]:
        junction, chunks = c.vllm_detail[i]
        print(
            f"    #{i} {c.request_ids[i]}: prompt {c.prompt_tokens[i]}, hyckpt {c.hyckpt[i]}, "
            f"vLLM {c.vllm[i]} (vLLM junction {junction}, chunks {list(chunks)})",
            file=out,
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The command (module docstring); exit 0 when every hit agrees, 1 otherwise."""
    parser = common.fidelity_parser(
        "python -m engines.fidelity", __doc__, budgets=[5.0], show=8, ssm_dtype="vllm"
    )
    parser.add_argument("--json", type=Path, default=None, help="write per-request hits")
    args = parser.parse_args(argv)
    stream = out or sys.stdout
    return common.run_budgets(
        args.budget_gib,
        lambda budget: compare(budget, args.seed, args.requests, args.ssm_dtype, args.workload),
        lambda comparison: report(comparison, args.show, stream),
        args.json,
    )


if __name__ == "__main__":
    raise SystemExit(main())
