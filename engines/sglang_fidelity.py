"""hyckpt's SGLang presets against SGLang 0.5.23's own radix cache, request by request.

``python -m engines.sglang_fidelity [--requests N] [--budget-gib G ...] [--seed S]`` (in the
venv ``scripts/engine-venv-sglang.sh`` builds, ``.venv-sglang/bin/python``):

1. builds the workload of the shipped scenario ``engine-presets`` (multi-turn chat,
   ``nemotron-h-8b``, cache-only replay) for the seed, with ``cache.engine =
   "sglang-no-buffer"`` (``"sglang-extra-buffer"`` with ``--strategy extra_buffer``) and
   ``cache.cache_budget_bytes`` = the budget;
2. runs hyckpt's replay through the public API, as ``hyckpt replay`` / ``hyckpt run`` do
   (``run_simulation`` with the scenario's ``SimConfig``), with a shadow backend that also
   records each request's restore (:class:`engines.fidelity_common.HitRecorder`): the
   per-request hit, which ``SimResult`` does not carry;
3. runs :mod:`engines.sglang_replay` (SGLang's ``UnifiedRadixCache``) on the same requests:
   each request's prompt token ids and, as output tokens, the ``output_tokens`` tokens of
   its ``answer`` after the prompt (what the next turn's prompt continues with);
4. prints both token hit rates, how many requests' hits differ and the first differing
   requests with both hits; exit 0 when every hit agrees, 1 otherwise.

``--strategy extra_buffer`` runs SGLang with the ``extra_buffer`` Mamba strategy (what
SGLang 0.5.23 resolves ``auto`` to for NemotronH with its default overlap scheduler;
:mod:`engines.sglang_replay`, step 6) and compares it with hyckpt's
``sglang-extra-buffer`` preset.
``--mamba-chunk-size`` is the model's ``mamba_chunk_size`` it tracks states on (default:
the one the preset assumes, ``sim.engine.presets.sglang_mamba_chunk_size``). ``--model``
replays another shipped Mamba2 + attention model (``granite-4.0-h-micro``,
``falcon-h1-7b``) on the same traffic. ``--json`` writes, per request,
SGLang's hit, the positions at which it handed Mamba states to its tree
(``sglang_mamba_inserts``) and the KV the tree holds of the request after its finish
(``sglang_kv_in_tree``).

``--ssm-dtype sglang`` (the default) prices the Mamba state with SGLang's default SSM dtype
(float32; ``configs/mamba_utils.py`` ``mamba2_state_dtype``) on both sides, as the preset
does (``cache.ssm_state_dtype``); ``--ssm-dtype model`` keeps the model's bfloat16 on
both, what SGLang allocates with ``--mamba-ssm-dtype bfloat16``.

hyckpt's side, the workload and the command's loop are shared with
:mod:`engines.fidelity` (:mod:`engines.fidelity_common`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from engines import fidelity_common as common

#: hyckpt's preset for each of SGLang's Mamba strategies.
PRESET_OF_STRATEGY = {"no_buffer": "sglang-no-buffer", "extra_buffer": "sglang-extra-buffer"}


def scenario(
    budget_bytes: int,
    seed: int,
    requests: int | None,
    ssm_dtype: str = "model",
    token_budget: int | None = None,
    strategy: str = "no_buffer",
    model: str | None = None,
    workload: str | None = None,
    block_size: int | None = None,
) -> Any:
    """The ``engine-presets`` scenario with the preset of SGLang's ``strategy``
    (``sglang`` or ``sglang-extra-buffer``) at ``budget_bytes`` (``token_budget``: the
    prefill chunk, default the scenario's; ``block_size``: hyckpt's KV block, default
    the preset's page size 1)."""
    return common.engine_presets_scenario(
        budget_bytes,
        seed,
        requests,
        engine=PRESET_OF_STRATEGY[strategy],
        token_budget=token_budget,
        float32_state=ssm_dtype == "sglang",
        model=model,
        workload=workload,
        block_size=block_size,
    )


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
        strategy: SGLang's Mamba strategy.
        sglang_mamba_inserts: per request, the key lengths at which SGLang handed a Mamba
            state to the tree (:attr:`engines.sglang_replay.RequestHit.mamba_inserts`).
        sglang_kv_in_tree: per request, the KV the tree holds of ``prompt + output`` after
            its finish.
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
    strategy: str = "no_buffer"
    sglang_mamba_inserts: list[list[int]] = dataclasses.field(default_factory=list)
    sglang_kv_in_tree: list[int] = dataclasses.field(default_factory=list)

    def differing(self) -> list[int]:
        """Indices of the requests whose hits differ."""
        return common.differing(self.hyckpt, self.sglang)


def compare(
    budget_bytes: int,
    seed: int = 1,
    requests: int | None = None,
    ssm_dtype: str = "model",
    tree_core: str | None = None,
    token_budget: int | None = None,
    strategy: str = "no_buffer",
    mamba_chunk_size: int | None = None,
    model: str | None = None,
    workload: str | None = None,
    block_size: int | None = None,
) -> Comparison:
    """Run both on the scenario's workload at ``budget_bytes`` (``strategy``: SGLang's
    Mamba strategy; hyckpt's side is that strategy's preset, :data:`PRESET_OF_STRATEGY`)."""
    from engines import sglang_replay
    from sim.engine.presets import sglang_mamba_chunk_size

    ours = common.replay_hyckpt(
        scenario(
            budget_bytes,
            seed,
            requests,
            ssm_dtype,
            token_budget,
            strategy,
            model,
            workload,
            block_size,
        )
    )
    hybrid = sglang_replay.HybridModel.from_hyckpt(ours.model, "model")
    replayed = sglang_replay.replay(
        hybrid,
        common.to_replay_requests(ours.items),
        budget_bytes,
        ours.config.token_budget,
        tree_core=tree_core,
        strategy=strategy,
        mamba_chunk_size=mamba_chunk_size or sglang_mamba_chunk_size(ours.model),
    )
    theirs = [h.hit_tokens for h in replayed.hits]
    return Comparison(
        budget_bytes=budget_bytes,
        request_ids=ours.request_ids,
        prompt_tokens=ours.prompt_tokens,
        hyckpt=ours.hits,
        sglang=theirs,
        sglang_full_kv=[h.full_kv_hit for h in replayed.hits],
        hyckpt_rate=ours.rate(ours.hits),
        sglang_rate=ours.rate(theirs),
        hyckpt_totals_rate=float(ours.result.totals["token_hit_rate"]),
        hyckpt_s=ours.seconds,
        sglang_s=replayed.seconds,
        plan=dataclasses.asdict(replayed.plan),
        hyckpt_pool={k: v for k, v in ours.result.pools.items() if k != "memory"},
        tree_core=replayed.tree_core,
        strategy=strategy,
        sglang_mamba_inserts=[list(h.mamba_inserts) for h in replayed.hits],
        sglang_kv_in_tree=[h.kv_in_tree for h in replayed.hits],
    )


def report(comparison: Comparison, show: int, out: TextIO) -> None:
    """Print one budget's comparison."""
    c, plan = comparison, comparison.plan
    diff = c.differing()
    common.print_budget(c.budget_bytes, out)
    print(
        f"  SGLang: {plan['max_mamba_cache_size']} Mamba slots of {plan['per_req_bytes']} bytes "
        f"(SSM state {plan['ssm_state_dtype']}), {plan['max_total_num_tokens']} KV tokens, "
        f"{c.tree_core}, {c.strategy}; hyckpt: {c.hyckpt_pool['checkpoint_slots']} checkpoint "
        f"slots of {c.hyckpt_pool['checkpoint_slot_bytes']} bytes, {c.hyckpt_pool['kv_blocks']} KV "
        f"blocks of {c.hyckpt_pool['block_size']} tokens",
        file=out,
    )
    rates = (c.hyckpt_rate, c.hyckpt_totals_rate, c.sglang_rate)
    common.print_rates(
        "SGLang", rates, len(c.request_ids), len(diff), (c.hyckpt_s, c.sglang_s), out
    )
    for i in diff[:show]:
        print(
            f"    #{i} {c.request_ids[i]}: prompt {c.prompt_tokens[i]}, hyckpt {c.hyckpt[i]}, "
            f"SGLang {c.sglang[i]} (SGLang's KV matched {c.sglang_full_kv[i]})",
            file=out,
        )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The command (module docstring); exit 0 when every hit agrees, 1 otherwise."""
    parser = common.fidelity_parser(
        "python -m engines.sglang_fidelity",
        __doc__,
        budgets=[2.0, 5.0, 10.0],
        show=5,
        ssm_dtype="sglang",
    )
    parser.add_argument("--tree-core", choices=("rust", "python"), default=None)
    parser.add_argument(
        "--token-budget", type=int, default=None, help="prefill chunk (default: the scenario's)"
    )
    parser.add_argument(
        "--strategy",
        choices=("no_buffer", "extra_buffer"),
        default="no_buffer",
        help="SGLang's Mamba radix-cache strategy (hyckpt: sglang / sglang-extra-buffer)",
    )
    parser.add_argument(
        "--mamba-chunk-size",
        type=int,
        default=None,
        help="the model's mamba_chunk_size (extra_buffer; default: the preset's for the model)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="a shipped Mamba2 + attention model (default: the scenario's, nemotron-h-8b)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write per-request hits")
    args = parser.parse_args(argv)
    stream = out or sys.stdout
    return common.run_budgets(
        args.budget_gib,
        lambda budget: compare(
            budget,
            args.seed,
            args.requests,
            args.ssm_dtype,
            args.tree_core,
            args.token_budget,
            args.strategy,
            args.mamba_chunk_size,
            args.model,
            args.workload,
        ),
        lambda comparison: report(comparison, args.show, stream),
        args.json,
    )


if __name__ == "__main__":
    raise SystemExit(main())
