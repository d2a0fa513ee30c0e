"""The conformance suite: the tests an engine runs against its own implementation.

Every test here takes the ``impl`` fixture (``tests/conftest.py``) and reaches the
implementation under test only through the Protocols of :mod:`reference.api`; run them
with ``pytest tests/conformance --impl module:factory`` (docs/CONFORMANCE.md). Modules
whose names start with ``_`` hold helpers shared by these tests (and by the project's
own tests of the reference); ``rules_report`` is the ``--rules`` verdict per rule of
docs/SEMANTICS.md. The project's own tests (of the reference itself, the simulation, the
GPU layer, the tooling) are the rest of ``tests/``.
"""
