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

    A draw is one ``random()`` and a binary search: O(log n). :meth:`sample_distinct`
    draws several distinct ranks (weighted sampling without replacement).
    """

    __slots__ = ("_cumulative", "_negative_suffix", "_total", "exponent", "n")

    def __init__(self, n: int, exponent: float) -> None:
        self.n = check_int("Zipf", "n", n, minimum=1)
        self.exponent = check_float("Zipf", "exponent", exponent)
        weights = (math.pow(rank + 1, -self.exponent) for rank in range(n))
        self._cumulative: list[float] = list(itertools.accumulate(weights))
        self._total = self._cumulative[-1]
        self._negative_suffix: list[float] | None = None  # built by sample_distinct

    def probability(self, rank: int) -> float:
        """``P(rank)``."""
        before = self._cumulative[rank - 1] if rank else 0.0
        return (self._cumulative[rank] - before) / self._total

    def sample(self, rng: random.Random) -> int:
        """One rank."""
        rank = bisect.bisect_right(self._cumulative, rng.random() * self._total)
        return rank if rank < self.n else self.n - 1

    def _suffix(self) -> list[float]:
        """``-(sum of the weights of ranks >= i)`` for ``i = 0 .. n`` (ascending).

        Summed from the lightest rank up, so the weight of any run of ranks is the
        difference of two entries without the cancellation a prefix sum suffers in its
        tail (a heavy head would swamp the light ranks' weights).
        """
        if self._negative_suffix is None:
            weights = (math.pow(rank + 1, -self.exponent) for rank in range(self.n - 1, -1, -1))
            tail = list(itertools.accumulate(weights, initial=0.0))
            tail.reverse()
            self._negative_suffix = [-value for value in tail]
        return self._negative_suffix

    def sample_distinct(self, rng: random.Random, k: int) -> list[int]:
        """``k`` distinct ranks in draw order: weighted sampling without replacement.

        Each draw picks among the ranks not drawn yet, with probability proportional to
        their weights ``(r + 1) ** -exponent``; the first is distributed as
        :meth:`sample`. Exactly ``k`` calls of ``rng.random()``; O(k) per draw plus a
        binary search. When the ranks left all weigh 0 in floating point (a huge
        exponent), the smallest rank left (the limit of the distribution) is taken.

        Raises:
            InvalidConfigError: ``k`` is not an integer in ``[1, n]``.
        """
        count = check_int("Zipf.sample_distinct", "k", k, minimum=1)
        if count > self.n:
            raise fail("Zipf.sample_distinct", "k", k, f"<= n = {self.n} (distinct ranks)")
        suffix = self._suffix()
        free: list[tuple[int, int]] = [(0, self.n)]  # runs [low, high) not drawn yet
        chosen: list[int] = []
        for _ in range(count):
            weights = [suffix[high] - suffix[low] for low, high in free]
            total = math.fsum(weights)
            target = rng.random() * total
            if total > 0:
                for run, weight in enumerate(weights):
                    if target < weight:
                        low, high = free[run]
                        # The first rank r of the run whose weights up to r pass the
                        # target: suffix[r + 1] - suffix[low] > target.
                        found = bisect.bisect_right(suffix, suffix[low] + target, low + 1, high)
                        rank = found - 1
                        break
                    target -= weight
                else:  # rounding carried the target past the end: the last run's last rank
                    run = max(index for index, weight in enumerate(weights) if weight > 0)
                    low, high = free[run]
                    rank = high - 1
            else:  # every rank left weighs 0 in floating point: the smallest (heaviest)
                run = 0
                low, high = free[0]
                rank = low
            chosen.append(rank)
            free[run : run + 1] = [
                part for part in ((low, rank), (rank + 1, high)) if part[0] < part[1]
            ]
        return chosen
