"""``client_max_tokens`` (``[workload] max_tokens``, ``--max-tokens``): the ``max_tokens``
clients send, and what SGLang's admission reserves by it (SEMANTICS H9k), worked by hand
from SGLang 0.5.23's ``Scheduler.init_req_max_new_tokens`` (``srt/managers/scheduler.py``)
and ``PrefillAdder`` (``srt/managers/schedule_policy.py``), ``B = 16``.

``tests/tooling/test_sglang_fidelity.py`` checks :func:`sglang_max_new_tokens` against
SGLang's own ``init_req_max_new_tokens``.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest

from reference.errors import InvalidConfigError
from sim.cli import main as cli_main
from sim.engine import SimConfig
from sim.engine.backends import make_backend
from sim.engine.decode_reservation import UNSET_MAX_NEW_TOKENS, output_left
from sim.engine.replay import Replayer
from sim.engine.scheduler import Engine
from sim.scenarios.loader import build_scenario
from sim.scenarios.schema import ScenarioError
from tests.sim.test_sim_engine import assert_clean
from tests.sim.test_sim_preemption import chat
from tests.sim.test_sim_sglang_retraction import BASE, BatchRecorder

#: 16 blocks of 16 tokens (256), SGLang's reservation, one step at a time.
SMALL = dataclasses.replace(
    BASE, kv_blocks=16, decode_reservation="sglang", fuse_decode_steps=False
)


class ArrivalRecorder(Engine):
    """The engine, recording each request's output and ``max_new_tokens`` on arrival."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.arrived: dict[str, tuple[int, int]] = {}

    def _arrive(self, index: int, request: object, arrival_s: float) -> None:
        super()._arrive(index, request, arrival_s)  # type: ignore[arg-type]
        seq = self.waiting[-1]
        self.arrived[seq.request_id] = (seq.output_tokens, seq.max_new_tokens)


@pytest.mark.parametrize(
    ("asked", "changes", "expected", "capped"),
    [
        # The default: a benchmark client asks for exactly its answer's 100 tokens.
        ("answer", {}, (100, 100), 0),
        # No max_tokens: 1 << 30, capped at what an empty pool leaves, 256 - 16 - 1 - 1.
        ("unset", {}, (100, 238), 0),
        # ... and at what the context leaves (SGLang: max_model_len - 2 - prompt = 110).
        ("unset", {"max_model_len": 128, "length_limits": "sglang"}, (100, 110), 0),
        # Without SGLang's reservation the pool is not counted (nothing reads the value).
        ("unset", {"decode_reservation": "none"}, (100, UNSET_MAX_NEW_TOKENS), 0),
        (200, {}, (100, 200), 0),
        # A client cap below the answer cuts it there.
        (30, {}, (30, 30), 1),
    ],
)
def test_max_new_tokens_is_what_the_client_asked_capped_as_sglang_caps_it(
    asked: int | str, changes: dict[str, object], expected: tuple[int, int], capped: int
) -> None:
    config = dataclasses.replace(SMALL, client_max_tokens=asked, **changes)  # type: ignore[arg-type]
    engine = ArrivalRecorder(config, [chat("a", 1, 16, 100)], make_backend("shadow", None))
    engine.run()
    assert_clean(engine)
    assert engine.arrived["a/0"] == expected
    assert engine.metrics.requests_length_capped == capped
    assert engine.metrics.decode_tokens == expected[0]  # every output token counts


def steps_of(asked: int | str) -> BatchRecorder:
    engine = BatchRecorder(
        dataclasses.replace(SMALL, client_max_tokens=asked),
        [chat("a", 1, 16, 100), chat("b", 2, 48, 20)],
        make_backend("shadow", None),
    )
    engine.run()
    assert_clean(engine)
    return engine


def test_the_reservation_holds_room_for_what_clients_ask_not_what_they_get() -> None:
    # a (16 tokens, 100 output) and b (48, 20) arrive together into 16 blocks (256).
    # - answer: step 1 admits a, then b: 48 + 20 + 1 = 69 < 240 free - a's page and whole
    #   output (its prefill completes this step), 240 - 101 = 139. Both in step 1.
    # - max_tokens 200: a asks 200 (16 + 200 + 1 = 217 < 256: in). b needs 48 + 200 + 1
    #   = 249, the room is 240 - 201 = 39; later, at most 224 free less a's output left
    #   times the ratio: b waits for a to finish, its 100 tokens decoded, whatever the
    #   ratio. It goes in the step after a's last decode.
    assert steps_of("answer").steps[0] == (1, ["a/0", "b/0"], [])
    engine = steps_of(200)
    first_b = next(step for step, prefills, _ in engine.steps if "b/0" in prefills)
    last_a = max(step for step, _, decodes in engine.steps if "a/0" in decodes)
    assert engine.steps[0] == (1, ["a/0"], [])
    assert last_a == 100 and first_b == last_a + 1
    # unset: a asks 238 (16 + 238 + 1 = 255 < 256), b 206: the same wait.
    engine = steps_of("unset")
    assert next(step for step, prefills, _ in engine.steps if "b/0" in prefills) == 101


def test_output_left_and_the_ratio_after_a_retraction_read_max_new_tokens() -> None:
    # SGLang's reservation takes min(max_new_tokens - outputs, 4096), and its ratio after a
    # retraction (outputs + 20 each) / (sum of max_new_tokens + 1).
    from sim.engine.decode_reservation import NewTokenRatio
    from sim.engine.sequence import Seq

    seqs = [Seq(chat(name, 1, 16, 100), 0, 16, 100, max_new_tokens=5000) for name in "ab"]
    seqs[0].generated, seqs[1].generated = 30, 1000
    assert [output_left(seq) for seq in seqs] == [4096, 4000]  # 4970 clipped; 4000
    ratio = NewTokenRatio()
    ratio.after_retraction(seqs, 10)
    assert ratio.at(10) == (30 + 1000 + 40) / (10_000 + 1)


def test_a_replay_cuts_answers_at_max_tokens_too() -> None:
    config = dataclasses.replace(
        SMALL, decode_reservation="none", mode="replay", client_max_tokens=30
    )
    engine = Replayer(
        config, [chat("a", 1, 16, 100), chat("b", 2, 16, 10)], make_backend("shadow", None)
    )
    engine.run()
    assert engine.metrics.requests_length_capped == 1
    assert engine.metrics.decode_tokens == 30 + 10


@pytest.mark.parametrize("value", ["all", 0, -3, True, 1.5, [1]])
def test_a_bad_client_max_tokens_is_an_error(value: object) -> None:
    with pytest.raises(InvalidConfigError, match="client_max_tokens"):
        SimConfig(client_max_tokens=value)  # type: ignore[arg-type]


SCENARIO = """
[scenario]
name = "t"
[workload]
generator = "chat"
requests = 3
max_tokens = {value}
"""


@pytest.mark.parametrize(("value", "expected"), [('"unset"', "unset"), ("512", 512)])
def test_the_scenario_key_reaches_the_config(value: str, expected: object) -> None:
    def config_of(text: str) -> SimConfig:
        return build_scenario(tomllib.loads(text), "t.toml", None, base_dir=None).sim_config

    assert config_of(SCENARIO.format(value=value)).client_max_tokens == expected
    left_out = SCENARIO.format(value="1").replace("max_tokens", "# max_tokens")
    assert config_of(left_out).client_max_tokens == "answer"


@pytest.mark.parametrize("value", ['"none"', "0", "true", "2.5"])
def test_a_bad_scenario_value_names_the_file_and_the_key(value: str) -> None:
    data = tomllib.loads(SCENARIO.format(value=value))
    with pytest.raises(ScenarioError) as caught:
        build_scenario(data, "t.toml", None, base_dir=None)
    message = str(caught.value)
    assert "t.toml" in message and "workload.max_tokens" in message
    assert '"answer", "unset" or an integer >= 1' in message


def test_the_command_line_takes_max_tokens(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    out = f"{tmp_path}/r.json"
    argv = ["simulate", "--requests", "4", "--quiet", "--max-tokens", "8", "--json", out]
    assert cli_main(argv) == 0
    with open(out) as handle:
        result = json.load(handle)
    assert result["config"]["client_max_tokens"] == 8
    assert result["totals"]["requests"]["length_capped"] >= 1
    assert cli_main(["simulate", "--requests", "4", "--quiet", "--max-tokens", "lots"]) == 2
    assert "expected 'answer' or 'unset' or a number of tokens" in capsys.readouterr().err
