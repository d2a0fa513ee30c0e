"""The docs name the tests that prove each rule; every name must exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: ``tests/<file>.py`` or ``tests/<file>.py::<test>`` of this project (its tests are flat;
#: paths into other projects' test trees, quoted as sources, do not match).
REFERENCE = re.compile(r"(?<![\w/.-])tests/(\w+\.py)(?:::(\w+))?")
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _exists(path: Path, name: str | None) -> bool:
    if not path.is_file():
        return False
    return name is None or bool(re.search(rf"^def {name}\(", path.read_text(), re.M))


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_test_a_doc_names_exists(doc: Path) -> None:
    missing = [
        match.group(0)
        for match in REFERENCE.finditer(doc.read_text(encoding="utf-8"))
        if not _exists(ROOT / "tests" / match.group(1), match.group(2))
    ]
    assert not missing, f"{doc.name} names tests that do not exist: {missing}"


def test_semantics_names_tests() -> None:
    text = (ROOT / "docs" / "SEMANTICS.md").read_text(encoding="utf-8")
    assert len(REFERENCE.findall(text)) > 100
