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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

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
    block_size: int | None = None,
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
        block_size: KV block size in tokens (``cache.block_size``; ``None``: the
            preset's).
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
    if block_size is not None:
        overrides["cache.block_size"] = block_size
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


def run_hyckpt_recorded(scenario: Any, items: Sequence[Any]) -> tuple[Any, Any, dict[str, Any]]:
    """hyckpt's timed run of ``items``, recording each step's schedule and each request's
    arrival step and order: ``(recorder, result, record)``."""
    from sim.engine.engine_core import EngineCore
    from sim.engine.planning import Planning

    arrival: dict[str, tuple[int, int]] = {}
    steps: dict[int, dict[str, int]] = {}
    preempted: list[int] = []
    arrive, schedule = EngineCore._arrive, Planning._schedule

    def recording_arrive(self: Any, index: int, request: Any, arrival_s: float) -> None:
        # The request is in the queue the next step plans from.
        arrival.setdefault(request.request_id, (self.step + 1, len(arrival)))
        arrive(self, index, request, arrival_s)

    def recording_schedule(self: Any) -> Any:
        before = self.metrics.preemptions
        plan = schedule(self)
        if self.metrics.preemptions > before:
            preempted.append(plan.step)
        tokens = {seq.request_id: n for seq, n in plan.decodes.items()}
        tokens.update({seq.request_id: c.end - c.start for seq, c in plan.prefills.items()})
        steps[plan.step] = tokens
        return plan

    config = dataclasses.replace(scenario.sim_config, fuse_decode_steps=False)
    unfused = dataclasses.replace(scenario, sim_config=config)
    with (
        mock.patch.object(EngineCore, "_arrive", recording_arrive),
        mock.patch.object(Planning, "_schedule", recording_schedule),
    ):
        recorder, result, _ = run_hyckpt(unfused, items)
    return recorder, result, {"arrival": arrival, "steps": steps, "preempted": preempted}


@dataclasses.dataclass
class TimedComparison:
    """One run's comparison.

    Attributes:
        budget_bytes, rate: the run.
        request_ids, prompt_tokens: per request, in workload order.
        engine: the engine's name, for reports.
        hyckpt_hits, engine_hits: first hit per request.
        hyckpt_steps, engine_steps: step -> request id -> tokens scheduled.
        hyckpt_preemptions, engine_preemptions: totals (SGLang's retractions).
        first_preemption: the first step in which either preempted a request (``None``:
            neither did).
    """

    engine: str
    budget_bytes: int
    rate: float
    request_ids: list[str]
    prompt_tokens: list[int]
    hyckpt_hits: list[int]
    engine_hits: list[int]
    hyckpt_steps: dict[int, dict[str, int]]
    engine_steps: dict[int, dict[str, int]]
    hyckpt_preemptions: int
    engine_preemptions: int
    first_preemption: int | None

    def differing(self) -> list[int]:
        """Indices of the requests whose first hits differ."""
        return differing(self.hyckpt_hits, self.engine_hits)

    def first_differing_step(self) -> int | None:
        """The first step whose schedule differs (``None``: none); a step that schedules
        nothing equals no step (an async scheduler's last call waits for an output)."""
        for step in sorted(set(self.hyckpt_steps) | set(self.engine_steps)):
            if (self.hyckpt_steps.get(step) or {}) != (self.engine_steps.get(step) or {}):
                return step
        return None


def report_timed(comparison: TimedComparison, show: int, out: TextIO) -> None:
    """Print one run's comparison."""
    c = comparison
    diff = c.differing()
    prompt = sum(c.prompt_tokens)
    step = c.first_differing_step()
    print(f"budget {c.budget_bytes / GIB:g} GiB, {c.rate:g} requests/s", file=out)
    print(
        f"  first-hit token rate: hyckpt {sum(c.hyckpt_hits) / prompt:.4f}, {c.engine} "
        f"{sum(c.engine_hits) / prompt:.4f}; requests {len(c.request_ids)}, hits differ for "
        f"{len(diff)}; preemptions hyckpt {c.hyckpt_preemptions}, {c.engine} "
        f"{c.engine_preemptions}; steps hyckpt {len(c.hyckpt_steps)}, {c.engine} "
        f"{len(c.engine_steps)}",
        file=out,
    )
    if c.first_preemption is not None:
        print(f"  first preemption in step {c.first_preemption}", file=out)
    if step is None:
        print("  every step's schedule equal", file=out)
    else:
        ours, theirs = c.hyckpt_steps.get(step, {}), c.engine_steps.get(step, {})
        changed = sorted(
            (rid, ours.get(rid), theirs.get(rid))
            for rid in set(ours) | set(theirs)
            if ours.get(rid) != theirs.get(rid)
        )
        print(
            f"  first differing step {step}: (request, hyckpt, {c.engine}) {changed[:show]}",
            file=out,
        )
    for i in diff[:show]:
        print(
            f"    #{i} {c.request_ids[i]}: prompt {c.prompt_tokens[i]}, hyckpt "
            f"{c.hyckpt_hits[i]}, {c.engine} {c.engine_hits[i]}",
            file=out,
        )


#: The scenario whose traffic the timed comparisons drive.
TIMED_SCENARIO = "engine-presets-timed"


def timed_scenario(
    preset: str,
    budget_bytes: int,
    rate: float,
    seed: int,
    requests: int | None,
    overrides: dict[str, object] | None = None,
    workload: str | None = None,
    model: str | None = None,
) -> Any:
    """The timed scenario (:data:`TIMED_SCENARIO`) with engine ``preset`` at
    ``budget_bytes``, float32 state (both engines' default for Nemotron-H), no context
    limit and Poisson arrivals at ``rate`` per second (``overrides``: more scenario keys,
    e.g. a preset rule turned off; ``workload``: another generator with its default
    parameters; ``model``: another shipped model)."""
    from sim.scenarios.command import resolve

    base = resolve(TIMED_SCENARIO, check_sweep=False)
    params = dict(base.data["workload"].get("params", {})) if workload is None else {}
    params["arrivals"] = {"kind": "poisson", "rate_per_s": rate}
    changes: dict[str, object] = {
        "cache.engine": preset,
        "cache.cache_budget_bytes": budget_bytes,
        "cache.ssm_state_dtype": "float32",
        "scenario.seed": seed,
        "workload.params": params,
        "engine.max_model_len": NO_CONTEXT_LIMIT,
    }
    if requests is not None:
        changes["workload.requests"] = requests
    if workload is not None:
        changes["workload.generator"] = workload
    if model is not None:
        changes["model.name"] = model
    return base.with_overrides(changes | (overrides or {}), check_sweep=False)


@dataclasses.dataclass
class TimedRun:
    """hyckpt's side of a timed comparison, and the engine's input.

    Attributes:
        items: the workload's requests, in order.
        hyckpt: :func:`run_hyckpt_recorded`'s ``(recorder, result, record)``.
        requests: the requests as replay requests, in hyckpt's arrival order.
        arrival_step: request id -> the step before which it arrived in hyckpt.
        longest: the longest request (prompt + output, tokens).
    """

    items: list[Any]
    hyckpt: tuple[Any, Any, dict[str, Any]]
    requests: list[ReplayRequest]
    arrival_step: dict[str, int]
    longest: int


def run_timed_hyckpt(scenario: Any) -> TimedRun:
    """Run hyckpt's timed engine on the scenario's workload, recorded, and lay out what
    the engine's own scheduler is given: the same requests in the same arrival order,
    each added before the same step."""
    from engines.replay_common import longest_request

    items = workload(scenario)
    hyckpt = run_hyckpt_recorded(scenario, items)
    converted = to_replay_requests(items)
    arrival = hyckpt[2]["arrival"]
    return TimedRun(
        items=items,
        hyckpt=hyckpt,
        requests=sorted(converted, key=lambda item: arrival[item.request_id][1]),
        arrival_step={rid: step for rid, (step, _) in arrival.items()},
        longest=max(longest_request(converted), 1),
    )


def timed_comparison(
    engine: str,
    budget_bytes: int,
    rate: float,
    items: Sequence[Any],
    hyckpt: tuple[Any, Any, dict[str, Any]],
    theirs: tuple[Mapping[str, int], dict[int, dict[str, int]], int, list[int]],
) -> TimedComparison:
    """Both sides of a timed run as a :class:`TimedComparison`: ``hyckpt`` is
    :func:`run_hyckpt_recorded`'s ``(recorder, result, record)``, ``theirs`` the engine's
    hits, steps, preemption count and preempting steps."""
    recorder, result, record = hyckpt
    hits, steps, preemptions, preempted_steps = theirs
    ids = [item.request_id for item in items]
    return TimedComparison(
        engine=engine,
        budget_bytes=budget_bytes,
        rate=rate,
        request_ids=ids,
        prompt_tokens=[len(item.prompt) for item in items],
        hyckpt_hits=[recorder.hits.get(rid, 0) for rid in ids],
        engine_hits=[hits.get(rid, 0) for rid in ids],
        hyckpt_steps=record["steps"],
        engine_steps=steps,
        hyckpt_preemptions=int(result.totals["preemptions"]),
        engine_preemptions=preemptions,
        first_preemption=min(record["preempted"][:1] + preempted_steps[:1], default=None),
    )


def timed_parser(prog: str, doc: str, rate: float) -> argparse.ArgumentParser:
    """The options both timed comparisons take (``rate``: the default arrival rate)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--budget-gib", type=float, nargs="+", default=[5.0])
    parser.add_argument("--rate", type=float, nargs="+", default=[rate], help="requests/s")
    parser.add_argument("--requests", type=int, default=None, help="(the scenario's 600)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=8, help="differences printed")
    return parser


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
