"""Adapters that put real serving engines' own code under the conformance suite.

Not installed with the package (``pyproject.toml`` packages only ``reference``, ``gpu`` and
``sim``) and never imported by the project's own code: run from the repository root, where
``python -m pytest`` puts this folder's parent on ``sys.path``. Each adapter imports its
engine lazily and, when the engine is not installed, fails to load with
:class:`~reference.errors.ImplementationLoadError` saying how to install it
(``scripts/engine-venv.sh`` for vLLM, ``scripts/engine-venv-sglang.sh`` for SGLang).
docs/CONFORMANCE.md, "Real engines", lists what each passes and fails;
``engines/expected/`` records the failing tests, which ``scripts/engine-ci.sh`` (CI's
engine step) compares each run with (:mod:`engines.outcomes`).
"""
