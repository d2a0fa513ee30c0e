"""``max_model_len``: the prompts an engine refuses and where its output stops.

vLLM 0.33 refuses a prompt of ``max_model_len`` tokens or more and stops a request at
``max_model_len`` tokens in all; SGLang 0.5.23 refuses a prompt of ``context_len - 6`` or
more and stops at ``context_len - 2`` (sim/engine/length_limits.py cites the code). Both
take the limit from the model's ``max_position_embeddings`` by default, as the presets do.
The cases are worked out by hand from those rules.
"""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from sim.cli import main as cli_main
from sim.engine import SimConfig, run_simulation
from sim.engine.length_limits import LengthLimits
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads.prompt import Prompt
from sim.workloads.request import Request

CONFIG = SimConfig(kv_blocks=256, checkpoint_slots=8, token_budget=512, max_num_seqs=4)


def request(name: str, segment: int, prompt: int, output: int, at: float) -> Request:
    return Request(f"{name}/0", at, name, 0, Prompt([(segment, prompt)]), output, (0,), "x")


def test_each_rule_s_limits() -> None:
    vllm = LengthLimits.of(dataclasses.replace(CONFIG, max_model_len=100))
    sglang = LengthLimits.of(dataclasses.replace(CONFIG, max_model_len=100, length_limits="sglang"))
    assert LengthLimits.of(CONFIG) is None
    assert vllm == LengthLimits(prompt_limit=100, sequence_limit=100)
    assert sglang == LengthLimits(prompt_limit=94, sequence_limit=98)
    assert vllm is not None and sglang is not None
    assert vllm.refuses(100) and not vllm.refuses(99) and vllm.output_room(99) == 1
    assert sglang.refuses(94) and not sglang.refuses(93) and sglang.output_room(93) == 5


#: (prompt, output) -> (refused, output served), max_model_len = 100, by each rule:
#: vLLM: prompts below 100, prompt + output <= 100; SGLang: prompts below 94,
#: prompt + output <= 98.
CASES = {
    "vllm": {
        (100, 5): (True, 0),
        (99, 5): (False, 1),
        (40, 60): (False, 60),
        (40, 61): (False, 60),
        (93, 10): (False, 7),
    },
    "sglang": {
        (100, 5): (True, 0),
        (94, 5): (True, 0),
        (93, 10): (False, 5),
        (40, 58): (False, 58),
        (40, 59): (False, 58),
    },
}


@pytest.mark.parametrize("mode", ["engine", "replay"])
@pytest.mark.parametrize("rule", ["vllm", "sglang"])
def test_requests_are_refused_and_cut_by_each_engine_s_rule(mode: str, rule: str) -> None:
    config = dataclasses.replace(CONFIG, max_model_len=100, length_limits=rule, mode=mode)
    cases = CASES[rule]
    requests = [
        request(f"r{i}", i, prompt, output, 100.0 * i) for i, (prompt, output) in enumerate(cases)
    ]
    result = run_simulation(config, requests)
    totals = result.totals
    refused = sum(1 for was_refused, _ in cases.values() if was_refused)
    cut = sum(
        1
        for (_, output), (was_refused, served) in cases.items()
        if not was_refused and served < output
    )
    assert result.ok
    assert totals["requests"]["rejected"] == refused
    assert totals["requests"]["finished"] == len(cases) - refused
    assert totals["requests"]["length_capped"] == cut
    assert totals["decode_tokens"] == sum(served for _, served in cases.values())


def test_without_a_limit_requests_longer_than_the_model_s_context_are_counted() -> None:
    # Nemotron-H-8B's context is 8,192 tokens: 8,000 + 192 fits, 8,000 + 193 does not.
    fits, over = request("fits", 1, 8000, 192, 0.0), request("over", 2, 8000, 193, 100.0)
    config = dataclasses.replace(CONFIG, kv_blocks=2048)
    result = run_simulation(config, [fits, over])
    assert result.totals["requests"]["over_model_context"] == 1
    assert result.totals["requests"]["finished"] == 2
    assert "length_capped" not in result.totals["requests"]
    limited = run_simulation(dataclasses.replace(config, max_model_len=8192), [fits, over])
    assert limited.totals["requests"]["length_capped"] == 1
    assert "over_model_context" not in limited.totals["requests"]
    within = run_simulation(config, [fits])
    assert set(within.totals["requests"]) == {
        "arrived",
        "admitted",
        "finished",
        "rejected",
        "with_hit",
    }  # nothing over: the result is what it was before the key existed


def scenario(text: str) -> object:
    base = '[scenario]\nname = "limits"\n[workload]\ngenerator = "multi_turn_chat"\nrequests = 5\n'
    return build_scenario(tomllib.loads(base + text), "limits.toml", None, base_dir=None)


def test_a_scenario_sets_it_in_tokens_or_as_the_model_s_context() -> None:
    assert scenario("").sim_config.max_model_len is None  # type: ignore[attr-defined]
    as_model = scenario('[engine]\nmax_model_len = "model"')
    assert as_model.sim_config.max_model_len == 8192  # type: ignore[attr-defined]
    given = scenario('[engine]\nmax_model_len = 4096\nlength_limits = "sglang"')
    config = given.sim_config  # type: ignore[attr-defined]
    assert (config.max_model_len, config.length_limits) == (4096, "sglang")
    with pytest.raises(ScenarioError, match=r"engine\.max_model_len.*no max_position_embeddings"):
        scenario('[model]\nname = "jamba-v0.1"\n[engine]\nmax_model_len = "model"')
    for bad in ('"long"', "1", "true", "4096.0"):
        with pytest.raises(ScenarioError, match=r"engine\.max_model_len"):
            scenario(f"[engine]\nmax_model_len = {bad}")
    with pytest.raises(ScenarioError, match=r"engine\.length_limits"):
        scenario('[engine]\nlength_limits = "trt"')


@pytest.mark.parametrize(
    ("engine", "rule"),
    [("vllm", "vllm"), ("sglang", "sglang"), ("sglang-no-buffer", "sglang"), ("marconi", None)],
)
def test_the_engine_presets_take_the_model_s_context(engine: str, rule: str | None) -> None:
    config = scenario(f'[cache]\nengine = "{engine}"\ncache_budget_bytes = 4294967296')
    sim = config.sim_config  # type: ignore[attr-defined]
    if rule is None:  # Marconi's simulator has no context window
        assert sim.max_model_len is None
        return
    assert (sim.max_model_len, sim.length_limits) == (8192, rule)
    own = scenario(
        f'[cache]\nengine = "{engine}"\ncache_budget_bytes = 4294967296\n'
        "[engine]\nmax_model_len = 32768"
    )
    assert own.sim_config.max_model_len == 32768  # type: ignore[attr-defined]  # the file wins
    undescribed = scenario(
        f'[model]\nname = "jamba-v0.1"\n[cache]\nengine = "{engine}"\n'
        "cache_budget_bytes = 17179869184"
    )
    assert undescribed.sim_config.max_model_len is None  # type: ignore[attr-defined]


def test_the_command_line_takes_it_and_warns_without_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--workload", "document-qa", "--requests", "3"]
    assert cli_main([*argv, "--max-model-len", "model"]) == 0
    out, err = capsys.readouterr()
    assert "KV blocks of 16 tokens, max_model_len 8192 (vllm's rule); backend" in out
    assert "0 requests finished, 3 rejected" in out  # every document is over 8,192 tokens
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    assert "WARNING: 3 of 3 requests are longer (prompt + output) than nemotron-h-8b's" in err
    assert "--max-model-len model" in err
    assert cli_main([*argv, "--model", "jamba-v0.1", "--max-model-len", "model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyckpt: error: --max-model-len model: jamba-v0.1's description")
    assert cli_main([*argv, "--max-model-len", "lots"]) == 2
    assert "expected 'model' or a number of tokens" in capsys.readouterr().err
    assert cli_main([*argv, "--max-model-len", "1"]) == 2  # named by its option
    assert capsys.readouterr().err.startswith("hyckpt: error: --max-model-len must be an int")


def test_a_request_the_pool_refuses_is_not_counted_as_cut() -> None:
    # max_model_len 100 cuts 60 + 50 to 60 + 40, whose 99 fed tokens need 7 blocks of 16:
    # a pool of 4 refuses it, and it counts as rejected only.
    config = dataclasses.replace(CONFIG, kv_blocks=4, max_model_len=100)
    result = run_simulation(config, [request("a", 1, 60, 50, 0.0)])
    requests = result.totals["requests"]
    assert (requests["rejected"], requests["length_capped"]) == (1, 0)
