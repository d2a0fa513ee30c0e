"""Generate the language-neutral JSON vectors: ``vectors/placement.json``, ``vectors/index.json``.

Each file is a list of cases; each case a sequence of protocol steps (docs/PROTOCOL.md
§6) with the answers the reference gives, recorded by running the steps through
:class:`~reference.conformance.protocol_server.Session` on the reference. The cases are every
vector of DESIGN §2 and §3 (the generator stops if the reference disagrees with one),
the worked examples and misuse rules of docs/SEMANTICS.md §1–§2, and seeded random
sequences of index operations, misuse included. Output is deterministic: the same code
writes the same bytes, so the committed files are checked against a fresh generation.

    python -m reference.conformance.vectors [--out DIR] [--check]     # or: hyckpt vectors
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reference.conformance.vectors_index import index_cases
from reference.conformance.vectors_placement import placement_cases
from reference.conformance.vectors_record import REGENERATE, Recorder
from reference.conformance.vectors_replay import FILES, VECTORS_VERSION
from reference.errors import HyckptError, InvalidConfigError

DESCRIPTIONS = {
    "placement": "Placement policies: DESIGN §2 vectors, SEMANTICS §1 examples and errors, "
    "random chunkings.",
    "index": "Checkpoint index: DESIGN §3 seed vectors, SEMANTICS §2 rules and misuse, "
    "random operation sequences.",
}


def document(kind: str, cases: Sequence[Recorder]) -> dict[str, Any]:
    """One vector file's content."""
    return {
        "version": VECTORS_VERSION,
        "kind": kind,
        "description": DESCRIPTIONS[kind],
        "format": "docs/PROTOCOL.md §6",
        "generated_by": REGENERATE,
        "cases": [c.case() for c in cases],
    }


def render(doc: dict[str, Any]) -> str:
    """Deterministic JSON text: header fields one per line, one step per line."""

    def dump(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)

    lines = ["{"]
    for key, value in doc.items():
        if key != "cases":
            lines.append(f"  {dump(key)}: {dump(value)},")
    lines.append('  "cases": [')
    for number, case in enumerate(doc["cases"]):
        lines.append("    {")
        for key in ("name", "source", "requires"):
            lines.append(f"      {dump(key)}: {dump(case[key])},")
        lines.append('      "steps": [')
        steps = case["steps"]
        for i, step in enumerate(steps):
            lines.append(f"        {dump(step)}{',' if i < len(steps) - 1 else ''}")
        lines.append("      ]")
        lines.append("    }" + ("," if number < len(doc["cases"]) - 1 else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


GENERATORS: dict[str, Callable[[], list[Recorder]]] = {
    "placement": placement_cases,
    "index": index_cases,
}


def generate() -> dict[str, str]:
    """File name → text of every vector file."""
    return {f"{kind}.json": render(document(kind, make())) for kind, make in GENERATORS.items()}


def write(directory: Path) -> list[Path]:
    """Write every vector file into ``directory`` (created if needed).

    Raises:
        HyckptError: ``directory`` is not a folder or cannot be written.
    """
    if directory.exists() and not directory.is_dir():
        raise HyckptError(f"cannot write the vectors into {directory}: it is not a folder")
    written = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in generate().items():
            path = directory / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as error:
        where = error.filename or directory
        raise HyckptError(
            f"cannot write the vectors into {directory}: {where}: {error.strerror or error}"
        ) from None
    assert tuple(p.name for p in written) == FILES
    return written


def stale(directory: Path) -> list[str]:
    """Names of the files in ``directory`` that differ from a fresh generation (or are
    missing: :func:`missing` tells which)."""
    return [
        name
        for name, text in generate().items()
        if not (directory / name).is_file() or _read(directory / name) != text
    ]


def missing(directory: Path) -> list[str]:
    """Names of the vector files that ``directory`` does not hold."""
    return [name for name in FILES if not (directory / name).is_file()]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the generator command."""
    parser.add_argument("--out", default="vectors", metavar="DIR", help="folder (vectors)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the files in --out differ from a fresh generation",
    )


def run(args: argparse.Namespace) -> int:
    directory = Path(args.out)
    if args.check:
        if directory.exists() and not directory.is_dir():
            raise InvalidConfigError(f"--out {directory} is not a folder")
        regenerate = REGENERATE if args.out == "vectors" else f"hyckpt vectors --out {args.out}"
        differing = stale(directory)
        absent = missing(directory)
        for name in differing:
            if name in absent:
                print(f"{directory / name} is missing; write it with {regenerate}")
            else:
                print(f"{directory / name} is not what the generator writes now; run {regenerate}")
        if not differing:
            files = " and ".join(str(directory / name) for name in FILES)
            print(f"vectors: ok ({files} match the generator)")
        return 1 if differing else 0
    for path in write(directory):
        cases = len(json.loads(path.read_text(encoding="utf-8"))["cases"])
        print(f"wrote {path} ({cases} cases)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference.conformance.vectors",
        description="Write the JSON vectors (operation sequences with the reference's answers).",
    )
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except HyckptError as error:
        print(f"vectors: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
