"""Parameter checks shared by the workload configurations.

Every check raises :class:`~reference.errors.InvalidConfigError` with a message of the
form ``"<Owner>.<field> must be <expectation>, got <value>"``.
"""

from __future__ import annotations

import math

from reference.errors import InvalidConfigError

#: Largest magnitude of a time in seconds that a trace or an arrival process may give:
#: 1e12 s (about 31,700 years), far beyond any trace yet small enough that Unix-epoch
#: times in seconds or milliseconds pass and that every time derived from one (a
#: difference of two, a sum with service times) stays finite and resolved to better than
#: a millisecond. A time near ``1e308`` would overflow downstream.
MAX_TIME_S = 1e12


def fail(owner: str, field: str, value: object, expectation: str) -> InvalidConfigError:
    """The error for ``owner.field = value`` that should have been ``expectation``."""
    return InvalidConfigError(f"{owner}.{field} must be {expectation}, got {value!r}")


def check_int(owner: str, field: str, value: object, *, minimum: int = 0) -> int:
    """``value`` if it is an ``int`` (not ``bool``) ``>= minimum``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(owner, field, value, f"an integer >= {minimum}")
    return value


def check_float(
    owner: str,
    field: str,
    value: object,
    *,
    minimum: float = 0.0,
    strict: bool = False,
) -> float:
    """``value`` as a finite float ``>= minimum`` (``> minimum`` if ``strict``), else raise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(owner, field, value, "a finite number")
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        number = math.inf
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        relation = ">" if strict else ">="
        raise fail(owner, field, value, f"a finite number {relation} {minimum:g}")
    return number


def check_type(owner: str, field: str, value: object, kind: type | tuple[type, ...]) -> None:
    """Raise unless ``value`` is an instance of ``kind``."""
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise fail(owner, field, value, f"a {names}")


def check_name(owner: str, field: str, value: object) -> str:
    """A non-empty component name without ``/`` (which separates parts of request ids)."""
    if not isinstance(value, str) or not value or "/" in value:
        raise fail(owner, field, value, "a non-empty string without '/'")
    return value
