"""One entry of the catalogue of known bugs the conformance suite must catch.

Each known bug is a small, deliberately broken implementation (the reference with one
rule broken, the way serving engines have broken it) plus what the suite is expected to
say about it. ``tests/tooling/test_suite_catches_known_bugs.py`` runs the named conformance files
against every entry and checks that the named tests fail with a message a reader can act
on; ``docs/CONFORMANCE.md`` lists the catalogue for engine authors.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownBug:
    """A broken implementation and the conformance failures it must produce.

    Attributes:
        name: kebab-case id, shown in test ids and in docs/CONFORMANCE.md.
        layer: ``"placement"``, ``"index"``, ``"storage"`` or ``"exporter"``.
        rule: the rule of docs/SEMANTICS.md it breaks (``"R2"``, ``"ST6"``, ...).
        story: one sentence: what an engine with this bug does, and what its users see.
        spec: ``module:factory`` of the broken implementation (for ``--impl``).
        suite: conformance test files run against it (paths from the repository root).
        caught_by: test ids that must fail; an id without ``[...]`` also matches its
            parametrized cases.
        message: text that the failure message of at least one ``caught_by`` test
            contains (what the suite tells the engine author).
    """

    name: str
    layer: str
    rule: str
    story: str
    spec: str
    suite: tuple[str, ...]
    caught_by: tuple[str, ...]
    message: str


def known_bug(
    name: str,
    layer: str,
    rule: str,
    story: str,
    spec: str,
    caught_by: tuple[str, ...],
    message: str,
) -> KnownBug:
    """A :class:`KnownBug` whose suite is the files of ``caught_by``, in order."""
    suite = tuple(dict.fromkeys(test.split("::")[0] for test in caught_by))
    return KnownBug(name, layer, rule, story, spec, suite, caught_by, message)
