"""Running pytest in a subprocess of the repository, as an engine author runs the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_pytest(
    *args: str, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -q -p no:cacheprovider *args`` in the repository root, with the
    fast ``smoke`` Hypothesis profile; ``env`` adds (or overrides) environment variables."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HYPOTHESIS_PROFILE": "smoke", **(env or {})},
    )
