""":func:`build_report`: ``DIR/results/*.json`` → ``DIR/figures/*.png`` + ``DIR/summary.md``."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from sim.engine.config import MEMORY_PARTS
from sim.engine.costs import GIB
from sim.outputs import check_output_dir, check_output_file, write_text_atomic
from sim.report.data import (
    OVERCOMMIT_MARK,
    POOL_AXES,
    ReportError,
    Row,
    axis_name,
    configurations,
    load_results,
    shown_value,
    varying_axes,
)
from sim.report.stats import mean_interval, shown_interval

#: Where a report folder keeps its result files.
RESULTS_DIR = "results"
#: Where it keeps its figures.
FIGURES_DIR = "figures"
#: Its summary.
SUMMARY = "summary.md"
#: The figures' file stems, in report order: the keys of
#: :data:`sim.report.figures.FIGURES`, here so that checking the output paths does not
#: import matplotlib.
FIGURE_STEMS = ("hit_rate_vs_pool", "over_time", "evictions", "flops_ttft", "load")

__all__ = [
    "FIGURES_DIR",
    "FIGURE_STEMS",
    "RESULTS_DIR",
    "SUMMARY",
    "ReportError",
    "build_report",
    "check_report_output",
    "git_revision",
]


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


#: Swept axes the table shows in columns of their own already (policy, pool, seed).
SHOWN_AXES = frozenset(
    {"placement.policy", "eviction.policy", "cache.checkpoint_slots", "scenario.seed"}
)
#: Header of the memory-plan column.
MEMORY_COLUMN = "memory GiB (weights / live / pool / KV)"

#: What the less obvious columns mean, printed under the table.
TABLE_NOTES = (
    "Hit rates are over admitted requests, each hit counted at its request's first "
    "restore (issued before any of the request ran); FLOPs saved counts the same restores "
    "(a restore after some of its request ran and was preempted is `resume_flops_saved` "
    "in the JSON). After warm-up: the token hit rate of the requests admitted once the "
    "cache had first evicted to make room (or after `engine.warmup_requests`); "
    "`filling`: it never did. Pool: the checkpoint pool, in slots and GiB. "
    f"{MEMORY_COLUMN}: the run's GPU memory plan (`pools.memory`) — model weights, live "
    "recurrent state (`max_num_seqs` sequences), checkpoint pool, KV pool. Unless "
    "`kv_blocks` is set, the KV pool takes what the others leave of the usable memory (GPU "
    "memory line above), so the four add up to it. **Bold**, with the total as a share of "
    "the usable memory: the plan does not fit one GPU.",
)


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f}"


def _numeric(rows: Sequence[Row], key: str) -> bool:
    """Whether every value of sweep axis ``key`` is a number (its column aligns right)."""
    return all(
        isinstance(v, int | float) and not isinstance(v, bool)
        for row in rows
        if (v := row.sweep.get(key)) is not None
    )


def table_axes(rows: Sequence[Row]) -> dict[str, str]:
    """Swept axis → its column header, for every swept axis the table has no other
    column for (the policies, the pool size in slots and the seed have theirs)."""
    keys = list(dict.fromkeys(k for row in rows for k in row.sweep if k not in SHOWN_AXES))
    names = [axis_name(key) for key in keys]
    return {
        key: name if names.count(name) == 1 else key for key, name in zip(keys, names, strict=True)
    }


def table(rows: Sequence[Row]) -> list[str]:
    """The summary's results table, one line per result."""
    axes = table_axes(rows)
    speculative = any(row.total("speculative", "proposed") for row in rows)
    batch = any(makespan(row) is not None for row in rows)
    headers = [
        "file",
        "policy (placement × eviction)",
        *axes.values(),
        "pool (slots)",
        "pool (GiB)",
        "seed",
        "admitted / arrived",
        "token hit rate",
        "request hit rate",
        "token hit rate after warm-up",
        "recomputed tokens",
        "FLOPs saved",
        "preemptions",
        "TTFT p50 (s)",
        "TTFT p99 (s)",
        "output tok/s",
        *(["makespan (s)"] if batch else []),
        "queued",
        *(["spec accepted"] if speculative else []),
        MEMORY_COLUMN,
        "lockstep ok",
    ]
    text = {"file", "policy (placement × eviction)", "lockstep ok", MEMORY_COLUMN}
    text |= {name for key, name in axes.items() if not _numeric(rows, key)}
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if h in text else "---:" for h in headers) + "|",
    ]
    for row in rows:
        recomputed = row.total("recomputed_tokens")
        admitted, arrived = row.total("requests", "admitted"), row.total("requests", "arrived")
        preemptions = row.total("preemptions")
        ok = row.lockstep_ok
        sweep = row.sweep
        cells = [
            row.file,
            row.policy,
            *(shown_value(key, sweep[key]) if key in sweep else "n/a" for key in axes),
            row.pool_slots if row.pool_slots is not None else "n/a",
            _gib(row.pool_bytes),
            row.seed,
            "n/a" if admitted is None or arrived is None else f"{admitted:.0f} / {arrived:.0f}",
            _fmt(row.total("token_hit_rate"), ".4f"),
            _fmt(row.total("request_hit_rate"), ".4f"),
            _warm_cell(row),
            "n/a" if recomputed is None else str(int(recomputed)),
            _fmt(row.total("flops_saved"), ".3e"),
            "n/a" if preemptions is None else str(int(preemptions)),
            _fmt(row.total("ttft", "p50_s"), ".4f"),
            _fmt(row.total("ttft", "p99_s"), ".4f"),
            _fmt(_ratio(_delivered_output(row), row.total("sim_time_s")), ".0f"),
            *([_fmt(makespan(row), ".3f")] if batch else []),
            _percent(row.total("queue", "queued_share")),
            *(
                [
                    _percent(
                        _ratio(
                            row.total("speculative", "accepted"),
                            row.total("speculative", "proposed"),
                        )
                    )
                ]
                if speculative
                else []
            ),
            memory_cell(row),
            "n/a" if ok is None else ("yes" if ok else "**NO**"),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def makespan(row: Row) -> float | None:
    """Seconds from the arrival of a batch workload (every request arriving at once) to
    the last request finished; ``None`` for any other run (or one without the times)."""
    first, last = row.total("arrivals", "first_s"), row.total("arrivals", "last_s")
    end, arrived = row.total("sim_time_s"), row.total("requests", "arrived")
    if first is None or last is None or end is None or not arrived or arrived < 2:
        return None
    return end - first if first == last else None


def _filling(row: Row) -> bool:
    """Whether the run's cache never filled (``after_warmup.from_request`` null)."""
    warm = row._get("totals", "after_warmup")
    return isinstance(warm, dict) and warm.get("from_request") is None


def _warm_cell(row: Row) -> str:
    """The token hit rate after warm-up, or ``filling`` when the cache never filled (no
    steady state), ``n/a`` for a result without the field."""
    if _filling(row):
        return "filling"
    return _fmt(row.total("after_warmup", "token_hit_rate"), ".4f")


def still_filling(rows: Sequence[Row]) -> list[str]:
    """Files of runs whose cache never filled (``after_warmup.from_request`` null)."""
    return [row.file for row in rows if _filling(row)]


def _delivered_output(row: Row) -> float | None:
    """Output tokens delivered: decoded minus what preemptions threw away (results older
    than ``discarded_decode_tokens`` have no such count and show every decoded token)."""
    decoded = row.total("decode_tokens")
    if decoded is None:
        return None
    return decoded - (row.total("discarded_decode_tokens") or 0)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def memory_cell(row: Row) -> str:
    """The run's memory plan in GiB — weights / live state / checkpoint pool / KV pool —
    bold, with the total as a share of the usable memory, when it does not fit."""
    plan, used = row.memory, row.used_bytes
    if plan is None or used is None:
        return "n/a"
    text = " / ".join(_gib(plan.get(part)) for part in MEMORY_PARTS)
    if not row.overcommitted:
        return text
    return f"**{text} ({used / plan['usable_bytes']:.0%})**"


def _usable(rows: Sequence[Row]) -> list[str]:
    """The GPUs' usable memory, one line per kind of GPU in the results."""
    seen: list[str] = []
    for row in rows:
        plan = row.memory
        if plan is None or "gpu_bytes" not in plan:
            continue
        usable, total = plan["usable_bytes"], plan["gpu_bytes"]
        gpu = f"one {row.gpu}" if row.gpu else "one GPU"
        text = (
            f"{usable / GIB:.1f} GiB usable ({usable / total:.0%} of {gpu}'s {total / GIB:.1f} GiB)"
        )
        if text not in seen:
            seen.append(text)
    return seen


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
    """Swept axis → its values as given, a byte size followed by its GiB (``2147483648
    (2 GiB)``), in order of first appearance."""
    axes: dict[str, list[str]] = {}
    for row in rows:
        for key, value in row.sweep.items():
            values = axes.setdefault(key, [])
            shown = shown_value(key, value)
            text = str(value) if shown == str(value) else f"{value} ({shown})"
            if text not in values:
                values.append(text)
    return axes


def _pool_key(row: Row) -> tuple[str, float] | None:
    """The pool size of ``row`` as the report groups by it: the swept pool axes' values
    when the sweep has some (runs of one swept budget compare, whatever each engine's
    pools round to), else its cache memory (unified) or checkpoint slots; with a number
    to sort by."""
    swept = [(key, value) for key, value in row.sweep.items() if key in POOL_AXES]
    if swept:
        shown = ", ".join(f"{axis_name(k)}={shown_value(k, v)}" for k, v in swept)
        order = next((float(v) for _, v in swept if isinstance(v, int | float)), 0.0)
        return shown, order
    if row.unified and row.cache_bytes is not None:
        return f"{row.cache_bytes / GIB:.4g} GiB of cache memory", float(row.cache_bytes)
    if row.pool_slots is not None:
        return f"{row.pool_slots} slots", float(row.pool_slots)
    return None


def seeds_section(rows: Sequence[Row]) -> list[str]:
    """``## Across seeds``: each configuration's hit rates, mean ± 95 % interval over its
    seeds (:mod:`sim.report.stats`); nothing when no configuration has two seeds."""
    configs = configurations(rows)
    if not any(len(config.rows) > 1 for config in configs):
        return []
    lines = [
        "## Across seeds",
        "",
        "Each configuration's mean over its seeds ± the half-width of the 95% confidence "
        "interval of that mean (Student's t over the seeds, which are taken as independent "
        "draws of the workload; docs/REPORTS.md).",
        "",
        "| configuration | seeds | token hit rate | request hit rate |",
        "|---|---:|---:|---:|",
    ]
    for config in configs:
        token = [v for row in config.rows if (v := row.total("token_hit_rate")) is not None]
        request = [v for row in config.rows if (v := row.total("request_hit_rate")) is not None]
        lines.append(
            f"| {config.label} | {len(config.rows)} | {shown_interval(token)} | "
            f"{shown_interval(request)} |"
        )
    return [*lines, ""]


def best_policy_section(rows: Sequence[Row]) -> list[str]:
    """``## Best policy per pool size``: at each pool size, the configuration (policy and
    the other varying axes) with the highest mean token hit rate, the runner-up, and
    whether their 95 % intervals are apart; nothing when no pool size has two."""
    varying = varying_axes(rows)
    by_pool: dict[str, dict[str, list[float]]] = {}
    order: dict[str, float] = {}
    for row in rows:
        key, value = _pool_key(row), row.total("token_hit_rate")
        if key is None or value is None:
            continue
        order[key[0]] = key[1]
        by_pool.setdefault(key[0], {}).setdefault(row.curve(varying), []).append(value)
    if not any(len(found) > 1 for found in by_pool.values()):
        return []
    lines = [
        "## Best policy per pool size",
        "",
        "Highest mean token hit rate at each pool size (± 95% interval over seeds), the "
        "runner-up, and whether the two intervals are apart (`no`: the seeds do not tell "
        "them apart; `n/a`: one seed).",
        "",
        "| pool | best | token hit rate | runner-up | token hit rate | apart |",
        "|---|---|---:|---|---:|---|",
    ]
    for pool in sorted(by_pool, key=lambda name: order[name]):
        ranked = sorted(
            by_pool[pool].items(), key=lambda item: (-mean_interval(item[1])[0], item[0])
        )
        if len(ranked) < 2:
            continue
        (best, best_values), (second, second_values) = ranked[0], ranked[1]
        (high, high_half), (low, low_half) = (
            mean_interval(best_values),
            mean_interval(second_values),
        )
        apart = (
            "n/a"
            if high_half is None or low_half is None
            else ("yes" if high - high_half > low + low_half else "no")
        )
        lines.append(
            f"| {pool} | {best} | {shown_interval(best_values)} | {second} | "
            f"{shown_interval(second_values)} | {apart} |"
        )
    return [*lines, ""]


#: What :func:`sim.report.figures.draw` did for one figure: why it was skipped, the PNG
#: it wrote, or each page's PNG with its caption.
Drawn = str | Path | list[tuple[Path, str]]


def figure_section(title: str, drawn: Drawn) -> list[str]:
    """One figure's part of ``summary.md``: its heading, then its PNG, each page's PNG
    under its caption, or why it was skipped."""
    from sim.report.figures import PAGE_SIZE

    lines = [f"### {title}", ""]
    if isinstance(drawn, Path):
        return [*lines, f"![{title}]({FIGURES_DIR}/{drawn.name})", ""]
    if isinstance(drawn, str):
        return [*lines, f"_Skipped: {drawn}._", ""]
    lines += [
        f"More configurations than one figure holds ({PAGE_SIZE}): {len(drawn)} pages, "
        "each panel on the same scale in all of them.",
        "",
    ]
    for path, caption in drawn:
        lines += [f"{caption} (`{FIGURES_DIR}/{path.name}`):", ""]
        lines += [f"![{title}, {caption}]({FIGURES_DIR}/{path.name})", ""]
    return lines


#: Notes naming result files list at most this many; beyond, they count them.
LISTED_FILES = 4


def summary(rows: Sequence[Row], figures: Mapping[str, Drawn]) -> str:
    """The text of ``summary.md``; ``figures``: what :func:`sim.report.figures.draw` did
    (stem → :data:`Drawn`)."""
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
    lines += [f"- GPU memory: {text}" for text in _usable(rows)]
    overcommitted = [row.file for row in rows if row.overcommitted]
    if overcommitted:
        lines.append(
            "- **does not fit one GPU** (weights, live state, checkpoint and KV pools exceed "
            "90% of the preset's memory: result files written before such plans were "
            f"refused; marked {OVERCOMMIT_MARK} in the figures): " + ", ".join(overcommitted)
        )
    admitted_none = [
        row.file for row in rows if row.total("requests", "arrived") and not row.admitted
    ]
    if admitted_none:
        lines.append(
            "- **admitted no request** (every request rejected, e.g. a KV pool too small for "
            "one prompt; hit rates n/a, not drawn): " + ", ".join(admitted_none)
        )
    from sim.engine.command import overloaded

    heavy = [row.file for row in rows if overloaded(row.data.get("totals"))]
    if heavy:
        lines.append(
            "- **overloaded** (the admission queue never drained while requests arrived: "
            "TTFT measures the queue, and the hit rates a system no engine would run): "
            + ", ".join(heavy)
        )
    longer = {
        row.file: int(over) for row in rows if (over := row.total("requests", "over_model_context"))
    }
    if longer:
        low, high = min(longer.values()), max(longer.values())
        where = (
            ", ".join(f"{file} ({count})" for file, count in longer.items())
            if len(longer) <= LISTED_FILES
            else f"{len(longer)} of {len(rows)} runs, "
            + (f"{low}" if low == high else f"{low} to {high}")
            + " requests each"
        )
        lines.append(
            "- **requests longer than the model's context** served whole (no "
            "`engine.max_model_len`; vLLM and SGLang would refuse or cut them by default, "
            "docs/SIMULATION.md): " + where
        )
    filling = still_filling(rows)
    if filling:
        lines.append(
            "- **cache still filling at the end** (it never evicted: the hit rates hold no "
            "steady state, and a longer run or a smaller pool would show one): "
            + ", ".join(filling)
        )
    lines += ["", "## Results", "", *table(rows), "", *TABLE_NOTES, ""]
    lines += [*seeds_section(rows), *best_policy_section(rows), "## Figures", ""]
    for stem, (title, _) in FIGURES.items():
        lines += figure_section(title, figures[stem])
    return "\n".join(lines)


def check_report_output(directory: Path) -> None:
    """Check, without drawing or writing anything, that a report can be written into
    ``directory``: ``figures/`` is a writable folder or can be created as one, and each
    figure's PNG and ``summary.md`` a writable file path, not a folder. Cheap (no
    matplotlib): run it before the simulations whose report goes there.

    Raises:
        OutputPathError: a path cannot be written (which, and why).
    """
    directory = Path(directory)
    figures = check_output_dir(directory / FIGURES_DIR)
    for stem in FIGURE_STEMS:
        check_output_file(figures / f"{stem}.png", create_parents=True)
    check_output_file(directory / SUMMARY, create_parents=True)


def remove_temporaries(*folders: Path) -> None:
    """Remove the hidden temporary files (``.<name>.<random>.tmp``) that a write killed
    half-way (``kill -9``, a power cut) left in ``folders``: nothing else cleans them."""
    for folder in folders:
        if folder.is_dir():
            for leftover in folder.glob(".*.tmp"):
                if leftover.is_file():
                    leftover.unlink(missing_ok=True)


def build_report(directory: Path) -> Path:
    """Rebuild ``directory``'s figures and ``summary.md`` from ``directory/results/*.json``;
    return the summary's path.

    The output paths are checked (:func:`check_report_output`) before anything is drawn,
    and every file is written to a temporary file beside it that replaces it once
    complete: a write that fails leaves that file as it was.

    Raises:
        ReportError: no results folder, no result in it, or a file that is not a result.
        OutputPathError: a figure or the summary cannot be written.
    """
    directory = Path(directory)
    from sim.report.figures import draw  # matplotlib: only when a report is built

    rows = load_results(directory / RESULTS_DIR)
    check_report_output(directory)
    remove_temporaries(directory, directory / FIGURES_DIR)
    figures = draw(rows, directory / FIGURES_DIR)
    return write_text_atomic(directory / SUMMARY, summary(rows, figures))
