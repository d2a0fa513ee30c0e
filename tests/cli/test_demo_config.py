"""``hyckpt demo --config FILE``: configuration errors name the file and the key, and
suggest the near-miss of a mistyped key, as scenario files do."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference.errors import InvalidConfigError
from sim.cli import main
from sim.demo import load_config, load_default_config

DEFAULT = Path(__file__).resolve().parents[2] / "sim" / "default.toml"


def _config(tmp_path: Path, old: str, new: str) -> Path:
    text = DEFAULT.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "demo.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("branch_points =", "branch_pionts =", "prompt.branch_pionts: unknown key"),
        ("length = 3602", "lenth = 3602", "did you mean 'length'?"),
        ('namespace = "model"', 'namespace = "model"\ncapacty = 3', "index.capacty"),
        ("[index]\n", "[indx]\n", "indx: unknown key"),
        ('op = "pin"\nslot = 6', 'op = "pin"\nslott = 6', "index.ops[12].slott"),
        ("start = 0\nstop = 64\n\n", "start = 0\nstp = 64\n\n", "index.prompts.base.stp"),
        ("chunk_size = 6 ", "chunk_sise = 6 ", "exactness.chunk_sise"),
        ("[placement.branch]", "[placement.branchx]", "placement.branchx: unknown placement"),
        ('eviction = "lru"', 'eviction = "lrux"', "index: unknown eviction policy"),
        ("chunk_size = 1024", "chunk_size = 0", "prompt.chunk_size must be an integer >= 1"),
    ],
)
def test_demo_config_errors_name_the_file_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, message: str
) -> None:
    path = _config(tmp_path, old, new)
    assert main(["demo", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"hyckpt: error: {path}: ") and message in err, err
    assert out == "" and "Traceback" not in err
    with pytest.raises(InvalidConfigError, match=str(path)):
        load_config(path)


def test_a_good_demo_config_loads(tmp_path: Path) -> None:
    assert load_config(_config(tmp_path, "lookahead = 0", "lookahead = 0")) == (
        load_default_config()
    )
