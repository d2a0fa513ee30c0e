"""Statistics over seeds: the mean of a configuration's runs and its 95 % confidence
interval.

Method (docs/REPORTS.md, "Across seeds"): the seeds of one configuration are taken as
independent draws of the workload, and the interval is Student's t interval of their
mean, ``mean ± t(0.975, n - 1) · s / sqrt(n)``, with ``s`` the sample standard
deviation (``n - 1`` in the denominator). One seed has no interval. The t quantiles
are tabulated below (to three decimals, as printed tables give them); beyond 30 degrees
of freedom the normal quantile 1.960 is used.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: ``t(0.975, df)`` for ``df = 1..30`` (two-sided 95 %).
T_975: tuple[float, ...] = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
#: The normal quantile used for more than 30 degrees of freedom.
Z_975 = 1.960


def t_quantile(df: int) -> float:
    """``t(0.975, df)`` for ``df >= 1`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return T_975[df - 1] if df <= len(T_975) else Z_975


def mean_interval(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean of ``values`` and the half-width of its 95 % Student t interval
    (``None`` for fewer than two values).

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("no values to average")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    spread = statistics.stdev(values)
    return mean, t_quantile(len(values) - 1) * spread / math.sqrt(len(values))


def shown_interval(values: Sequence[float], digits: int = 3) -> str:
    """``0.512 ± 0.031`` (or just the mean for one value); ``n/a`` for none."""
    if not values:
        return "n/a"
    mean, half = mean_interval(values)
    if half is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"
