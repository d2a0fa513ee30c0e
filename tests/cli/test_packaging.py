"""Packaging and plumbing: import hygiene, the documented set-up commands, ``--impl`` errors."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from reference.conformance.loading import DEFAULT_IMPL, ENV_VAR, default_spec, load_implementation
from reference.errors import HyckptError, ImplementationLoadError

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CI_SCRIPT = ROOT / ".ci" / "run"
SETUP_PREFIX = "python3 -m venv"

#: Every module of the reference package, found on disk so new modules are covered too.
REFERENCE_MODULES = tuple(
    sorted(
        "reference." + ".".join(path.relative_to(ROOT / "reference").with_suffix("").parts)
        for path in (ROOT / "reference").rglob("*.py")
        if path.name != "__init__.py"
    )
)


# --- import hygiene --------------------------------------------------------------------


def _blocking(blocked: str, body: str) -> str:
    """A ``python -c`` script: packages named by the expression ``blocked`` (a tuple of
    top-level names) fail to import, then ``body`` runs."""
    return textwrap.dedent(
        f"""
        import importlib, sys

        BLOCKED = {blocked}

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"{{name}} is blocked for this test", name=name)
                return None

        sys.meta_path.insert(0, Block())
        """
    ) + textwrap.dedent(body)


_BLOCKED_IMPORT = _blocking(
    '("numpy", "triton")',
    """
    for module in sys.argv[1:]:
        importlib.import_module(module)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("imported", len(sys.argv) - 1, "modules")
    """,
)


def test_reference_imports_without_numpy_or_triton() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_IMPORT, *REFERENCE_MODULES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"imported {len(REFERENCE_MODULES)} modules" in result.stdout


def test_blocking_finder_really_blocks() -> None:
    """The subprocess above would pass vacuously if the finder did not block anything."""
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_IMPORT, "numpy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "numpy is blocked for this test" in result.stderr


#: Runs ``hyckpt ARGV...`` with the comma-separated packages of ``sys.argv[1]`` blocked.
_CLI_WITHOUT = _blocking(
    'tuple(sys.argv[1].split(","))',
    """
    from sim.cli import main

    raise SystemExit(main(sys.argv[2:]))
    """,
)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "gpu", "--help"],
        ["bench", "gpu", "--quick", "--device", "cpu", "--models", "jamba-v0.1"],
        ["sizes"],
        ["demo"],
    ],
    ids=" ".join,
)
def test_commands_that_never_simulate_run_without_simpy_or_dask(argv: list[str]) -> None:
    """A GPU machine's own Python image (docs/GPU.md) has torch and Triton but no SimPy:
    the GPU benchmark, ``sizes`` and ``demo`` must not need the simulator to load."""
    result = subprocess.run(
        [sys.executable, "-c", _CLI_WITHOUT, "simpy,dask,distributed", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_simulating_without_simpy_fails_loudly() -> None:
    """...and the block is real: a command that simulates does need SimPy."""
    result = subprocess.run(
        [sys.executable, "-c", _CLI_WITHOUT, "simpy", "simulate", "--requests", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "simpy is blocked for this test" in result.stderr


# --- documented commands ---------------------------------------------------------------


def _readme_setup_lines() -> list[str]:
    return [
        line.strip()
        for line in README.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith(SETUP_PREFIX)
    ]


def test_readme_has_exactly_two_setup_commands() -> None:
    lines = _readme_setup_lines()
    assert len(lines) == 2, lines
    main_job, tests = sorted(lines, key=lambda line: "pytest" in line)
    assert "pytest" not in main_job and main_job.endswith("hyckpt")
    assert tests.endswith("pytest") or " -m pytest" in tests
    for line in lines:
        # torch (CPU) must be installed before the project, which would pull a CUDA build.
        assert "torch==2.13.0" in line
        assert line.index("torch==2.13.0") < line.index("install -e")


def test_readme_setup_commands_are_in_fenced_blocks() -> None:
    inside, fenced = False, []
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            inside = not inside
        elif inside and line.strip().startswith(SETUP_PREFIX):
            fenced.append(line.strip())
    assert fenced == _readme_setup_lines()


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    (tests,) = [line for line in _readme_setup_lines() if "pytest" in line]
    ci_lines = [line.strip() for line in CI_SCRIPT.read_text(encoding="utf-8").splitlines()]
    assert tests in ci_lines


def test_ci_script_is_strict_bash() -> None:
    text = CI_SCRIPT.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    for tool in ("ruff check", "ruff format --check", "mypy"):
        assert tool in text


def test_ci_script_parses() -> None:
    result = subprocess.run(
        ["bash", "-n", str(CI_SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_default_config_is_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'sim = ["*.toml"]' in text
    assert (ROOT / "sim" / "default.toml").is_file()


# --- load_implementation errors --------------------------------------------------------


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A throwaway importable module with good and bad factories; returns its name."""
    name = f"hyckpt_test_plugin_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            NOT_CALLABLE = 42

            def wrong_type():
                return {"name": "not an Implementation"}

            def raises():
                raise RuntimeError("factory exploded")
            """
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _load_error(spec: str) -> ImplementationLoadError:
    with pytest.raises(ImplementationLoadError) as info:
        load_implementation(spec)
    assert isinstance(info.value, HyckptError)
    assert spec in str(info.value), str(info.value)
    return info.value


@pytest.mark.parametrize("spec", ["no_colon_at_all", ":factory", "some.module:"])
def test_malformed_spec(spec: str) -> None:
    error = _load_error(spec)
    assert "package.module:factory" in str(error)


def test_missing_module() -> None:
    spec = f"hyckpt_no_such_module_{uuid.uuid4().hex}:implementation"
    error = _load_error(spec)
    assert "cannot import" in str(error)
    assert isinstance(error.__cause__, ImportError)


def test_missing_attribute(plugin_module: str) -> None:
    error = _load_error(f"{plugin_module}:no_such_factory")
    assert "no_such_factory" in str(error)


def test_attribute_not_callable(plugin_module: str) -> None:
    error = _load_error(f"{plugin_module}:NOT_CALLABLE")
    assert "NOT_CALLABLE" in str(error)


def test_factory_returns_wrong_type(plugin_module: str) -> None:
    error = _load_error(f"{plugin_module}:wrong_type")
    assert "dict" in str(error)
    assert "Implementation" in str(error)


def test_factory_raises(plugin_module: str) -> None:
    error = _load_error(f"{plugin_module}:raises")
    assert "factory exploded" in str(error)


def test_environment_variable_selects_the_spec(
    plugin_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = f"{plugin_module}:wrong_type"
    monkeypatch.setenv(ENV_VAR, spec)
    assert default_spec() == spec
    with pytest.raises(ImplementationLoadError, match=re.escape(spec)):
        load_implementation()
    monkeypatch.setenv(ENV_VAR, "")
    assert default_spec() == DEFAULT_IMPL
    monkeypatch.delenv(ENV_VAR)
    assert default_spec() == DEFAULT_IMPL
