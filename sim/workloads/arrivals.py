"""Arrival processes: when sessions (or single requests) start, in seconds.

Each process turns an RNG into a non-decreasing iterator of absolute times in seconds
(the first arrival after time 0 for the random ones). Generators take one as their
``arrivals`` parameter and stop when it runs out or they reach their count.

Bounds: a rate lies in ``[MIN_RATE_PER_S, MAX_RATE_PER_S]`` (one arrival in about 11.6
days to a million per second), a burstiness ``cv`` in ``[MIN_CV, 100]``, every time in
``[0, MAX_TIME_S]`` (1e12 s) and a trace's ``unit_s`` in ``[MIN_UNIT_S, MAX_UNIT_S]``:
beyond them the gaps or times overflow (a rate of ``1e-300`` gives gaps of ``1e300``
seconds) or the draws fail.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

from sim.workloads._checks import MAX_TIME_S, check_float, fail
from sim.workloads._jsonl import get_number, read_objects
from sim.workloads.errors import TraceFormatError

__all__ = ["ArrivalProcess", "Bursty", "Poisson", "TraceArrivals", "arrivals_from_spec"]

#: Slowest arrival rate, per second: one arrival in about 11.6 days on average.
MIN_RATE_PER_S = 1e-6
#: Fastest arrival rate, per second.
MAX_RATE_PER_S = 1e6
#: Smallest ``Bursty.cv``: the gamma shape ``1 / cv**2`` is then 1e6 (nearly evenly
#: spaced arrivals); a much smaller CV makes the shape infinite and the draw fail.
MIN_CV = 1e-3
#: Largest ``Bursty.cv``.
MAX_CV = 100.0
#: Smallest and largest ``TraceArrivals.unit_s`` (seconds per unit of the field): from
#: nanoseconds to days.
MIN_UNIT_S = 1e-9
MAX_UNIT_S = 1e6


def _check_rate(owner: str, value: object) -> float:
    """``value`` as a rate in ``[MIN_RATE_PER_S, MAX_RATE_PER_S]`` arrivals per second."""
    rate = check_float(owner, "rate_per_s", value, strict=True)
    if not MIN_RATE_PER_S <= rate <= MAX_RATE_PER_S:
        raise fail(
            owner,
            "rate_per_s",
            value,
            f"between {MIN_RATE_PER_S:g} and {MAX_RATE_PER_S:g} arrivals per second (one "
            "arrival in about 11.6 days to a million a second; beyond them the arrival "
            "times overflow or their gaps vanish)",
        )
    return rate


@dataclass(frozen=True, slots=True)
class Poisson:
    """Poisson arrivals: exponential inter-arrival times with mean ``1 / rate_per_s``.

    Attributes:
        rate_per_s: arrivals per second, in ``[MIN_RATE_PER_S, MAX_RATE_PER_S]``
            (``[1e-6, 1e6]``).
    """

    rate_per_s: float = 1.0

    def __post_init__(self) -> None:
        _check_rate("Poisson", self.rate_per_s)

    def times(self, rng: random.Random) -> Iterator[float]:
        """Arrival times in seconds."""
        rate, draw, now = self.rate_per_s, rng.expovariate, 0.0
        while True:
            now += draw(rate)
            yield now


@dataclass(frozen=True, slots=True)
class Bursty:
    """Bursty arrivals: gamma inter-arrival times with mean ``1 / rate_per_s`` and CV ``cv``.

    ``cv = 1`` is Poisson; ``cv > 1`` clusters arrivals into bursts separated by lulls
    (gamma shape ``k = 1 / cv**2``, scale ``1 / (rate_per_s * k)``).

    Attributes:
        rate_per_s: mean arrivals per second, in ``[MIN_RATE_PER_S, MAX_RATE_PER_S]``
            (``[1e-6, 1e6]``).
        cv: coefficient of variation of the inter-arrival time, in ``[MIN_CV, MAX_CV]``
            (``[0.001, 100]``).
    """

    rate_per_s: float = 1.0
    cv: float = 2.0

    def __post_init__(self) -> None:
        _check_rate("Bursty", self.rate_per_s)
        cv = check_float("Bursty", "cv", self.cv, strict=True)
        if cv > MAX_CV:
            raise fail("Bursty", "cv", self.cv, f"<= {MAX_CV:g}")
        if cv < MIN_CV:
            raise fail(
                "Bursty",
                "cv",
                self.cv,
                f">= {MIN_CV:g} (the gamma shape 1/cv**2 overflows below it; for evenly "
                "spaced arrivals use a small cv such as 0.01)",
            )

    def times(self, rng: random.Random) -> Iterator[float]:
        """Arrival times in seconds."""
        shape = 1.0 / (self.cv * self.cv)
        scale = 1.0 / (self.rate_per_s * shape)
        draw, now = rng.gammavariate, 0.0
        while True:
            now += draw(shape, scale)
            yield now


@dataclass(frozen=True, slots=True)
class TraceArrivals:
    """Arrival times replayed from a list, or streamed from a JSON-lines file.

    Give either ``times_s`` or ``path``. A file is read one line at a time; each line's
    ``field`` times ``unit_s`` is an arrival time in seconds, shifted so that the first
    line arrives at 0 when ``relative`` is true. Times must not decrease.

    Attributes:
        times_s: arrival times in seconds, non-decreasing, in ``[0, MAX_TIME_S]``
            (``MAX_TIME_S`` = 1e12 s).
        path: a JSON-lines file with one arrival per line; each line's time
            ``field * unit_s`` must lie in ``[-MAX_TIME_S, MAX_TIME_S]`` seconds.
        field: the field holding the time in ``path``'s lines.
        unit_s: seconds per unit of ``field`` (0.001 for milliseconds), in
            ``[MIN_UNIT_S, MAX_UNIT_S]`` (``[1e-9, 1e6]``).
        relative: shift a file's times so that its first arrival is at 0 s.
    """

    times_s: tuple[float, ...] = ()
    path: str | None = None
    field: str = "timestamp"
    unit_s: float = 0.001
    relative: bool = True

    def __post_init__(self) -> None:
        owner = "TraceArrivals"
        if not isinstance(self.times_s, tuple):
            raise fail(owner, "times_s", self.times_s, "a tuple of seconds")
        previous = -math.inf
        for index, value in enumerate(self.times_s):
            number = check_float(owner, f"times_s[{index}]", value)
            if number > MAX_TIME_S:
                raise fail(
                    owner,
                    f"times_s[{index}]",
                    value,
                    f"<= {MAX_TIME_S:g} seconds (a later time would overflow the "
                    "simulation's clock)",
                )
            if number < previous:
                raise fail(owner, f"times_s[{index}]", value, f">= the previous time {previous}")
            previous = number
        if self.path is not None and (not isinstance(self.path, str | os.PathLike) or self.times_s):
            raise fail(owner, "path", self.path, "a file path, given without times_s")
        if self.path is not None and not os.path.isfile(self.path):
            raise fail(owner, "path", self.path, "an existing file")
        if self.path is None and not self.times_s:
            raise fail(owner, "times_s", self.times_s, "non-empty when no path is given")
        if not isinstance(self.field, str) or not self.field:
            raise fail(owner, "field", self.field, "a non-empty field name")
        unit = check_float(owner, "unit_s", self.unit_s, strict=True)
        if not MIN_UNIT_S <= unit <= MAX_UNIT_S:
            raise fail(
                owner,
                "unit_s",
                self.unit_s,
                f"between {MIN_UNIT_S:g} and {MAX_UNIT_S:g} seconds per unit (0.001 for "
                "milliseconds, 1.0 for seconds)",
            )

    def times(self, rng: random.Random) -> Iterator[float]:
        """Arrival times in seconds (``rng`` is unused: a trace is deterministic)."""
        if self.path is None:
            yield from self.times_s
            return
        path = os.fspath(self.path)
        first: float | None = None
        previous = -math.inf
        limit = MAX_TIME_S / self.unit_s
        unit = f"units of {self.unit_s:g} s"
        for line, record in read_objects(path):
            value = get_number(path, line, record, self.field, limit=limit, unit=unit)
            if value < previous:
                raise TraceFormatError(
                    path, line, self.field, value, f"a time >= the previous line's {previous}"
                )
            previous = value
            if first is None:
                first = value if self.relative else 0.0
            yield (value - first) * self.unit_s


#: Every arrival process a generator accepts.
ArrivalProcess = Poisson | Bursty | TraceArrivals

_KINDS: dict[str, type[Poisson] | type[Bursty] | type[TraceArrivals]] = {
    "poisson": Poisson,
    "bursty": Bursty,
    "trace": TraceArrivals,
}


def arrivals_from_spec(spec: object) -> ArrivalProcess:
    """An arrival process from a mapping such as ``{"kind": "bursty", "rate_per_s": 5}``.

    ``kind`` is ``"poisson"``, ``"bursty"`` or ``"trace"``; the other keys are the
    process's attributes (a list for ``times_s`` is accepted). An arrival process passes
    through unchanged.
    """
    if isinstance(spec, Poisson | Bursty | TraceArrivals):
        return spec
    if not isinstance(spec, dict):
        raise fail("arrivals", "spec", spec, "an arrival process or a mapping with 'kind'")
    params = dict(spec)
    kind = params.pop("kind", None)
    factory = _KINDS.get(kind) if isinstance(kind, str) else None
    if factory is None:
        raise fail("arrivals", "kind", kind, f"one of {sorted(_KINDS)}")
    if isinstance(params.get("times_s"), list):
        params["times_s"] = tuple(params["times_s"])
    try:
        return factory(**params)
    except TypeError as error:
        raise fail("arrivals", "spec", spec, f"valid parameters for {kind!r} ({error})") from None
