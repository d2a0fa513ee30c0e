"""Shared by the report tests (tests/report/test_report*.py): hand-made result documents shaped
like ``SimResult.to_json`` plus sweep fields, writing them as a results folder, and
reading back what the figures and the summary table drew."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.colors import to_hex
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from sim.report.data import Row

#: The figures every hand-made sweep draws (the load figure needs a swept arrival rate).
FIGURES = ("hit_rate_vs_pool", "over_time", "evictions", "flops_ttft")
MEMORY = "memory GiB (weights / live / pool / KV)"


def result_doc(
    placement: str, eviction: str, slots: int, seed: int, hit: float, evictions: int = 3
) -> dict[str, Any]:
    """A hand-made result document shaped like SimResult.to_json (plus sweep fields)."""
    return {
        "format_version": 1,
        "seed": seed,
        "versions": {"hyckpt": "0.1.0", "python": "3.11.0", "simpy": "4.1.2", "torch": "2.0"},
        "config": {"placement": placement, "eviction": eviction, "checkpoint_slots": slots},
        "workload": {"name": "multi_turn_chat", "scenario": "hand-made"},
        "backend": {"name": "shadow"},
        "costs": {},
        "pools": {
            "checkpoint_slots": slots,
            "checkpoint_pool_bytes": slots * 50 * 2**20,
            "memory": {
                "gpu_bytes": 100 * 2**30,
                "usable_bytes": 90 * 2**30,
                "weights_bytes": 40 * 2**30,
                "live_state_bytes": 2 * 2**30,
                "checkpoint_pool_bytes": 8 * 2**30,
                "kv_pool_bytes": 17.5 * 2**30,
                "overcommit_bytes": 0,
            },
        },
        "faults": {},
        "totals": {
            "requests": {"arrived": 10, "admitted": 9, "finished": 9, "rejected": 1},
            "preemptions": 2,
            "token_hit_rate": hit,
            "request_hit_rate": hit + 0.1,
            "prompt_tokens": 10_000,
            "recomputed_tokens": int(10_000 * (1 - hit)),
            "flops_saved": hit * 1e14,
            "evictions": {"checkpoint:capacity": evictions, "kv:lru": 2 * evictions},
            "checkpoint_bytes_in_use": {"final": slots * 2**20, "peak": slots * 2**20},
            "ttft": {"p50_s": 0.01 + seed / 1000, "p90_s": 0.02, "p99_s": 0.05, "count": 9},
            "sim_time_s": 50.0,
            "decode_tokens": 2_000,
            "compute_busy_s": 12.5,
            "queue": {"queued_share": 0.25, "peak_waiting": 3, "waiting_at_last_arrival": 0},
        },
        "lockstep": {"ok": True, "counts": {}, "violations": []},
        "series": {
            "t_s": [1.0, 2.0, 3.0],
            "token_hit_rate": [0.0, hit / 2, hit],
            "checkpoint_bytes_in_use": [0, slots * 2**19, slots * 2**20],
            "evictions_checkpoint": [0, 1, evictions],
            "evictions_kv": [0, 2, 2 * evictions],
            "flops_saved": [0.0, 1.0, 2.0],
            "ttft_p50_s": [None, 0.01, 0.01],
        },
        "scenario": "hand-made",
        "sweep": {
            "eviction.policy": eviction,
            "cache.checkpoint_slots": slots,
            "scenario.seed": seed,
        },
        "git_revision": "0123456789abcdef",
    }


def write_results(folder: Path, docs: list[dict[str, Any]]) -> Path:
    results = folder / "results"
    results.mkdir(parents=True)
    for i, doc in enumerate(docs):
        (results / f"{i:04d}.json").write_text(json.dumps(doc, indent=2))
    return folder


def sweep_docs() -> list[dict[str, Any]]:
    return [
        result_doc("turns", eviction, slots, seed, hit=0.1 * (i + 1) / 2)
        for i, (eviction, slots, seed) in enumerate(
            (e, s, d) for d in (0, 1) for e in ("lru", "fifo") for s in (4, 16)
        )
    ]


def table_rows(summary: str) -> list[dict[str, str]]:
    """The summary table's rows, each keyed by its column header."""

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|"))]

    lines = summary.splitlines()
    header = cells(next(line for line in lines if line.startswith("| file |")))
    return [dict(zip(header, cells(line), strict=True)) for line in lines if line.startswith("| 0")]


def many_policy_docs() -> list[dict[str, Any]]:
    """5 placements × 4 evictions (20 policies: more than matplotlib's 10 default colours)
    at two pool sizes."""
    docs = []
    for i, placement in enumerate(("turns", "block-floor", "interval", "every-n", "none")):
        for j, eviction in enumerate(("lru", "fifo", "size-aware", "flop-aware")):
            for slots in (8, 32):
                doc = result_doc(placement, eviction, slots, 0, 0.3 + 0.01 * (4 * i + j))
                doc["sweep"]["placement.policy"] = placement
                docs.append(doc)
    return docs


def drawn_styles(figure: Figure) -> dict[tuple[str, str, str], set[str]]:
    """(colour, dash, marker) of every line of ``figure`` → the legend labels drawn so."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for ax in figure.axes:
        for line in ax.get_lines():
            style = (to_hex(line.get_color()), str(line.get_linestyle()), str(line.get_marker()))
            labels = found.setdefault(style, set())
            if not str(line.get_label()).startswith("_"):
                labels.add(str(line.get_label()))
    return found


def style_rows(**axes: Sequence[object]) -> list[Row]:
    """One row per combination of ``axes`` (``placement``, ``eviction`` or a sweep key)."""
    rows = []
    for combo in itertools.product(*axes.values()):
        chosen = dict(zip(axes, combo, strict=True))
        placement = str(chosen.pop("placement", "turns"))
        eviction = str(chosen.pop("eviction", "lru"))
        doc = result_doc(placement, eviction, 8, 0, 0.3)
        doc["sweep"] = {"placement.policy": placement, "eviction.policy": eviction, **chosen}
        rows.append(Row(f"{len(rows):04d}.json", doc))
    return rows


def eviction_panels(figure: Figure) -> dict[str, dict[str, list[float]]]:
    """x label of each panel → legend label → bar widths (one per row)."""
    panels: dict[str, dict[str, list[float]]] = {}
    for ax in figure.axes:
        bars = panels.setdefault(ax.get_xlabel(), {})
        for container in ax.containers:
            if isinstance(container, BarContainer):
                bars[str(container.get_label())] = [p.get_width() for p in container.patches]
    return panels


def grid_docs(seeds: Sequence[int] = (1, 2, 3)) -> list[dict[str, Any]]:
    """memory-pressure's sweep: 4 pool sizes × 3 KV pools × 4 evictions × 3 seeds (144
    runs, 48 configurations); token hit rates at most 0.02, 100 × slots + seed checkpoint
    evictions."""
    docs = []
    for seed in seeds:
        for slots in (4, 8, 16, 32):
            for kv in (2048, 4096, 8192):
                for eviction in ("lru", "fifo", "size-aware", "flop-aware"):
                    hit = 0.0005 * slots * (1 + seed / 10)
                    doc = result_doc("turns", eviction, slots, seed, hit, evictions=100 * slots)
                    doc["totals"]["evictions"]["checkpoint:capacity"] += seed
                    doc["config"]["kv_blocks"] = kv
                    doc["sweep"] = {
                        "cache.checkpoint_slots": slots,
                        "cache.kv_blocks": kv,
                        "eviction.policy": eviction,
                        "scenario.seed": seed,
                    }
                    docs.append(doc)
    return docs


def rows_of(docs: Sequence[dict[str, Any]]) -> list[Row]:
    """``docs`` as rows named like the files write_results writes."""
    return [Row(f"{i:04d}.json", doc) for i, doc in enumerate(docs)]


def overcommit(doc: dict[str, Any], by: float = 20 * 2**30) -> dict[str, Any]:
    """``doc`` with a memory plan ``by`` bytes over the usable memory."""
    doc["pools"]["memory"].update(kv_pool_bytes=40 * 2**30 + by, overcommit_bytes=by)
    return doc


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def axis_rows(**axes: Sequence[object]) -> list[Row]:
    """One single-seed run per combination of sweep ``axes`` (in that sweep order)."""
    docs = []
    for combo in itertools.product(*axes.values()):
        doc = result_doc("turns", "lru", 8, 0, 0.3)
        doc["sweep"] = dict(zip(axes, combo, strict=True))
        docs.append(doc)
    return rows_of(docs)


def bars(ax: Any, label: str) -> list[float]:
    """Widths of ``ax``'s bars labelled ``label``, top row first."""
    (found,) = [c for c in ax.containers if c.get_label() == label]
    return [p.get_width() for p in sorted(found.patches, key=lambda p: p.get_y())]


def dots(ax: Any, label: str) -> list[float]:
    """Values of ``ax``'s dots labelled ``label`` (TTFT on a log scale), top row first."""
    (line,) = [line for line in ax.get_lines() if line.get_label() == label]
    return [float(x) for _, x in sorted(zip(line.get_ydata(), line.get_xdata(), strict=True))]


def model_doc(model: str, slots: int, seed: int, hit: float, **sweep: object) -> dict[str, Any]:
    """A run of a ``model.name`` sweep (slots follow from the model under a byte budget;
    no pool-size axis unless ``sweep`` adds one)."""
    doc = result_doc("turns", "lru", slots, seed, hit)
    doc["sweep"] = {"model.name": model, **sweep, "scenario.seed": seed}
    return doc


def over_time_lines(figure: Figure | str) -> dict[str, tuple[list[float], list[float]]]:
    """Each mean line of the over-time figure, by legend entry: its hit-rate and its
    checkpoint-memory (GiB) y values."""
    assert isinstance(figure, Figure)
    hits, memory = (
        [line for line in ax.get_lines() if line.get_linewidth() > 1] for ax in figure.axes[:2]
    )
    (legend,) = figure.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == len(hits) == len(memory)
    return {
        label: (list(hit.get_ydata()), list(gib.get_ydata()))
        for label, hit, gib in zip(labels, hits, memory, strict=True)
    }


def hit_rate_rows() -> list[Row]:
    """One policy at 16 then 4 slots, seeds 0..2 with token hit rates 0.1, 0.2, 0.6
    (× slots / 4); seed 1 at 16 slots does not fit; seed 2 at 4 slots has no request rate."""
    docs = []
    for slots in (16, 4):
        for seed, hit in zip((0, 1, 2), (0.1, 0.2, 0.6), strict=True):
            docs.append(result_doc("turns", "lru", slots, seed, hit * slots / 4))
    overcommit(docs[1])
    docs[5]["totals"]["request_hit_rate"] = None
    return rows_of(docs)


def scattered(ax: Any, size: int) -> list[tuple[float, float]]:
    """The points of ``ax``'s scatter dots of marker size ``size`` (y rounded to 9 places)."""
    return [
        (float(x), round(float(y), 9))
        for c in ax.collections
        if hasattr(c, "get_sizes") and c.get_sizes()[0] == size  # dots, not error bars
        for x, y in c.get_offsets()
    ]
