"""The docs (and the README) name the tests that prove each rule; every name must exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: ``tests/<file>.py`` or ``tests/<file>.py::<test>`` of this project, in ``tests/`` or a
#: folder under it (``tests/conformance/<file>.py``). A path into a folder this project
#: does not have is another project's test tree, quoted as a source (:func:`_ours`).
REFERENCE = re.compile(r"(?<![\w/.-])tests/((?:\w+/)*\w+\.py)(?:::(\w+))?")
#: The docs, and the README (its commands name test files too).
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def _ours(path: str) -> bool:
    """Whether ``path`` (under ``tests/``) is in this project's test tree: a file directly
    in ``tests/``, or under a folder that ``tests/`` has."""
    folder = path.rpartition("/")[0]
    return not folder or (ROOT / "tests" / folder).is_dir()


def _exists(path: Path, name: str | None) -> bool:
    if not path.is_file():
        return False
    return name is None or bool(re.search(rf"^def {name}\(", path.read_text(), re.M))


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_test_a_doc_names_exists(doc: Path) -> None:
    missing = [
        match.group(0)
        for match in REFERENCE.finditer(doc.read_text(encoding="utf-8"))
        if _ours(match.group(1)) and not _exists(ROOT / "tests" / match.group(1), match.group(2))
    ]
    assert not missing, f"{doc.name} names tests that do not exist: {missing}"


def test_semantics_names_tests() -> None:
    text = (ROOT / "docs" / "SEMANTICS.md").read_text(encoding="utf-8")
    assert len(REFERENCE.findall(text)) > 100


def test_semantics_maps_every_design_section_to_its_own_sections() -> None:
    """README says code cites "DESIGN §N" and SEMANTICS.md restates it: the table at the
    top of SEMANTICS.md names a place for every DESIGN section, and every SEMANTICS
    section it names exists."""
    text = (ROOT / "docs" / "SEMANTICS.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| §(\d) [^|]+\| ([^|]+) \|$", text, re.M))
    assert sorted(rows) == [str(n) for n in range(1, 10)]
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.M))
    for place in rows.values():
        for section in re.findall(r"§(\d+(?:\.\d+)?)", place.split("DESIGN")[0]):
            assert section in headings, (place, section)
    cited = {int(n) for n in re.findall(r"DESIGN §(\d)", (ROOT / "README.md").read_text())}
    assert cited <= {int(n) for n in rows}


def test_scenario_docs_say_what_the_no_argument_run_builds() -> None:
    from sim.scenarios.command import DEFAULT_RUN_DIR

    text = " ".join((ROOT / "docs" / "SCENARIOS.md").read_text(encoding="utf-8").split())
    assert f'build_report(Path("reports/agentic-coding/runs/{DEFAULT_RUN_DIR}"))' in text


def test_scenario_descriptions_state_their_own_think_time() -> None:
    import tomllib

    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        said = re.search(r"([\d.]+) s think time", data["scenario"]["description"])
        if said:
            think = data["workload"]["params"]["think_time"]["mean_s"]
            assert float(said.group(1)) == think, path.name


def test_readme_tells_users_elsewhere_how_to_get_the_cpu_torch() -> None:
    """The setup commands stay as CI runs them; the prose says what to add on a machine
    whose pip would fetch PyPI's (CUDA) Linux torch wheel."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    hint = "--index-url https://download.pytorch.org/whl/cpu"
    assert hint in " ".join(readme.split())
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2 and not any(hint in line for line in commands)
