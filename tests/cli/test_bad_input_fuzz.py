"""Bad input of every kind gives a clean, typed error that says what was wrong and what to
do, and changes no state (issue 21, item 3).

One section per entry point: trace readers, arrival processes, storage sizing, the
protocol client's timeout, the protocol server's size limits, and a scenario file with a
key given twice.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.conformance.protocol import ALL_OPS, ProtocolError, parse_response, request_line
from reference.conformance.protocol_client import (
    MAX_TIMEOUT_S,
    TIMEOUT_VAR,
    Connection,
    connect,
    timeout_from_environment,
)
from reference.conformance.protocol_client import implementation as protocol_implementation
from reference.conformance.protocol_server import (
    MAX_CAPACITY,
    MAX_PROMPT_TOKENS,
    Session,
    reference_implementation,
)
from reference.errors import (
    AllocationTooLargeError,
    HyckptError,
    ImplementationLoadError,
    InvalidConfigError,
)
from reference.state import LiveState
from reference.storage import MAX_STORAGE_BYTES, ReferenceStorage, bytes_per_slot
from sim.scenarios.loader import load_scenario
from sim.scenarios.schema import ScenarioError
from sim.workloads import jsonl_trace, mooncake_trace
from sim.workloads._checks import MAX_TIME_S
from sim.workloads.arrivals import (
    MAX_RATE_PER_S,
    MIN_CV,
    MIN_RATE_PER_S,
    Bursty,
    Poisson,
    TraceArrivals,
    arrivals_from_spec,
)
from sim.workloads.errors import TraceFormatError

SILENT = [sys.executable, "-c", "import time; time.sleep(60)"]  # never reads, never answers

# --- 1. trace readers: times are bounded ----------------------------------------------


def _session_line(ts: object, turn: int, session: str = "s") -> str:
    return json.dumps(
        {"session_id": session, "turn_id": turn, "ts": ts, "input_tokens": 8, "output_tokens": 4}
    )


def _mooncake_line(timestamp: object) -> str:
    return json.dumps(
        {"timestamp": timestamp, "input_length": 8, "output_length": 4, "hash_ids": [1]}
    )


def _write(folder: str, lines: list[str]) -> str:
    path = Path(folder) / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


#: Finite times beyond the limit, both ways, up to the largest float.
beyond = st.floats(min_value=MAX_TIME_S * 1.0000001, max_value=sys.float_info.max)
signed_beyond = st.tuples(beyond, st.booleans()).map(lambda pair: -pair[0] if pair[1] else pair[0])


@settings(max_examples=40)
@given(data=st.data())
def test_a_trace_time_beyond_the_limit_is_a_located_error(data: st.DataObject) -> None:
    """A ``ts`` (seconds) or ``timestamp`` (milliseconds) beyond 1e12 s raises a
    TraceFormatError naming the file, the line, the field and the limit; the lines
    before it were replayed with finite times."""
    mooncake = data.draw(st.booleans(), label="mooncake format")
    good = data.draw(st.integers(0, 3), label="good lines before the bad one")
    seconds = data.draw(signed_beyond, label="bad time in seconds")
    if mooncake:
        bad = seconds * 1000.0 if math.isfinite(seconds * 1000.0) else seconds
        lines = [_mooncake_line(n * 10) for n in range(good)] + [_mooncake_line(bad)]
    else:
        bad = seconds
        lines = [_session_line(n, n) for n in range(good)] + [_session_line(bad, good)]
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, lines)
        workload = mooncake_trace(path) if mooncake else jsonl_trace(path)
        stream = iter(workload)
        replayed = [next(stream) for _ in range(good)]
        with pytest.raises(TraceFormatError) as caught:
            next(stream)
    error = caught.value
    field = "timestamp" if mooncake else "ts"
    assert (error.path, error.line, error.field, error.value) == (path, good + 1, field, bad)
    assert isinstance(error, InvalidConfigError) and isinstance(error, HyckptError)
    limit = "1e+15] milliseconds" if mooncake else "1e+12] seconds"
    assert f"{path}:{good + 1}: field {field!r}: expected a time in [-" in str(error)
    assert limit in str(error) and "overflow" in str(error)
    assert all(math.isfinite(request.arrival_s) for request in replayed)


@settings(max_examples=30)
@given(
    ts=st.integers(int(MAX_TIME_S) + 1, 10**500),
    negative=st.booleans(),
)
def test_a_json_integer_time_too_large_for_a_float_is_a_located_error(
    ts: int, negative: bool
) -> None:
    """An integer of hundreds of digits is out of range too, not an OverflowError."""
    value = -ts if negative else ts
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, [_session_line(value, 0)])
        with pytest.raises(TraceFormatError) as caught:
            list(jsonl_trace(path))
    assert (caught.value.line, caught.value.field, caught.value.value) == (1, "ts", value)
    assert "expected a time in [-1e+12, 1e+12] seconds" in str(caught.value)


@pytest.mark.parametrize("mooncake", [False, True], ids=["sessions", "mooncake"])
def test_trace_times_at_the_limit_give_finite_arrivals(tmp_path: Path, mooncake: bool) -> None:
    scale = 1000.0 if mooncake else 1.0
    times = [-MAX_TIME_S * scale, 0.0, MAX_TIME_S * scale]
    if mooncake:
        lines = [_mooncake_line(t) for t in times]
    else:
        lines = [_session_line(t, 0, session=f"s{n}") for n, t in enumerate(times)]
    path = _write(str(tmp_path), lines)
    workload = mooncake_trace(path) if mooncake else jsonl_trace(path)
    assert [r.arrival_s for r in workload] == [0.0, MAX_TIME_S, 2 * MAX_TIME_S]


@pytest.mark.parametrize("trace_format", ["sessions", "mooncake"])
def test_simulate_reports_a_huge_trace_time_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trace_format: str
) -> None:
    from sim.cli import main

    if trace_format == "mooncake":
        lines = [_mooncake_line(0), _mooncake_line(1e308)]
    else:
        lines = [_session_line(-1e308, 0), _session_line(1e308, 1)]
    path = _write(str(tmp_path), lines)
    code = main(["simulate", "--trace", path, "--trace-format", trace_format, "--requests", "5"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err and "OverflowError" not in err
    assert f"{path}:" in err and "expected a time in [-" in err


# --- 2. arrival processes: rates, cv, unit and times are bounded ---------------------

too_slow = st.floats(min_value=5e-324, max_value=MIN_RATE_PER_S, exclude_max=True)
too_fast = st.floats(min_value=MAX_RATE_PER_S, max_value=sys.float_info.max, exclude_min=True)


@given(rate=st.one_of(too_slow, too_fast), bursty=st.booleans())
def test_an_arrival_rate_outside_the_bounds_is_refused(rate: float, bursty: bool) -> None:
    owner = "Bursty" if bursty else "Poisson"
    with pytest.raises(InvalidConfigError) as caught:
        Bursty(rate, 2.0) if bursty else Poisson(rate)
    message = str(caught.value)
    assert message.startswith(f"{owner}.rate_per_s must be between 1e-06 and 1e+06 arrivals")
    assert message.endswith(f", got {rate!r}")
    with pytest.raises(InvalidConfigError, match="rate_per_s must be between"):
        arrivals_from_spec({"kind": owner.lower(), "rate_per_s": rate})


@given(
    huge=st.integers(10**309, 10**600),
    which=st.sampled_from(["poisson", "bursty rate", "bursty cv", "times_s", "unit_s"]),
)
def test_an_integer_parameter_too_large_for_a_float_is_refused(huge: int, which: str) -> None:
    """Not an OverflowError from ``float()``."""
    build: dict[str, Callable[[], object]] = {
        "poisson": lambda: Poisson(huge),
        "bursty rate": lambda: Bursty(huge),
        "bursty cv": lambda: Bursty(1.0, huge),
        "times_s": lambda: TraceArrivals(times_s=(huge,)),
        "unit_s": lambda: TraceArrivals(times_s=(1.0,), unit_s=huge),
    }
    with pytest.raises(InvalidConfigError, match=r"must be a finite number"):
        build[which]()


def test_the_zero_rate_keeps_its_message() -> None:
    with pytest.raises(InvalidConfigError, match=r"Poisson.rate_per_s must be a finite number > 0"):
        Poisson(0)


@given(
    cv=st.floats(min_value=5e-324, max_value=MIN_CV, exclude_max=True),
)
def test_a_bursty_cv_below_the_minimum_is_refused(cv: float) -> None:
    with pytest.raises(InvalidConfigError, match=r"Bursty.cv must be >= 0.001 \(the gamma shape"):
        Bursty(1.0, cv)


@settings(max_examples=30)
@given(
    rate=st.sampled_from([MIN_RATE_PER_S, 1.0, MAX_RATE_PER_S]),
    cv=st.sampled_from([MIN_CV, 1.0, 100.0]),
    seed=st.integers(0, 2**32),
)
def test_arrivals_at_the_bounds_are_finite_and_ordered(rate: float, cv: float, seed: int) -> None:
    import itertools
    import random

    for process in (Poisson(rate), Bursty(rate, cv)):
        times = list(itertools.islice(process.times(random.Random(seed)), 50))
        assert all(math.isfinite(t) for t in times)
        assert times == sorted(times)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TraceArrivals(times_s=(0.0, 2e12)), r"times_s\[1\] must be <= 1e\+12 seconds"),
        (lambda: TraceArrivals(times_s=(1.0,), unit_s=1e-12), r"unit_s must be between 1e-09"),
        (lambda: TraceArrivals(times_s=(1.0,), unit_s=1e300), r"unit_s must be between 1e-09"),
    ],
    ids=["time", "tiny unit", "huge unit"],
)
def test_trace_arrival_parameters_are_bounded(build: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        build()


def test_a_trace_arrival_line_beyond_the_limit_is_located(tmp_path: Path) -> None:
    path = tmp_path / "arrivals.jsonl"
    path.write_text('{"t": 5}\n{"t": 1e13}\n', encoding="utf-8")
    times = TraceArrivals(path=str(path), field="t", unit_s=1.0).times(None)  # type: ignore[arg-type]
    assert next(times) == 0.0
    with pytest.raises(TraceFormatError) as caught:
        next(times)
    assert (caught.value.line, caught.value.field, caught.value.value) == (2, "t", 1e13)
    assert "units of 1 s (1e+12 s either way" in str(caught.value)


# --- 3. storage sizing --------------------------------------------------------------


def _live(width: int = 4, pages: int = 3) -> LiveState:
    return LiveState({"0.ssm": torch.zeros(2, width)}, {"3.k": torch.zeros(pages, 4, 1, 2)})


def _storages() -> list[Any]:
    factories: list[Any] = [ReferenceStorage]
    try:
        from gpu.storage import GpuStorage
    except ImportError:  # no Triton: the reference alone
        return factories
    return [*factories, GpuStorage]


#: The storage classes to check: the reference, and the GPU layer's (a subclass that
#: builds its slabs the same way) when Triton is installed.
STORAGES = pytest.mark.parametrize(
    "storage_class", _storages(), ids=lambda factory: factory.__name__
)


@STORAGES
@settings(max_examples=40)
@given(data=st.data())
def test_storage_beyond_the_cap_is_refused_before_allocating(
    data: st.DataObject, storage_class: Any
) -> None:
    width = data.draw(st.integers(1, 64), label="recurrent width")
    live = _live(width)
    per = bytes_per_slot(live)
    cheapest = min(per.recurrent_total, per.partial_kv_total) + 8
    slots = data.draw(st.integers(MAX_STORAGE_BYTES // cheapest + 1, 10**15), label="slots")
    axis = data.draw(st.sampled_from(["recurrent", "partial"]), label="axis")
    recurrent, partial = (slots, 0) if axis == "recurrent" else (0, slots)
    made: list[torch.Tensor] = []
    real_zeros = torch.zeros

    def counting_zeros(*args: Any, **kwargs: Any) -> torch.Tensor:
        made.append(real_zeros(*args, **kwargs))
        return made[-1]

    torch.zeros = counting_zeros  # type: ignore[assignment]
    try:
        with pytest.raises(AllocationTooLargeError) as caught:
            storage_class(live, recurrent, partial)
    finally:
        torch.zeros = real_zeros
    assert not made, "nothing may be allocated before the size is checked"
    message = str(caught.value)
    assert isinstance(caught.value, InvalidConfigError)
    assert f"recurrent_slots={recurrent} and partial_kv_slots={partial} would need " in message
    assert f"more than the {MAX_STORAGE_BYTES} bytes (1 TiB)" in message
    assert "pass fewer slots" in message


@STORAGES
@pytest.mark.parametrize("failing_call", [1, 2, 3])
def test_an_allocation_the_device_refuses_is_typed_and_leaves_nothing_allocated(
    monkeypatch: pytest.MonkeyPatch, storage_class: Any, failing_call: int
) -> None:
    """torch's allocator raising RuntimeError on the n-th slab: a typed error, and every
    slab allocated before it is freed at once."""
    live = LiveState(
        {"0.ssm": torch.zeros(2, 4)},
        {"3.k": torch.zeros(3, 4, 1, 2)},
        {"3.k": torch.zeros(3, 4, 1, 2)},
    )
    made: list[weakref.ref[torch.Tensor]] = []
    real_zeros = torch.zeros

    def failing_zeros(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(made) + 1 == failing_call:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore text")
        tensor = real_zeros(*args, **kwargs)
        made.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(torch, "zeros", failing_zeros)
    with pytest.raises(AllocationTooLargeError) as caught:
        storage_class(live, 5, 7)
    monkeypatch.undo()
    assert len(made) == failing_call - 1
    assert all(ref() is None for ref in made), "a slab allocated before the failure is alive"
    message = str(caught.value)
    assert "recurrent_slots=5 and partial_kv_slots=7 need " in message
    assert "could not be allocated (CUDA out of memory. Tried to allocate 20.00 GiB)" in message
    assert caught.value.__context__ is None and caught.value.__cause__ is None


@STORAGES
def test_a_storage_at_a_normal_size_still_builds(storage_class: Any) -> None:
    storage = storage_class(_live(), 3, 2)
    assert storage.recurrent_slot_count() == 3 and storage.partial_kv_slot_count() == 2


def test_make_storage_of_the_reference_refuses_1e12_slots() -> None:
    from reference.impl import implementation

    make_storage = implementation().make_storage
    assert make_storage is not None
    with pytest.raises(AllocationTooLargeError, match="recurrent_slots=1000000000000"):
        make_storage(_live(), 10**12, 0)


# --- 4. protocol client: a server that never answers -------------------------------


def _within(seconds: float, call: Callable[[], object]) -> object:
    """Run ``call`` in a thread; it must end within ``seconds``. Returns what it returned
    or raised."""
    ended: list[object] = []

    def target() -> None:
        try:
            ended.append(call())
        except BaseException as error:  # handed to the test thread
            ended.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    (outcome,) = ended
    return outcome


def test_a_read_without_an_answer_times_out_and_kills_the_server() -> None:
    connection = Connection(SILENT, timeout_s=0.3)
    started = time.monotonic()
    error = _within(20, lambda: connection.call("hello"))
    assert time.monotonic() - started < 10
    assert isinstance(error, ProtocolError)
    assert "no response within 0.3 s" in str(error)
    assert "is still running, so it was stopped" in str(error)
    assert f"set {TIMEOUT_VAR} to wait longer" in str(error)
    assert connection._process.poll() is not None, "the server was left running"
    again = _within(20, lambda: connection.call("hello"))  # the dead server fails at once
    assert isinstance(again, ProtocolError)
    connection.close()


def test_a_server_that_stops_reading_times_out_on_send() -> None:
    """A request larger than the pipe buffer to a server that reads nothing: a plain
    write would block for ever."""
    connection = Connection(SILENT, timeout_s=0.3)
    huge = {"client": "x" * (1 << 20)}
    error = _within(20, lambda: connection.call("hello", huge))
    assert isinstance(error, ProtocolError)
    assert "the server took no more of hello within 0.3 s" in str(error)
    assert connection._process.poll() is not None
    connection.close()


def test_connect_reads_the_timeout_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``connect`` (what ``hyckpt replay-vectors --command`` uses) honours
    ``$HYCKPT_PROTOCOL_TIMEOUT`` instead of waiting its 120 s default."""
    monkeypatch.setenv(TIMEOUT_VAR, "0.4")
    error = _within(20, lambda: connect(SILENT))
    assert isinstance(error, ImplementationLoadError)
    assert "failed the hello: no response within 0.4 s" in str(error)


def test_replay_vectors_against_an_engine_that_never_answers_ends(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sim.cli import main

    monkeypatch.setenv(TIMEOUT_VAR, "0.4")
    command = f"{sys.executable} -c 'import time; time.sleep(60)'"
    code = _within(30, lambda: main(["replay-vectors", "vectors", "--command", command]))
    assert code == 2
    err = capsys.readouterr().err
    assert "no response within 0.4 s" in err and "Traceback" not in err


def test_a_server_that_hangs_after_hello_stops_the_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reference.conformance.vectors_replay import ConnectionTarget, load_directory, replay

    hello = {
        "version": 1,
        "name": "hangs",
        "capabilities": ["two-phase-publish", "pin", "invalidate"],
        "placement_policies": sorted(reference_implementation().placement_policies),
        "eviction_policies": sorted(reference_implementation().eviction_policies),
        "ops": list(ALL_OPS),
    }
    script = (
        "import json, sys, time\n"
        "raw = sys.stdin.readline()\n"
        f"hello = {hello!r}\n"
        "print(json.dumps({'v': 1, 'id': json.loads(raw)['id'], 'ok': True, 'result': hello}))\n"
        "sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setenv(TIMEOUT_VAR, "0.4")
    target = ConnectionTarget([sys.executable, "-c", script])
    try:
        report = replay(load_directory(Path("vectors")), target)
    finally:
        target.close()
    assert "no response within 0.4 s" in report.stopped
    assert target.connection._process.poll() is not None


@pytest.mark.parametrize("text", ["abc", "0", "-1", "nan", "inf", "1e7", "1,5"])
def test_a_bad_timeout_variable_is_a_load_error(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(TIMEOUT_VAR, text)
    with pytest.raises(ImplementationLoadError) as caught:
        timeout_from_environment()
    assert f"{TIMEOUT_VAR} must be a number of seconds in (0, 1e+06], got {text!r}" in str(
        caught.value
    )
    with pytest.raises(ImplementationLoadError, match=TIMEOUT_VAR):
        protocol_implementation(SILENT)


@given(timeout=st.one_of(st.floats(max_value=0.0), st.floats(min_value=MAX_TIMEOUT_S * 1.01)))
def test_a_bad_timeout_argument_is_a_config_error(timeout: float) -> None:
    with pytest.raises(InvalidConfigError, match=r"timeout_s must be a number of seconds"):
        Connection(SILENT, timeout_s=timeout)


# --- 5. protocol server: sizes are bounded before allocating -------------------------


def _ask(session: Session, op: str, args: dict[str, Any], request_id: int = 1) -> Any:
    return parse_response(session.handle_line(request_line(request_id, op, args)))


def _state(session: Session, index: int) -> tuple[object, ...]:
    free = _ask(session, "index.free_count", {"index": index}).value()
    slot = _ask(session, "index.slot_state", {"index": index, "slot": 0}).value()
    return (session._next_handle, sorted(session._indexes), free, slot)


@pytest.fixture
def served() -> Iterator[tuple[Session, int]]:
    session = Session(reference_implementation())
    index = _ask(session, "index.new", {"capacity": 4}).value()["index"]
    reservation = _ask(
        session,
        "index.reserve",
        {"index": index, "namespace": "m", "prompt": [1] * 32, "tokens": 16},
    ).value()
    assert reservation["type"] == "reservation"
    yield session, index


@settings(max_examples=30)
@given(capacity=st.integers(MAX_CAPACITY + 1, 2**64))
def test_index_new_beyond_the_limit_is_typed_and_changes_nothing(capacity: int) -> None:
    session = Session(reference_implementation())
    index = _ask(session, "index.new", {"capacity": 2}).value()["index"]
    before = _state(session, index)
    response = _ask(session, "index.new", {"capacity": capacity})
    assert not response.ok and response.error_type == "AllocationTooLargeError"
    assert f"capacity={capacity} is more than the {MAX_CAPACITY} slots" in response.message
    assert "pass a smaller capacity" in response.message
    assert _state(session, index) == before


@settings(max_examples=30)
@given(data=st.data())
def test_placement_beyond_the_prompt_limit_is_typed(data: st.DataObject) -> None:
    session = Session(reference_implementation())
    prompt_len = data.draw(st.integers(MAX_PROMPT_TOKENS + 1, 2**63 - 1), label="prompt_len")
    start = data.draw(st.integers(0, prompt_len - 1), label="start")
    end = data.draw(st.integers(start + 1, prompt_len), label="end")
    chunk = {"start": start, "end": end, "prompt_len": prompt_len}
    response = _ask(
        session,
        "placement.positions",
        {"policy": "interval", "params": {"hash_unit": 1, "every": 1}, "chunk": chunk},
    )
    assert not response.ok and response.error_type == "AllocationTooLargeError"
    assert f"chunk.prompt_len={prompt_len} is more than the {MAX_PROMPT_TOKENS}" in response.message
    rows = data.draw(st.integers(1, 3), label="rows")
    response = _ask(
        session,
        "placement.vllm_align_batch",
        {
            "params": {"block_size": 16, "hash_unit": 16},
            "seq_lens": [16] * (rows - 1) + [prompt_len],
            "query_lens": [1] * rows,
        },
    )
    assert not response.ok and response.error_type == "AllocationTooLargeError"
    assert f"seq_lens[{rows - 1}]={prompt_len}" in response.message


def test_the_limits_themselves_are_served(served: tuple[Session, int]) -> None:
    session, _ = served
    chunk = {
        "start": MAX_PROMPT_TOKENS - 20,
        "end": MAX_PROMPT_TOKENS,
        "prompt_len": MAX_PROMPT_TOKENS,
    }
    response = _ask(
        session,
        "placement.positions",
        {"policy": "block-floor", "params": {"block_size": 16}, "chunk": chunk},
    )
    assert response.ok and response.value() == [MAX_PROMPT_TOKENS - 16]


def test_the_server_survives_a_memory_error(served: tuple[Session, int]) -> None:
    session, index = served

    def no_memory(*args: object, **kwargs: object) -> Any:
        raise MemoryError

    session.implementation = dataclasses.replace(session.implementation, make_index=no_memory)
    before = _state(session, index)
    response = _ask(session, "index.new", {"capacity": 8})
    assert not response.ok and response.error_type == "AllocationTooLargeError"
    assert "index.new: the server ran out of memory answering it; ask for less" in response.message
    assert _state(session, index) == before


def test_the_client_raises_the_limit_as_its_class() -> None:
    """Through a real server process: the typed error crosses the wire, and the server
    keeps serving."""
    impl = protocol_implementation([sys.executable, "-m", "reference.conformance.protocol_server"])
    with pytest.raises(AllocationTooLargeError, match="capacity=1000000000000"):
        impl.make_index(10**12)
    assert impl.make_index(3).free_count() == 3


# --- 6. a scenario file with a key given twice ---------------------------------------

MINIMAL = '[workload]\ngenerator = "chat"\nrequests = 4\n'


@pytest.mark.parametrize(
    ("text", "key", "found"),
    [
        (
            "[cache]\nblock_size = 16\nblock_size = 32\n",
            "cache.block_size",
            "a second value on line 3",
        ),
        ('scenario.name = "a"\nscenario.name = "b"\n', "scenario.name", "a second value on line 2"),
        (
            "[cache]\r\nblock_size = 16\r\nblock_size = 32\r\n",
            "cache.block_size",
            "a second value on line 3",
        ),
        (
            "[engine] # e\nmax_num_seqs = 4\n  max_num_seqs=5 # again\n",
            "engine.max_num_seqs",
            "a second value on line 3",
        ),
        (
            "[cache]\nblock_size = 16\n[cache]\nhash_unit = 16\n",
            "cache",
            "a second [cache] table on line 3",
        ),
        (
            "[a]\nx = 1\n[b]\ny = 1\n[a.c]\nz = 1\nz = [\n  1,\n]\n",
            "a.c.z",
            "a second value on line 9",
        ),
        ("[w]\np = { a = 1, a = 2 }\n", "w.p", "a second value for 'a' on line 2"),
        (
            "[cache]\n\"block size\" = 1\n'block size' = 2\n",
            'cache."block size"',
            "a second value on line 3",
        ),
    ],
    ids=["key", "dotted", "crlf", "comments", "table", "multi-line value", "inline", "quoted"],
)
def test_a_key_given_twice_is_named_with_its_line(
    tmp_path: Path, text: str, key: str, found: str
) -> None:
    path = tmp_path / "my.toml"
    path.write_text(text, encoding="utf-8", newline="")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{path}: {key}: found {found}, expected each ")


#: Tables and keys of real scenario files, to build files with one key repeated.
KEYS = {
    "scenario": ["name", "seed", "description"],
    "cache": ["block_size", "hash_unit", "checkpoint_slots", "token_budget"],
    "engine": ["max_num_seqs", "spec_tokens", "sample_interval_s"],
    "placement": ["policy"],
    "eviction": ["policy"],
}


@settings(max_examples=60)
@given(data=st.data())
def test_a_random_file_with_a_key_repeated_names_it(data: st.DataObject) -> None:
    tables = data.draw(
        st.lists(st.sampled_from(sorted(KEYS)), min_size=1, max_size=5, unique=True),
        label="tables",
    )
    lines: list[str] = []
    entries: list[tuple[str, str, int]] = []  # (table, key, index in lines after it)
    for table in tables:
        lines.append(f"[{table}]")
        keys = data.draw(
            st.lists(st.sampled_from(KEYS[table]), min_size=1, unique=True), label=f"{table} keys"
        )
        for key in keys:
            if data.draw(st.booleans(), label="comment line"):
                lines.append("# a comment = 1")
            lines.append(f"{key} = {data.draw(st.integers(0, 99), label='value')}")
            entries.append((table, key, len(lines)))
        if data.draw(st.booleans(), label="blank line"):
            lines.append("")
    table, key, after = data.draw(st.sampled_from(entries), label="repeated key")
    section_end = after
    while section_end < len(lines) and not lines[section_end].startswith("["):
        section_end += 1
    where = data.draw(st.integers(after, section_end), label="position of the repeat")
    lines.insert(where, f'{key} = "again"')
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "my.toml"
        path.write_text("\n".join(lines) + "\n" + MINIMAL, encoding="utf-8")
        with pytest.raises(ScenarioError) as caught:
            load_scenario(path)
    assert caught.value.key == f"{table}.{key}"
    assert f"found a second value on line {where + 1}, expected each key once" in str(caught.value)


@pytest.mark.parametrize(
    "text", ["[cache\n", "a = \n", "a = {x=1}\na.y = 2\n"], ids=["header", "value", "inline"]
)
def test_other_toml_errors_keep_their_message(tmp_path: Path, text: str) -> None:
    path = tmp_path / "my.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.key == "(file)"
    assert caught.value.expected.startswith("valid UTF-8 TOML (")
    assert "(at line" in caught.value.expected


def test_a_duplicate_key_error_pickles(tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "my.toml"
    path.write_text("[cache]\nblock_size = 16\nblock_size = 32\n", encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    again = pickle.loads(pickle.dumps(caught.value))
    assert str(again) == str(caught.value) and again.key == "cache.block_size"


def test_a_reference_index_of_1e12_slots_is_a_typed_error() -> None:
    from reference.errors import AllocationTooLargeError
    from reference.index import MAX_CAPACITY, ReferenceIndex

    with pytest.raises(AllocationTooLargeError, match="use fewer slots"):
        ReferenceIndex(10**12)
    assert ReferenceIndex(MAX_CAPACITY // 64).capacity == MAX_CAPACITY // 64
