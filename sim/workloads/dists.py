"""Random draws for workloads: token counts, delays and Zipf popularity.

Every draw takes an explicit :class:`random.Random`; nothing here touches the global RNG.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Literal

from sim.workloads._checks import check_float, check_int, fail

__all__ = ["IntDist", "TimeDist", "Zipf", "component_rng"]

_MAX_CV = 100.0
_LOG_FLOAT_MAX = math.log(sys.float_info.max)  # exp() of more overflows


def component_rng(seed: int, name: str, component: str) -> random.Random:
    """The RNG of one component of one workload, derived from ``(seed, name, component)``.

    Seeding from a string is deterministic across processes (SHA-512 of the string), so a
    component's stream never depends on another component's draws.
    """
    return random.Random(f"hyckpt-workloads:{seed}:{name}:{component}")


@dataclass(frozen=True, slots=True)
class IntDist:
    """A positive integer (tokens, or a count): lognormal with this mean and CV, rounded.

    ``cv = 0`` always gives ``round(mean)``. Draws are clipped to ``[minimum, maximum]``,
    which moves the realised mean when the clip bites.

    Attributes:
        mean: mean before clipping (``> 0``).
        cv: coefficient of variation (standard deviation / mean), ``0 <= cv <= 100``.
        minimum: smallest value (``>= 1``).
        maximum: largest value (``>= minimum``).
    """

    mean: float
    cv: float = 0.0
    minimum: int = 1
    maximum: int = 1 << 20
    _mu: float = field(init=False, repr=False, compare=False)
    _sigma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owner = "IntDist"
        mean = check_float(owner, "mean", self.mean, strict=True)
        cv = check_float(owner, "cv", self.cv)
        if cv > _MAX_CV:
            raise fail(owner, "cv", self.cv, f"<= {_MAX_CV:g}")
        check_int(owner, "minimum", self.minimum, minimum=1)
        check_int(owner, "maximum", self.maximum, minimum=self.minimum)
        sigma = math.sqrt(math.log1p(cv * cv))
        object.__setattr__(self, "_sigma", sigma)
        object.__setattr__(self, "_mu", math.log(mean) - sigma * sigma / 2)

    def sample(self, rng: random.Random) -> int:
        """One draw."""
        if self._sigma:
            # rng.lognormvariate, spelled out (the same draws) to clip before exp overflows.
            log_value = rng.normalvariate(self._mu, self._sigma)
            value = self.maximum if log_value >= _LOG_FLOAT_MAX else round(math.exp(log_value))
        else:
            value = round(self.mean)
        if value < self.minimum:
            return self.minimum
        if value > self.maximum:
            return self.maximum
        return value


@dataclass(frozen=True, slots=True)
class TimeDist:
    """A non-negative delay in seconds.

    Attributes:
        mean_s: mean delay in seconds (``>= 0``; 0 gives no delay).
        shape: ``"exponential"`` (memoryless; its CV is 1) or ``"lognormal"``.
        cv: coefficient of variation of the lognormal (``> 0``); must stay 1 for
            ``"exponential"``.
    """

    mean_s: float
    shape: Literal["exponential", "lognormal"] = "exponential"
    cv: float = 1.0
    _mu: float = field(init=False, repr=False, compare=False)
    _sigma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owner = "TimeDist"
        mean = check_float(owner, "mean_s", self.mean_s)
        if self.shape not in ("exponential", "lognormal"):
            raise fail(owner, "shape", self.shape, "'exponential' or 'lognormal'")
        cv = check_float(owner, "cv", self.cv, strict=True)
        if cv > _MAX_CV:
            raise fail(owner, "cv", self.cv, f"<= {_MAX_CV:g}")
        if self.shape == "exponential" and cv != 1.0:
            raise fail(owner, "cv", self.cv, "1.0 for shape 'exponential' (use 'lognormal')")
        sigma = math.sqrt(math.log1p(cv * cv))
        object.__setattr__(self, "_sigma", sigma)
        object.__setattr__(self, "_mu", math.log(mean) - sigma * sigma / 2 if mean else 0.0)

    def sample(self, rng: random.Random) -> float:
        """One draw, in seconds."""
        if not self.mean_s:
            return 0.0
        if self.shape == "exponential":
            return rng.expovariate(1.0 / self.mean_s)
        return float(rng.lognormvariate(self._mu, self._sigma))


class Zipf:
    """Ranks ``0 .. n-1`` with ``P(rank r) ∝ (r + 1) ** -exponent`` (0 gives uniform).

    A draw is one ``random()`` and a binary search: O(log n).
    """

    __slots__ = ("_cumulative", "_total", "exponent", "n")

    def __init__(self, n: int, exponent: float) -> None:
        self.n = check_int("Zipf", "n", n, minimum=1)
        self.exponent = check_float("Zipf", "exponent", exponent)
        weights = (math.pow(rank + 1, -self.exponent) for rank in range(n))
        self._cumulative: list[float] = list(itertools.accumulate(weights))
        self._total = self._cumulative[-1]

    def probability(self, rank: int) -> float:
        """``P(rank)``."""
        before = self._cumulative[rank - 1] if rank else 0.0
        return (self._cumulative[rank] - before) / self._total

    def sample(self, rng: random.Random) -> int:
        """One rank."""
        rank = bisect.bisect_right(self._cumulative, rng.random() * self._total)
        return rank if rank < self.n else self.n - 1
