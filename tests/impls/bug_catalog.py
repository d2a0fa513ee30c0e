"""The catalogue of known bugs the conformance suite must catch (see ``known_bug.py``)."""

from __future__ import annotations

from tests.impls.bugs_placement_index import BUGS as PLACEMENT_INDEX_BUGS
from tests.impls.bugs_storage_export import BUGS as STORAGE_EXPORT_BUGS
from tests.impls.known_bug import KnownBug, known_bug

#: Layers of the catalogue, in the order of DESIGN §2–5.
LAYERS = ("placement", "index", "storage", "exporter")

# The project's first two broken implementations, kept in their own modules.
EVICTS_PINNED = known_bug(
    "evicts-pinned",
    "index",
    "P2",
    "Evicts published slots whether or not a restore has pinned them, so a capture can "
    "overwrite a checkpoint in the middle of its restore.",
    "tests.impls.pin_ignoring:implementation",
    ("tests/conformance/test_index.py::test_no_slot_is_a_normal_outcome",),
    "pinned slots are not evicted",
)

EXPORTS_ONE_TOKEN_LATE = known_bug(
    "exports-one-token-late",
    "exporter",
    "EX2",
    "Exports each checkpoint after consuming the token at its offset instead of before it, "
    "the off-by-one of a kernel that stores the state once the token is in: every restore "
    "continues one token ahead.",
    "tests.impls.late_exporter:implementation",
    ("tests/conformance/test_export.py::test_conv_window_equals_a_token_by_token_update",),
    "differs from the window after feeding the row's first",
)

CATALOG: tuple[KnownBug, ...] = (
    *PLACEMENT_INDEX_BUGS,
    EVICTS_PINNED,
    *STORAGE_EXPORT_BUGS,
    EXPORTS_ONE_TOKEN_LATE,
)
