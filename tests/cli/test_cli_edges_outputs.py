"""Edges of ``sim/outputs.py`` and ``hyckpt sizes`` (``sim/sizes_cmd.py``) that mutation
testing found unpinned: output paths are checked first and the reason of a rejection is
named, files are written whole through their own hidden temporary (a failed replace or
write leaves the old file and no temporary), and ``hyckpt sizes`` writes its JSON or
table, with its footer, to the stream it is given without importing torch."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reference.errors import InvalidConfigError
from reference.sizes import MODELS
from sim import outputs, sizes_cmd
from sim.cli import main
from sim.outputs import OutputPathError, check_output_dir, check_output_file, write_text_atomic

ROOT = Path(__file__).resolve().parents[2]


# --- sim/outputs.py: output paths checked first, files written whole -------------------


def _deny_access(monkeypatch: pytest.MonkeyPatch, *denied: Path) -> None:
    """``os.access`` says no to ``denied`` (tests run as root, where chmod cannot)."""
    real = os.access

    def access(path: str | os.PathLike[str], mode: int, **kwargs: Any) -> bool:
        if Path(path) in denied:
            return False
        return real(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)


def _no_temporaries(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


def test_output_path_error_names_the_path_and_the_reason(tmp_path: Path) -> None:
    """``cannot write <path>: <reason>``, a configuration error (exit 2 on the command
    line) that survives pickling (it crosses process pools) with its attributes."""
    error = OutputPathError(tmp_path / "x.json", "a reason")
    assert str(error) == f"cannot write {tmp_path / 'x.json'}: a reason"
    assert isinstance(error, InvalidConfigError)
    assert (error.path, error.reason) == (str(tmp_path / "x.json"), "a reason")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is OutputPathError
    assert (str(copy), copy.path, copy.reason) == (str(error), error.path, error.reason)


def test_check_output_file_accepts_a_new_or_existing_file(tmp_path: Path) -> None:
    """A new file in an existing folder, or an existing writable file, is accepted and
    returned as a Path; nothing is created."""
    assert check_output_file(str(tmp_path / "new.json")) == tmp_path / "new.json"
    (tmp_path / "old.json").write_text("old")
    assert check_output_file(tmp_path / "old.json") == tmp_path / "old.json"
    assert check_output_file(tmp_path / "a" / "b.json", create_parents=True) == (
        tmp_path / "a" / "b.json"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_check_output_file_rejections_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each reason a file cannot be written, with the path that has the problem."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    missing = tmp_path / "no" / "dir"
    cases = [
        (tmp_path, {}, f"cannot write {tmp_path}: it is a folder"),
        (
            missing / "x.json",
            {},
            f"cannot write {missing / 'x.json'}: folder {missing} does not exist",
        ),
        (a_file / "x.json", {}, f"cannot write {a_file / 'x.json'}: {a_file} is not a folder"),
        (
            a_file / "below" / "x.json",
            {"create_parents": True},
            f"cannot write {a_file / 'below' / 'x.json'}: {a_file} is not a folder",
        ),
    ]
    for path, options, message in cases:
        with pytest.raises(OutputPathError) as info:
            check_output_file(path, **options)
        assert str(info.value) == message
    _deny_access(monkeypatch, a_file, tmp_path)
    with pytest.raises(OutputPathError) as info:
        check_output_file(a_file)
    assert str(info.value) == f"cannot write {a_file}: it is not writable"
    with pytest.raises(OutputPathError) as info:
        check_output_file(tmp_path / "new.json")
    assert str(info.value) == (
        f"cannot write {tmp_path / 'new.json'}: folder {tmp_path} is not writable"
    )
    # A folder still to be created: its nearest existing ancestor must be writable.
    with pytest.raises(OutputPathError) as info:
        check_output_file(missing / "x.json", create_parents=True)
    assert str(info.value) == (
        f"cannot write {missing / 'x.json'}: folder {tmp_path} is not writable"
    )
    assert not (tmp_path / "no").exists()


def test_check_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that exists or can be created is accepted (and not created); a file, or
    a folder below a file or below a read-only folder, is not."""
    assert check_output_dir(str(tmp_path)) == tmp_path
    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(OutputPathError) as info:
        check_output_dir(a_file)
    assert str(info.value) == f"cannot write {a_file}: it is not a folder"
    with pytest.raises(OutputPathError) as info:
        check_output_dir(a_file / "below")
    assert str(info.value) == f"cannot write {a_file / 'below'}: {a_file} is not a folder"
    _deny_access(monkeypatch, tmp_path)
    with pytest.raises(OutputPathError) as info:
        check_output_dir(tmp_path / "new")
    assert str(info.value) == f"cannot write {tmp_path / 'new'}: folder {tmp_path} is not writable"


def test_write_text_atomic_writes_utf8_whole_with_the_usual_mode(tmp_path: Path) -> None:
    """The text arrives whole, in UTF-8, replacing an older file; no temporary file is
    left behind; a new file gets the permissions ``open`` gives (umask applied)."""
    target = tmp_path / "r.json"
    target.write_text("an older, longer content\n" * 10)
    assert write_text_atomic(str(target), "données ✓\n") == target
    assert target.read_bytes() == "données ✓\n".encode()
    _no_temporaries(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    fresh = write_text_atomic(tmp_path / "fresh.txt", "x")
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~mask


def test_write_text_atomic_creates_folders_only_when_asked(tmp_path: Path) -> None:
    """Without ``create_parents`` a missing folder is an error and nothing is created;
    with it, the folders are made."""
    target = tmp_path / "a" / "b" / "r.txt"
    with pytest.raises(OutputPathError, match="does not exist"):
        write_text_atomic(target, "x")
    assert not (tmp_path / "a").exists()
    assert write_text_atomic(target, "x", create_parents=True) == target
    assert target.read_text() == "x"


def test_a_failed_replace_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the finished temporary file cannot replace the target, the target keeps its old
    content, the temporary is removed, and the error names the path and the OS reason."""
    target = tmp_path / "r.json"
    target.write_text("old")

    def replace(source: object, destination: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputPathError) as info:
        write_text_atomic(target, "new")
    assert str(info.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == "old"
    _no_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_an_error_while_writing_leaves_nothing_half_written(tmp_path: Path) -> None:
    """Text that cannot be encoded fails before the target is touched: the old file
    stays, no temporary remains, and the error is not disguised as a path problem."""
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "ok so far, then \ud800")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


# --- sim/sizes_cmd.py: hyckpt sizes ----------------------------------------------------

SIZES_UNITS = {
    "*_bytes": "bytes",
    "recurrent_bytes_per_sequence": "bytes per sequence",
    "kv_bytes_per_token": "bytes per token",
    "kv_tokens_per_checkpoint": "tokens",
    "flops_per_token": "FLOPs per token (2 x active parameters)",
}


@pytest.mark.parametrize(
    ("options", "draft", "dtype"),
    [([], False, None), (["--draft", "--ssm-state-dtype", "float16"], True, "float16")],
)
def test_sizes_json_is_the_whole_of_stdout(
    capsys: pytest.CaptureFixture[str], options: list[str], draft: bool, dtype: str | None
) -> None:
    """``sizes --json`` prints one JSON document, indented by 2 and ending in a newline,
    and nothing else; its header echoes the options and names the units."""
    assert main(["sizes", "--json", "--model", "nemotron-h-8b", *options]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    document = json.loads(out)
    assert out == json.dumps(document, indent=2) + "\n"
    assert list(document) == ["block_size", "with_draft", "ssm_state_dtype", "units", "models"]
    assert (document["block_size"], document["with_draft"]) == (16, draft)
    assert document["ssm_state_dtype"] == dtype
    assert document["units"] == SIZES_UNITS
    (model,) = document["models"]
    assert model["ssm_state_dtype"] == (dtype or "bfloat16")


def test_sizes_accepts_each_dtype_and_rejects_others(capsys: pytest.CaptureFixture[str]) -> None:
    """``--ssm-state-dtype`` takes bfloat16, float16 or float32; another name is
    argparse's usage error listing those."""
    for dtype in ("bfloat16", "float16", "float32"):
        assert main(["sizes", "--json", "--model", "mamba2-2.7b", "--ssm-state-dtype", dtype]) == 0
        assert json.loads(capsys.readouterr().out)["models"][0]["ssm_state_dtype"] == dtype
    assert main(["sizes", "--ssm-state-dtype", "fp8"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1] == (
        "hyckpt sizes: error: argument --ssm-state-dtype: invalid choice: 'fp8' "
        "(choose from 'bfloat16', 'float16', 'float32')"
    )


def test_sizes_table_footer_says_what_was_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    """Below the table: the block size, draft head and dtype, and the units."""
    assert main(["sizes", "--model", "mamba2-2.7b", "--block-size", "32", "--draft"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(
        "\n\nblock size 32 tokens, with draft head, recurrent state dtype model default "
        "(bfloat16); MiB = 2**20 bytes, KiB = 2**10 bytes.\n"
        "KV tokens/ckpt = recurrent bytes per sequence / KV bytes per token.\n"
    )
    assert main(["sizes", "--model", "mamba2-2.7b", "--ssm-state-dtype", "float32"]) == 0
    assert (
        "\n\nblock size 16 tokens, without draft head, recurrent state dtype float32; "
        in capsys.readouterr().out
    )


def test_sizes_run_writes_to_the_stream_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """``sizes_cmd.run(args, out)`` writes the table to ``out`` only."""
    parser = argparse.ArgumentParser()
    sizes_cmd.add_arguments(parser)
    buffer = io.StringIO()
    assert sizes_cmd.run(parser.parse_args(["--model", "mamba2-2.7b"]), buffer) == 0
    assert capsys.readouterr() == ("", "")
    assert buffer.getvalue().startswith("model ")
    assert "\nmamba2-2.7b " in buffer.getvalue()


def test_format_table_checks_the_block_size() -> None:
    """The table itself refuses a block size below 1 (rather than printing n/a cells)."""
    with pytest.raises(InvalidConfigError, match="block_size must be an integer >= 1, got 0"):
        sizes_cmd.format_table([MODELS["nemotron-h-8b"]], 0, False)


def test_loading_sizes_cmd_does_not_import_torch() -> None:
    """``sim.sizes_cmd`` defers torch and :mod:`reference.sizes` to ``run``."""
    code = (
        "import sys, sim.sizes_cmd; "
        "print(sorted(m for m in ('torch', 'reference.sizes') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")


def test_outputs_exports_its_public_names() -> None:
    """``sim.outputs.__all__`` is the module's public API."""
    assert sorted(outputs.__all__) == [
        "OutputPathError",
        "atomic_writer",
        "check_output_dir",
        "check_output_file",
        "write_text_atomic",
    ]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.EACCES, "Permission denied"), "Permission denied"),
        (OSError("the disk is on fire"), "the disk is on fire"),
    ],
)
def test_a_temporary_that_cannot_be_created_is_reported_as_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str
) -> None:
    """When the temporary file cannot even be opened, the error is the OS's reason (or
    the error's text when it has no OS reason), not a second error from the cleanup."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(outputs, "open", refuse, raising=False)
    target = tmp_path / "r.json"
    with pytest.raises(OutputPathError) as info:
        write_text_atomic(target, "new")
    assert str(info.value) == f"cannot write {target}: {reason}"
    assert list(tmp_path.iterdir()) == []


def test_each_write_goes_through_its_own_hidden_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary is a hidden file next to the target, named after it, and unique
    per write (two writers of one target never share one)."""
    sources: list[Path] = []
    real = os.replace

    def replace(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
        sources.append(Path(source))
        real(source, destination)

    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "r.json"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two"
    first, second = sources
    assert first != second
    for source in sources:
        assert source.parent == tmp_path
        assert re.fullmatch(r"\.r\.json\.[0-9a-f]{12}\.tmp", source.name), source.name
