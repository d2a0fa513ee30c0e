"""Typed errors shared by every hyckpt implementation.

Every misuse of the API raises a subclass of :class:`HyckptError`. Each subclass
names one kind of misuse, and every message says what was wrong and what to do.
An operation that raises leaves the object it was called on unchanged.

The subclasses also inherit the closest built-in exception (``ValueError``,
``LookupError``, ``RuntimeError``, ``ImportError``) so generic handlers still work.
"""

from __future__ import annotations


class HyckptError(Exception):
    """Base class of every error hyckpt raises on purpose."""


# --- arguments -------------------------------------------------------------------------


class InvalidTokenCountError(HyckptError, ValueError):
    """A token count or position is negative, not an integer, or beyond the prompt."""


class InvalidRangeError(HyckptError, ValueError):
    """A ``(minimum, maximum]`` range is empty the wrong way round (``minimum > maximum``)."""


class InvalidConfigError(HyckptError, ValueError):
    """A policy or pool was configured with values it cannot work with."""


class UnknownPolicyError(HyckptError, LookupError):
    """A placement or eviction policy name is not registered."""


class BudgetTooSmallError(HyckptError, ValueError):
    """A byte budget cannot hold even one snapshot slot."""


class AllocationTooLargeError(InvalidConfigError):
    """A size asked for (snapshot slots, an index capacity, a prompt length) needs more
    memory than its documented limit allows, or than could be allocated; nothing was
    allocated."""


# --- slots and reservations ------------------------------------------------------------


class SlotOutOfRangeError(HyckptError, LookupError):
    """A snapshot slot, batch slot or page id lies outside the pool."""


class SlotStateError(HyckptError, RuntimeError):
    """An operation needs a slot in another state (e.g. pinning a slot that is not published)."""


class PinUnderflowError(SlotStateError):
    """``unpin`` was called on a slot whose pin count is already zero."""


class ReservationError(HyckptError, RuntimeError):
    """Base class of misuse of a reservation handle."""


class AlreadyPublishedError(ReservationError):
    """``publish`` or ``abort`` was called on a reservation that was already published."""


class AlreadyAbortedError(ReservationError):
    """``publish`` or ``abort`` was called on a reservation that was already aborted."""


class ForeignReservationError(ReservationError):
    """A reservation handle was given to an index that did not issue it."""


# --- storage (implemented by the storage layer) ----------------------------------------


class ValidRowsError(HyckptError, ValueError):
    """A partial-KV ``valid`` row count lies outside ``[0, block_size]``."""


class AxisNotConfiguredError(HyckptError, RuntimeError):
    """A draft or boundary-hidden operation on storage built without that axis."""


class LayoutMismatchError(HyckptError, ValueError):
    """A live tensor's dtype, shape, device or contiguity does not match the slab."""


class NeverCapturedError(HyckptError, RuntimeError):
    """A restore was asked from a snapshot slot that was never captured."""


# --- plumbing --------------------------------------------------------------------------


class ImplementationLoadError(HyckptError, ImportError):
    """``module:factory`` could not be imported or did not return an Implementation."""


class CapabilityMissingError(HyckptError, LookupError):
    """An implementation was asked for a feature it does not declare."""
