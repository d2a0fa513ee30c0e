"""Output paths checked before a run, written whole or not at all.

A command that writes results checks its output paths *before* it simulates, so a typo
in ``--json`` or ``--out`` costs nothing; a write then goes to a temporary file that
replaces the target only when it is complete. Problems raise :class:`OutputPathError`
(``cannot write <path>: <reason>``), which the command line prints as a usage error.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from reference.errors import InvalidConfigError

__all__ = [
    "OutputPathError",
    "atomic_writer",
    "check_output_dir",
    "check_output_file",
    "write_text_atomic",
]


class OutputPathError(InvalidConfigError):
    """An output file or folder cannot be written.

    Attributes:
        path: the path.
        reason: why not.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path, self.reason = os.fspath(path), reason
        super().__init__(f"cannot write {self.path}: {reason}")

    def __reduce__(self) -> tuple[type[OutputPathError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


def _check_folder(target: Path, folder: Path, create: bool) -> None:
    """``folder`` (where ``target`` goes) is a writable folder, or ``create`` and its
    nearest existing ancestor is one."""
    existing = folder
    while not existing.exists():
        if not create:
            raise OutputPathError(target, f"folder {folder} does not exist")
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(target, f"{existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(target, f"folder {existing} is not writable")


def check_output_file(path: str | os.PathLike[str], *, create_parents: bool = False) -> Path:
    """Check that a file can be written at ``path`` (not a folder; its folder exists, or
    can be created with ``create_parents``); return it as a :class:`Path`.

    Raises:
        OutputPathError: it cannot.
    """
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(target, "it is a folder")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputPathError(target, "it is not writable")
    _check_folder(target, target.parent, create_parents)
    return target


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is a writable folder or can be created as one; return it.

    Raises:
        OutputPathError: it cannot.
    """
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise OutputPathError(target, "it is not a folder")
    _check_folder(target, target, True)
    return target


def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, create_parents: bool = False
) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder that
    replaces ``path`` once complete (:func:`atomic_writer`): a failed write leaves the old
    file (or none).

    Raises:
        OutputPathError: the file cannot be written (the operating system's reason).
    """
    with atomic_writer(path, create_parents=create_parents) as (target, stream):
        stream.write(text)
    return target


@contextmanager
def atomic_writer(
    path: str | os.PathLike[str], *, binary: bool = False, create_parents: bool = False
) -> Iterator[tuple[Path, IO[Any]]]:
    """``(path, stream)``: a stream (text UTF-8, or ``binary``) on a hidden temporary file
    beside ``path`` (``.<name>.<random>.tmp``) that replaces ``path`` once the ``with``
    block completes. If the block or the write fails, the old file (or none) stays and
    no temporary is left behind.

    Raises:
        OutputPathError: the file cannot be written (the operating system's reason), also
            for an :class:`OSError` raised inside the block.
    """
    target = check_output_file(path, create_parents=create_parents)
    try:
        if create_parents:
            target.parent.mkdir(parents=True, exist_ok=True)
        # open(..., "x") rather than tempfile.mkstemp: the file gets the usual permissions.
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            if binary:
                with open(temporary, "xb") as stream:
                    yield target, stream
            else:
                with open(temporary, "x", encoding="utf-8") as text_stream:
                    yield target, text_stream
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    except OSError as error:
        raise OutputPathError(target, error.strerror or str(error)) from None
