"""The workload registry, :func:`make_workload`, :func:`mix` and :func:`measure_workload`."""

from __future__ import annotations

import dataclasses
import difflib
import heapq
import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from reference.errors import InvalidConfigError
from sim.workloads._checks import check_int, check_name, fail
from sim.workloads.arrivals import arrivals_from_spec
from sim.workloads.dists import IntDist, TimeDist
from sim.workloads.generators import (
    AgenticConfig,
    ChatConfig,
    DocumentQAConfig,
    FewShotConfig,
    SharedSystemPromptConfig,
    agentic_loop,
    few_shot_branching,
    long_document_qa,
    multi_turn_chat,
    shared_system_prompt,
)
from sim.workloads.request import Request, Workload
from sim.workloads.retrieval import RetrievalConfig, retrieval_qa
from sim.workloads.traces import jsonl_trace, mooncake_trace

__all__ = [
    "WORKLOADS",
    "WorkloadFactory",
    "WorkloadRate",
    "make_workload",
    "measure_workload",
    "mix",
    "workload_rate",
]


class WorkloadFactory(Protocol):
    """Builds a workload from a seed and keyword parameters (see :func:`make_workload`)."""

    def __call__(self, seed: int = 0, /, **params: Any) -> Workload: ...


def _coerce(owner: str, field: str, default: object, value: object) -> object:
    """Turn scenario-file values (mappings, lists) into the field's type."""
    if not isinstance(value, Mapping | list):
        return value
    try:
        if field == "arrivals":
            return arrivals_from_spec(dict(value) if isinstance(value, Mapping) else value)
        if isinstance(default, IntDist | TimeDist) and isinstance(value, Mapping):
            return type(default)(**value)
    except InvalidConfigError as error:
        raise InvalidConfigError(f"{owner}.{field}: {error}") from None
    except TypeError as error:
        expected = f"valid parameters of {type(default).__name__} ({error})"
        raise fail(owner, field, value, expected) from None
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    return value


def _config(config_type: type[Any], params: Mapping[str, Any]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(config_type) if f.init}
    owner = config_type.__name__
    values: dict[str, Any] = {}
    for key, value in params.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidConfigError(
                f"{owner} has no parameter {key!r} (known: {', '.join(sorted(fields))}, "
                f"name, id_space){hint}"
            )
        values[key] = _coerce(owner, key, fields[key].default, value)
    return config_type(**values)


def _generator(
    generator: Callable[..., Workload], config_type: type[Any], default_name: str
) -> WorkloadFactory:
    def factory(seed: int = 0, /, **params: Any) -> Workload:
        name = params.pop("name", default_name)
        id_space = params.pop("id_space", None)
        return generator(seed, _config(config_type, params), name=name, id_space=id_space)

    factory.__doc__ = f"{default_name}: parameters are the fields of {config_type.__name__}."
    return factory


def _trace(replay: Callable[..., Workload], default_name: str) -> WorkloadFactory:
    def factory(seed: int = 0, /, **params: Any) -> Workload:
        if "path" not in params:
            raise InvalidConfigError(f"{default_name} needs a path parameter (the trace file)")
        path = params.pop("path")
        try:
            return replay(path, **params)
        except TypeError as error:
            raise InvalidConfigError(f"{default_name}: bad parameters ({error})") from None

    factory.__doc__ = f"{default_name}: replays the trace at path (the seed is unused)."
    return factory


#: Workload factories by name: ``factory(seed, **params) -> Workload``.
WORKLOADS: dict[str, WorkloadFactory] = {
    "multi_turn_chat": _generator(multi_turn_chat, ChatConfig, "multi_turn_chat"),
    "shared_system_prompt": _generator(
        shared_system_prompt, SharedSystemPromptConfig, "shared_system_prompt"
    ),
    "agentic_loop": _generator(agentic_loop, AgenticConfig, "agentic_loop"),
    "few_shot_branching": _generator(few_shot_branching, FewShotConfig, "few_shot_branching"),
    "long_document_qa": _generator(long_document_qa, DocumentQAConfig, "long_document_qa"),
    "retrieval_qa": _generator(retrieval_qa, RetrievalConfig, "retrieval_qa"),
    "jsonl_trace": _trace(jsonl_trace, "jsonl_trace"),
    "mooncake_trace": _trace(mooncake_trace, "mooncake_trace"),
}

#: The configuration dataclass of each generator (its fields are the parameters).
CONFIG_TYPES: dict[str, type[Any]] = {
    "multi_turn_chat": ChatConfig,
    "shared_system_prompt": SharedSystemPromptConfig,
    "agentic_loop": AgenticConfig,
    "few_shot_branching": FewShotConfig,
    "long_document_qa": DocumentQAConfig,
    "retrieval_qa": RetrievalConfig,
}

#: The count parameter of each generator (requests, or sessions of one or more requests).
_COUNT_PARAMETER = {
    "multi_turn_chat": "num_sessions",
    "shared_system_prompt": "num_requests",
    "agentic_loop": "num_sessions",
    "few_shot_branching": "num_requests",
    "long_document_qa": "num_requests",
    "retrieval_qa": "num_requests",
}


def make_workload(name: str, seed: int = 0, /, **params: Any) -> Workload:
    """The workload registered as ``name``, seeded with ``seed``.

    ``name`` and ``seed`` are positional-only, so ``params`` may hold a component
    ``name`` of its own: ``make_workload("multi_turn_chat", 1, name="chat-a")``.

    ``params`` are the fields of the generator's configuration dataclass (mappings are
    accepted for :class:`~sim.workloads.dists.IntDist`, :class:`~sim.workloads.dists.TimeDist`
    and ``arrivals`` fields, lists for tuples, as a TOML scenario gives them), plus
    ``name`` (component name) and ``id_space``. Trace formats take ``path`` and their
    keyword options.

    Raises:
        InvalidConfigError: unknown workload or parameter, or a bad value.
    """
    factory = WORKLOADS.get(name)
    if factory is None:
        close = difflib.get_close_matches(str(name), list(WORKLOADS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidConfigError(
            f"unknown workload {name!r} (known: {', '.join(sorted(WORKLOADS))}){hint}"
        )
    return factory(seed, **params)


def mix(*workloads: Workload, name: str = "mix") -> Workload:
    """Merge workloads by arrival time (``heapq.merge``; ties keep argument order).

    Components keep their own streams: changing one never changes another's requests.
    Their names (hence request ids) and segment id spaces must be distinct, so requests
    of different components never share ids or prompt content by accident.

    Raises:
        InvalidConfigError: no workloads, a non-workload, or a name/id-space clash (give
            the component another ``name`` or an explicit ``id_space``).
    """
    check_name("mix", "name", name)
    if not workloads:
        raise fail("mix", "workloads", workloads, "at least one Workload")
    components: list[tuple[str, int]] = []
    for workload in workloads:
        if not isinstance(workload, Workload):
            raise fail("mix", "workloads", workload, "a Workload")
        components.extend(workload.components)
    names: dict[str, int] = {}
    spaces: dict[int, str] = {}
    for component, space in components:
        if component in names:
            raise InvalidConfigError(
                f"mix has two components named {component!r}; give one another name="
            )
        if space in spaces:
            raise InvalidConfigError(
                f"mix components {spaces[space]!r} and {component!r} share segment id space "
                f"{space}; pass another id_space= to one of them"
            )
        names[component], spaces[space] = space, component
    parts = tuple(workloads)

    def make() -> Iterator[Request]:
        return heapq.merge(*(iter(part) for part in parts), key=attrgetter("arrival_s"))

    return Workload(
        name=name, kind="mix", seed=None, config=None, make=make, components=tuple(components)
    )


@dataclass(frozen=True, slots=True)
class WorkloadRate:
    """How fast a workload's request metadata is generated (no tokens materialised).

    Attributes:
        workload: registry name.
        requests: requests generated.
        prompt_tokens: sum of their prompt lengths, in tokens.
        seconds: wall-clock seconds (``time.perf_counter``).
    """

    workload: str
    requests: int
    prompt_tokens: int
    seconds: float

    @property
    def requests_per_s(self) -> float:
        """Requests generated per second."""
        return self.requests / self.seconds if self.seconds > 0 else float("inf")

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens described per second."""
        return self.prompt_tokens / self.seconds if self.seconds > 0 else float("inf")


def measure_workload(name: str, n: int, /, *, seed: int = 0, **params: Any) -> WorkloadRate:
    """Generate ``n`` requests of workload ``name`` (metadata only) and time it.

    For generators the count parameter defaults to ``n`` (so the stream is long enough);
    other ``params`` go to :func:`make_workload`.
    """
    check_int("measure_workload", "n", n, minimum=1)
    count = _COUNT_PARAMETER.get(name)
    if count is not None:
        params.setdefault(count, n)
    workload = make_workload(name, seed, **params)
    requests = tokens = 0
    begin = time.perf_counter()
    for request in itertools.islice(workload, n):
        requests += 1
        tokens += len(request.prompt)
    seconds = time.perf_counter() - begin
    return WorkloadRate(name, requests, tokens, seconds)


def workload_rate(name: str, n: int, /, **params: Any) -> float:
    """Requests per second generating ``n`` requests of ``name`` (see :func:`measure_workload`)."""
    return measure_workload(name, n, **params).requests_per_s
