"""Mixed workloads in a scenario file: ``[[workload.mix]]`` components, checked and built.

Each component is a table with ``generator`` (a name of
:data:`sim.engine.sources.WORKLOAD_NAMES`), an optional ``name`` (the component's name:
its requests' ``kind`` and id prefix, and the seed of its random streams; default: the
generator's name) and optional ``params`` (the generator's configuration fields, as in
``workload.params``). A component's weight in the mix is its **own arrival process**
(``params.arrivals``): :func:`sim.workloads.mix` merges the components' streams by arrival
time, as independent user populations' traffic merges in production, and
``workload.requests`` takes the first requests of the merged stream. Each component's
count parameter (``num_requests`` or ``num_sessions``) defaults to ``workload.requests``,
so that no component runs dry before the merged stream has its requests; a component may
set a smaller count of its own (a finite batch).

:func:`check_mix` validates a mix and names the key path of each problem
(``workload.mix[2].params.num_templates``); :func:`build_mix` makes its request stream.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reference.errors import HyckptError, InvalidConfigError
from sim.engine.sequence import RequestLike
from sim.engine.sources import COUNT_FIELDS, WORKLOAD_NAMES, canonical_name
from sim.scenarios.schema import MISSING, ScenarioError, suggestion

__all__ = [
    "COMPONENT_KEYS",
    "MixComponent",
    "build_mix",
    "check_mix",
    "mix_components",
]

#: The keys of a ``[[workload.mix]]`` table.
COMPONENT_KEYS = ("generator", "name", "params")
#: Component ``params`` keys that other keys set (key -> the key to set instead; ``{at}``
#: is the component's own key path, ``workload.mix[i]``).
RESERVED_PARAMS = {
    "name": "{at}.name",
    "seed": "scenario.seed (or scenario.seeds)",
    "requests": "workload.requests",
}


@dataclass(frozen=True)
class MixComponent:
    """One component of a mixed workload.

    Attributes:
        generator: the generator's name (canonical, not an alias).
        name: the component's name (distinct within the mix).
        params: fields of the generator's configuration (``workload.mix[i].params``).
    """

    generator: str
    name: str
    params: Mapping[str, Any]


def mix_components(tables: Sequence[Mapping[str, Any]]) -> tuple[MixComponent, ...]:
    """The components of a ``workload.mix`` array that :func:`check_mix` accepted."""
    out: list[MixComponent] = []
    for table in tables:
        generator = canonical_name(table["generator"])
        name = table.get("name", generator)
        out.append(MixComponent(generator, name, dict(table.get("params", {}))))
    return tuple(out)


def build_mix(
    components: Sequence[MixComponent], requests: int, seed: int
) -> tuple[Callable[[], Iterator[RequestLike]], dict[str, object]]:
    """A factory of the first ``requests`` requests of the mix and its description.

    Every component is seeded with ``seed``; its streams are its own (they derive from
    its name), so adding or changing one component never changes another's requests.

    Raises:
        InvalidConfigError: a bad parameter, a name or id-space clash; while streaming, a
            mix that yields no request.
    """
    from sim.workloads import make_workload, mix

    workloads = []
    for component in components:
        params = copy.deepcopy(dict(component.params))
        params.setdefault(COUNT_FIELDS[component.generator], requests)
        workloads.append(make_workload(component.generator, seed, name=component.name, **params))
    merged = mix(*workloads)
    why = "mix component(s) " + ", ".join(repr(c.name) for c in components) + " generated none"

    def stream() -> Iterator[RequestLike]:
        return _at_least_one(itertools.islice(iter(merged), requests), why)

    description: dict[str, object] = {
        "name": "mix",
        "kind": "mix",
        "seed": seed,
        "requests": requests,
        "components": [
            {
                "name": component.name,
                "generator": component.generator,
                "config": _fields(workload.config),
            }
            for component, workload in zip(components, workloads, strict=True)
        ],
    }
    return stream, description


def _at_least_one(requests: Iterator[RequestLike], why: str) -> Iterator[RequestLike]:
    """``requests``, or an :class:`InvalidConfigError` saying ``why`` when it is empty."""
    first = next(requests, None)
    if first is None:
        raise InvalidConfigError(f"no requests to simulate: {why}")
    yield first
    yield from requests


def _fields(config: object) -> dict[str, str]:
    """``repr`` of every field of a configuration dataclass (as a run describes it)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return {}
    return {f.name: repr(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}


def _start(components: Sequence[MixComponent], requests: int, seed: int) -> None:
    """Build the mix and make its first request (see ``loader._start``)."""
    stream, _ = build_mix(components, requests, seed)
    next(iter(stream()))


def check_mix(
    tables: Sequence[Mapping[str, Any]], requests: int, seed: int, where: str
) -> tuple[MixComponent, ...]:
    """Validate a ``workload.mix`` array (an array of tables, as
    :func:`sim.scenarios.schema.mix_tables` checks it)
    and start it once; return its components.

    Raises:
        ScenarioError: an unknown key or generator (with a "did you mean"), a bad or
            repeated name, a reserved or invalid parameter (named
            ``workload.mix[i].params.<key>`` when it is wrong on its own), two components
            in one segment id space, or a component or mix that yields no request.
    """
    from sim.workloads import default_id_space

    components: list[MixComponent] = []
    named: dict[str, int] = {}
    spaces: dict[int, int] = {}
    for index, table in enumerate(tables):
        at = f"workload.mix[{index}]"
        for key, value in table.items():
            if key not in COMPONENT_KEYS:
                known = list(COMPONENT_KEYS)
                raise ScenarioError(
                    where,
                    f"{at}.{key}",
                    value,
                    f"a key of [[workload.mix]] ({', '.join(known)}){suggestion(key, known)}",
                )
        component = _component(table, at, where)
        if component.name in named:
            raise ScenarioError(
                where,
                f"{at}.name",
                component.name,
                f"a name no other component has (workload.mix[{named[component.name]}] is "
                f"{component.name!r} too); components of one generator need a name each",
            )
        named[component.name] = index
        _check_component(component, requests, seed, where, at)
        space = component.params.get("id_space", default_id_space(component.name))
        if space in spaces:
            other = spaces[space]
            raise ScenarioError(
                where,
                f"{at}.name",
                component.name,
                f"a component whose segment id space differs from workload.mix[{other}]'s "
                f"({space}); rename one, or set params.id_space",
            )
        spaces[space] = index
        components.append(component)
    try:
        _start(components, requests, seed)
    except HyckptError as error:
        raise ScenarioError(
            where, "workload.mix", list(tables), f"a mix that yields requests ({error})"
        ) from None
    return tuple(components)


def _component(table: Mapping[str, Any], at: str, where: str) -> MixComponent:
    """The component of one ``[[workload.mix]]`` table, its keys' types checked."""
    generator = table.get("generator")
    if not isinstance(generator, str) or generator not in WORKLOAD_NAMES:
        hint = suggestion(generator, list(WORKLOAD_NAMES)) if isinstance(generator, str) else ""
        found: object = generator if "generator" in table else MISSING
        raise ScenarioError(
            where, f"{at}.generator", found, f"one of {', '.join(WORKLOAD_NAMES)}{hint}"
        )
    canonical = canonical_name(generator)
    name = table.get("name", canonical)
    if not isinstance(name, str) or not name or "/" in name:
        raise ScenarioError(
            where,
            f"{at}.name",
            name,
            "a non-empty string without '/' (the component's name: its requests' kind and "
            "id prefix)",
        )
    params = table.get("params", {})
    if not isinstance(params, dict):
        raise ScenarioError(
            where,
            f"{at}.params",
            params,
            "a table of the generator's configuration fields (docs/WORKLOADS.md)",
        )
    for key, owner in RESERVED_PARAMS.items():
        if key in params:
            raise ScenarioError(
                where,
                f"{at}.params.{key}",
                params[key],
                f"no {key!r} here: it is reserved, set {owner.format(at=at)} instead",
            )
    return MixComponent(canonical, name, dict(params))


def _check_component(
    component: MixComponent, requests: int, seed: int, where: str, at: str
) -> None:
    """Start ``component`` alone; a failure names the parameter that is wrong on its own,
    else the component's ``params`` table (a cross-field problem)."""
    try:
        _start([component], requests, seed)
    except HyckptError as error:
        for key, value in component.params.items():
            alone = MixComponent(component.generator, component.name, {key: value})
            try:
                _start([alone], 1, seed)
            except HyckptError as single:
                expected = f"a valid parameter ({single})"
                raise ScenarioError(where, f"{at}.params.{key}", value, expected) from None
        raise ScenarioError(
            where, f"{at}.params", dict(component.params), f"valid parameters ({error})"
        ) from None
