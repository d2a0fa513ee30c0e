"""What the two fidelity checks (:mod:`engines.fidelity` for vLLM,
:mod:`engines.sglang_fidelity` for SGLang) share: hyckpt's side of the comparison and the
command around it.

Each check replays the shipped ``engine-presets`` scenario's workload twice, through
hyckpt's public API with the engine's preset and through the engine's own cache code
(:mod:`engines.vllm_replay`, :mod:`engines.sglang_replay`), and compares the hits request
by request. Only the engine's side differs; this module holds the rest:

- the scenario at a budget and its workload (:func:`engine_presets_scenario`,
  :func:`workload`), and the workload as the replays' requests (:func:`to_replay_requests`);
- hyckpt's replay with a backend that records each request's hit (:class:`HitRecorder`,
  :func:`run_hyckpt`, :func:`replay_hyckpt`);
- comparing and printing (:func:`differing`, :func:`print_budget`, :func:`print_rates`)
  and the command's arguments and loop over budgets (:func:`fidelity_parser`,
  :func:`run_budgets`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from engines.replay_common import ReplayRequest
from sim.engine.backends.shadow import ShadowBackend
from sim.engine.config import MAX_MODEL_LEN
from sim.workloads.registry import CONFIG_TYPES

GIB = 1 << 30
#: The scenario whose workload, model and engine presets are compared.
SCENARIO = "engine-presets"


class HitRecorder(ShadowBackend):
    """The shadow backend, also recording each request's prompt length and the hit
    (tokens) of its first admission: the per-request hit, which ``SimResult`` does not
    carry (a resumption's hit, after a preemption, is not its first)."""

    def __init__(self, implementation: Any) -> None:
        super().__init__(implementation)
        self.prompt_tokens: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        self.admissions: dict[str, int] = {}

    def start(self, request: Any, batch_slot: int) -> None:
        super().start(request, batch_slot)
        self.prompt_tokens.setdefault(request.request_id, len(request.prompt))
        self.admissions[request.request_id] = self.admissions.get(request.request_id, 0) + 1

    def restore(
        self, request_id: str, batch_slot: int, slot: int, tokens: int, block_table: Sequence[int]
    ) -> None:
        super().restore(request_id, batch_slot, slot, tokens, block_table)
        if self.admissions.get(request_id) == 1:
            self.hits.setdefault(request_id, tokens)


#: The drivers serve every request whole (vLLM's with ``max_model_len`` twice the
#: longest request, SGLang's without a context check), so the presets' context limit
#: (the model's ``max_position_embeddings``) is lifted on hyckpt's side too: long
#: documents are compared past Nemotron-H-8B's 8,192 tokens.
NO_CONTEXT_LIMIT = MAX_MODEL_LEN


def engine_presets_scenario(
    budget_bytes: int,
    seed: int,
    requests: int | None,
    *,
    engine: str | None = None,
    token_budget: int | None = None,
    float32_state: bool = False,
    model: str | None = None,
    workload: str | None = None,
) -> Any:
    """The ``engine-presets`` scenario at ``budget_bytes`` for ``seed``.

    Args:
        requests: the workload's requests (``None``: the scenario's).
        model: a shipped model's name (``model.name``; ``None``: the scenario's).
        engine: the preset (``cache.engine``; ``None``: the scenario's).
        token_budget: the prefill chunk (``None``: the scenario's).
        float32_state: store the SSM state in float32 (``cache.ssm_state_dtype``: the
            engines' default for Nemotron-H); ``False``: in the model's own dtype.
        workload: another generator's traffic, with its default parameters
            (``workload.generator``; ``None``: the scenario's multi-turn chat).
    """
    from sim.scenarios.command import resolve

    base = resolve(SCENARIO, check_sweep=False)
    overrides: dict[str, object] = {}
    if engine is not None:
        overrides["cache.engine"] = engine
    overrides["cache.cache_budget_bytes"] = budget_bytes
    overrides["scenario.seed"] = seed
    if requests is not None:
        overrides["workload.requests"] = requests
    if token_budget is not None:
        overrides["cache.token_budget"] = token_budget
    if model is not None:
        overrides["model.name"] = model
    if workload is not None:
        overrides["workload.generator"] = workload
        overrides["workload.params"] = {}
    # The engines' default for Nemotron-H is a float32 state, which the presets choose
    # (docs/SIMULATION.md 1b); "model" keeps the model's own bfloat16 on both sides.
    overrides["cache.ssm_state_dtype"] = "float32" if float32_state else "model"
    overrides["engine.max_model_len"] = NO_CONTEXT_LIMIT
    return base.with_overrides(overrides, check_sweep=False)


def workload(scenario: Any) -> list[Any]:
    """The scenario's requests for its seed, in arrival order."""
    make, _ = scenario.workload.build(scenario.seed)
    return list(make())


def to_replay_requests(requests: Sequence[Any]) -> list[ReplayRequest]:
    """hyckpt requests as the replays' :class:`~engines.replay_common.ReplayRequest`: the
    prompt's token ids and the ``output_tokens`` (at least one, as hyckpt serves) tokens
    of the answer after the prompt, which the next turn's prompt repeats."""
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


@dataclasses.dataclass
class HyckptSide:
    """hyckpt's side of one comparison.

    Attributes:
        items: the workload's requests, in order.
        request_ids, prompt_tokens, hits: per request.
        result: the :class:`~sim.engine.result.SimResult`.
        seconds: wall seconds of the replay.
        config: the scenario's ``SimConfig``.
        model: its :class:`~reference.sizes.ModelSizes`, the state in the engine's dtype.
    """

    items: list[Any]
    request_ids: list[str]
    prompt_tokens: list[int]
    hits: list[int]
    result: Any
    seconds: float
    config: Any
    model: Any

    def rate(self, hits: Sequence[int]) -> float:
        """Token hit rate of ``hits`` (one per request): total hits / total prompt tokens."""
        return sum(hits) / sum(self.prompt_tokens)


def replay_hyckpt(scenario: Any) -> HyckptSide:
    """Build the scenario's workload and replay it through hyckpt (:func:`run_hyckpt`)."""
    items = workload(scenario)
    recorder, result, seconds = run_hyckpt(scenario, items)
    config = scenario.sim_config
    model = config.sizes()  # with the engine's state dtype (cache.ssm_state_dtype)
    ids = [r.request_id for r in items]
    return HyckptSide(
        items=items,
        request_ids=ids,
        prompt_tokens=[len(r.prompt) for r in items],
        hits=[recorder.hits.get(i, 0) for i in ids],
        result=result,
        seconds=seconds,
        config=config,
        model=model,
    )


def differing(ours: Sequence[int], theirs: Sequence[int]) -> list[int]:
    """Indices of the requests whose hits differ."""
    return [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]


def print_budget(budget_bytes: int, out: TextIO) -> None:
    """A comparison's first line: the budget."""
    print(f"budget {budget_bytes / GIB:g} GiB ({budget_bytes} bytes)", file=out)


def print_rates(
    engine: str,
    rates: tuple[float, float, float],
    requests: int,
    differ: int,
    seconds: tuple[float, float],
    out: TextIO,
) -> None:
    """The token hit rates line: ``rates`` = (hyckpt's, ``SimResult.totals``', the
    engine's), ``seconds`` = (hyckpt's, the engine's)."""
    ours, totals, theirs = rates
    print(
        f"  token hit rate: hyckpt {ours:.4f} (totals {totals:.4f}), "
        f"{engine} {theirs:.4f}; requests {requests}, hits differ for {differ}; "
        f"hyckpt {seconds[0]:.1f} s, {engine} {seconds[1]:.1f} s",
        file=out,
    )


def fidelity_parser(
    prog: str, description: str | None, *, budgets: list[float], show: int, ssm_dtype: str
) -> argparse.ArgumentParser:
    """The arguments both commands take (``--requests``, ``--budget-gib``, ``--seed``,
    ``--show``, ``--ssm-dtype model|<ssm_dtype>``, ``--workload``); the caller adds its own
    and ``--json``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--requests", type=int, default=None, help="default: the scenario's")
    parser.add_argument("--budget-gib", type=float, nargs="+", default=budgets)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=show, help="differing requests to print")
    parser.add_argument("--ssm-dtype", choices=("model", ssm_dtype), default=ssm_dtype)
    parser.add_argument(
        "--workload",
        choices=sorted(CONFIG_TYPES),
        default=None,
        help="another generator's traffic, default parameters (default: the scenario's chat)",
    )
    return parser


def run_budgets(
    budgets_gib: Sequence[float],
    compare: Callable[[int], Any],
    report: Callable[[Any], None],
    json_path: Path | None,
) -> int:
    """Compare and report at each budget (GiB), then write every comparison to
    ``json_path`` when given; 0 when every hit agrees, 1 otherwise. A comparison is a
    dataclass with ``differing()``."""
    agree = True
    dump = []
    for gib in budgets_gib:
        comparison = compare(int(gib * GIB))
        report(comparison)
        agree = agree and not comparison.differing()
        dump.append(dataclasses.asdict(comparison))
    if json_path is not None:
        json_path.write_text(json.dumps(dump, indent=1))
    return 0 if agree else 1
