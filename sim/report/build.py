""":func:`build_report`: ``DIR/results/*.json`` → ``DIR/figures/*.png`` + ``DIR/summary.md``."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from sim.engine.config import MEMORY_PARTS
from sim.report.data import ReportError, Row, load_results

#: Where a report folder keeps its result files.
RESULTS_DIR = "results"
#: Where it keeps its figures.
FIGURES_DIR = "figures"
#: Its summary.
SUMMARY = "summary.md"

__all__ = ["FIGURES_DIR", "RESULTS_DIR", "SUMMARY", "ReportError", "build_report", "git_revision"]


def git_revision(where: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the checkout holding ``where`` (default: this source
    tree), or ``unknown``."""
    folder = where if where is not None else Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    revision = done.stdout.strip()
    return revision if done.returncode == 0 and revision else "unknown"


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


#: What the less obvious columns mean, printed under the table.
TABLE_NOTES = (
    "Hit rates are over admitted requests' first admissions; FLOPs saved counts each "
    "request's first issued restore (restores after a preemption are `resume_flops_saved` "
    "in the JSON). GPU memory: weights, live recurrent state, checkpoint pool and KV pool "
    "as a share of 90% of one GPU's memory (bold: more than fits).",
)


def table(rows: Sequence[Row]) -> list[str]:
    """The summary's results table, one line per result."""
    lines = [
        "| file | policy (placement × eviction) | pool (slots) | seed | admitted / arrived "
        "| token hit rate | request hit rate | recomputed tokens | FLOPs saved "
        "| preemptions | TTFT p50 (s) | TTFT p99 (s) | GPU memory | lockstep ok |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        recomputed = row.total("recomputed_tokens")
        admitted, arrived = row.total("requests", "admitted"), row.total("requests", "arrived")
        preemptions = row.total("preemptions")
        ok = row.lockstep_ok
        cells = [
            row.file,
            row.policy,
            row.pool_slots if row.pool_slots is not None else "n/a",
            row.seed,
            "n/a" if admitted is None or arrived is None else f"{admitted:.0f} / {arrived:.0f}",
            _fmt(row.total("token_hit_rate"), ".4f"),
            _fmt(row.total("request_hit_rate"), ".4f"),
            "n/a" if recomputed is None else str(int(recomputed)),
            _fmt(row.total("flops_saved"), ".3e"),
            "n/a" if preemptions is None else str(int(preemptions)),
            _fmt(row.total("ttft", "p50_s"), ".4f"),
            _fmt(row.total("ttft", "p99_s"), ".4f"),
            _memory_cell(row),
            "n/a" if ok is None else ("yes" if ok else "**NO**"),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _memory_plan(row: Row) -> dict[str, float] | None:
    pools = row.data.get("pools")
    plan = pools.get("memory") if isinstance(pools, dict) else None
    return plan if isinstance(plan, dict) and plan.get("usable_bytes") else None


def _memory_cell(row: Row) -> str:
    """Weights, live state, checkpoint and KV pools as a share of one GPU's usable memory."""
    plan = _memory_plan(row)
    if plan is None:
        return "n/a"
    used = sum(plan.get(part, 0) for part in MEMORY_PARTS)
    share = f"{used / plan['usable_bytes']:.0%}"
    return f"**{share}**" if plan.get("overcommit_bytes") else share


def _versions(rows: Sequence[Row]) -> list[str]:
    seen: list[str] = []
    for row in rows:
        found = row.data.get("versions")
        if isinstance(found, dict):
            text = ", ".join(f"{k} {v}" for k, v in sorted(found.items()))
            if text not in seen:
                seen.append(text)
    return seen or ["not recorded"]


def _revisions(rows: Sequence[Row]) -> list[str]:
    seen = sorted({str(r.data["git_revision"]) for r in rows if "git_revision" in r.data})
    if seen:
        return seen
    return [f"{git_revision()} (of the checkout building the report; not in the results)"]


def _axes(rows: Sequence[Row]) -> dict[str, list[str]]:
    axes: dict[str, list[str]] = {}
    for row in rows:
        for key, value in row.sweep.items():
            values = axes.setdefault(key, [])
            if str(value) not in values:
                values.append(str(value))
    return axes


def summary(rows: Sequence[Row], figures: dict[str, str | Path]) -> str:
    """The text of ``summary.md``."""
    from sim.report.figures import FIGURES

    scenarios = sorted({row.scenario for row in rows})
    seeds = sorted({str(row.seed) for row in rows}, key=lambda s: (len(s), s))
    lines = [
        f"# Report: {', '.join(scenarios)}",
        "",
        f"Built by `hyckpt report` from {len(rows)} result file(s) in `{RESULTS_DIR}/`.",
        "",
        f"- scenario: {', '.join(scenarios)}",
        f"- seeds: {', '.join(seeds)}",
        *(f"- versions: {v}" for v in _versions(rows)),
        *(f"- git revision: {r}" for r in _revisions(rows)),
    ]
    for key, values in _axes(rows).items():
        lines.append(f"- sweep axis `{key}`: {', '.join(values)}")
    bad = [row.file for row in rows if row.lockstep_ok is False]
    if bad:
        lines.append(f"- **lockstep violations** in: {', '.join(bad)}")
    overcommitted = [row.file for row in rows if (_memory_plan(row) or {}).get("overcommit_bytes")]
    if overcommitted:
        lines.append(
            "- **does not fit one GPU** (weights, live state, checkpoint and KV pools exceed "
            "90% of the preset's memory; read as a what-if or a model split over GPUs): "
            + ", ".join(overcommitted)
        )
    lines += ["", "## Results", "", *table(rows), "", *TABLE_NOTES, "", "## Figures", ""]
    for stem, (title, _) in FIGURES.items():
        lines.append(f"### {title}")
        lines.append("")
        drawn = figures[stem]
        if isinstance(drawn, Path):
            lines.append(f"![{title}]({FIGURES_DIR}/{drawn.name})")
        else:
            lines.append(f"_Skipped: {drawn}._")
        lines.append("")
    return "\n".join(lines)


def build_report(directory: Path) -> Path:
    """Rebuild ``directory``'s figures and ``summary.md`` from ``directory/results/*.json``;
    return the summary's path.

    Raises:
        ReportError: no results folder, no result in it, or a file that is not a result.
    """
    directory = Path(directory)
    from sim.report.figures import draw  # matplotlib: only when a report is built

    rows = load_results(directory / RESULTS_DIR)
    figures = draw(rows, directory / FIGURES_DIR)
    path = directory / SUMMARY
    path.write_text(summary(rows, figures))
    return path
