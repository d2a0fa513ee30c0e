"""``hyckpt bench index``: reference index ``lookup`` vs the Rust seed's linear scan.

Compares :class:`reference.index.ReferenceIndex` with
:class:`sim.bench.seed_scan.PrefixCheckpoints` (a faithful port of seed 004, whose lookup
rehashes the whole prefix and scans every entry for each candidate length) on the same
workload, for every configuration ``(E entries, T tokens)`` of the cross product.

Workload (block size / hash unit ``B = 16`` tokens), drawn from its own
``random.Random(f"{seed}:{E}:{T}")`` so each configuration is reproducible on its own:

- **Sessions.** Multi-turn conversations in the style of the seed's usage: each turn
  retains one sliding-window checkpoint at ``checkpoint_tokens(end) = floor((end - B) / B)
  * B`` where ``end`` is the prompt length so far. A session has 6–10 turns (about 8, so
  about ``E / 8`` sessions; the last one is cut so the index holds exactly ``E``
  entries); its checkpoints are distinct multiples of ``B`` drawn uniformly from
  ``[B, T - G - 2B]`` (turn ``i`` ends at ``c_i + B + r``, ``0 <= r < B``, which retains
  ``c_i``), so every turn ends before ``T - G`` tokens and the next turn (at most
  ``G = T // 8`` new tokens) still fits in ``T``, the session's maximum length.
- **Prompts.** Session ``s``'s prompt is a unique header of one hash unit (its first two
  tokens encode ``s``, the rest are random) followed by a corpus of ``T - B`` random
  token ids shared by all sessions: ``prompt_s = header_s + corpus[:T - B]``. Only the
  corpus is stored; a session's prompt is materialised when it is needed and then
  dropped. Because the header differs, no two sessions share a key.
- **Build.** Both indexes get capacity ``E``, so nothing is evicted. The reference index
  gets one :class:`~reference.hashing.HashedPrompt` per session (its chain is hashed once)
  and ``reserve`` + ``publish`` per turn. The port hashes each entry's prefix on its own,
  as the seed's ``slot_for_write`` does (without its O(E) duplicate scan, which would make
  the build O(E**2); see :meth:`~sim.bench.seed_scan.PrefixCheckpoints.append_unchecked`).
- **Queries.** The next turn of a random session: its prompt up to ``L = end + g``
  tokens, where ``end`` is where its last turn ended and the turn's new tokens ``g`` are
  uniform in ``[1, G]``, looked up with ``lookup(model, prompt, 0, L - 1)``. The ``g``
  sequence comes from ``Random(f"{seed}:{T}:turns")``, the same for every entry count,
  so configurations that differ only in ``E`` search the same ranges (a lookup's work
  grows with ``g``, the distance to the last checkpoint). The expected answer is the
  session's last checkpoint; both implementations must return that token count (slots
  may differ).

Timings (``time.perf_counter``, garbage collection paused, one call at a time):

- reference **warm**: the query's ``HashedPrompt`` was built and hashed
  (``digest(L // B * B)``) before the timer starts, as a serving engine hashes a
  request's blocks once on arrival;
- reference **cold**: a plain token list, so the lookup includes hashing the prompt;
- **scan**: the port on a plain token list. It runs the same queries in the same order,
  at least one and as many as fit in the per-configuration budget (``--budget``
  seconds), capped at ``--queries``.

The reference's warm lookup does the same work at every ``E`` (one dictionary probe per
hash-unit boundary between the last checkpoint and ``L``), but the first lookup after a
request's prompt was built runs with a cold CPU cache and larger dictionaries miss more,
so its time still rises mildly with ``E``; repeating a lookup at once (hot cache) takes
the same time at 1k and 100k entries. The scan's time grows with ``E`` itself.

Reported times are means in microseconds (µs). Speedups are ``sum(scan) / sum(reference)``
over the queries the scan ran (the same queries for both), so a short scan run does not
compare different query mixes.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from tqdm import tqdm

from reference.api import Reservation
from reference.hashing import HashedPrompt
from reference.index import ReferenceIndex, make_index
from sim.bench.seed_scan import PrefixCheckpoints, checkpoint_tokens

#: Block size of the seed's cache and hash unit of the reference index, in tokens.
BLOCK = 16
#: Model name / namespace of every key.
MODEL = "bench-model"
#: Token ids are drawn from ``range(VOCAB)``.
VOCAB = 151_936
#: Turns per session are drawn from this inclusive range (about 8).
TURNS = (6, 10)

DEFAULT_ENTRIES = (1_000, 10_000, 100_000)
DEFAULT_TOKENS = (4_096, 32_768)
DEFAULT_QUERIES = 500
DEFAULT_BUDGET_S = 2.0
QUICK_ENTRIES = (64, 256)
QUICK_TOKENS = (256, 1_024)
QUICK_QUERIES = 50
QUICK_BUDGET_S = 0.5
#: The configuration the last line reports when it was run: ``(entries, tokens)``.
HEADLINE = (10_000, 32_768)
#: The next turn adds at most ``T // NEXT_TURN_DIVISOR`` tokens (``G``), in tokens.
NEXT_TURN_DIVISOR = 8
#: Smallest session length that leaves room for a checkpoint and a next turn, in tokens.
MIN_TOKENS = 4 * BLOCK


class BenchMismatchError(AssertionError):
    """The port and the reference index answered a query differently."""


@dataclass(frozen=True)
class Session:
    """One conversation: its header, retained checkpoints and where its last turn ended.

    Attributes:
        header: the first hash unit of its prompt (``BLOCK`` token ids, unique per session).
        checkpoints: retained prefix lengths in tokens, ascending (one per turn).
        end: length of the prompt after its last turn, in tokens.
    """

    header: tuple[int, ...]
    checkpoints: tuple[int, ...]
    end: int


class Query(NamedTuple):
    """The next turn of ``session``: its prompt up to ``length`` tokens.

    ``expected`` is the token count the lookup must return (the last checkpoint).
    """

    session: int
    length: int
    expected: int


@dataclass(frozen=True)
class Workload:
    """Sessions over a shared corpus, and the queries to time (see the module docstring).

    Attributes:
        entries: checkpoints in the index (sum of the sessions' turns).
        tokens: maximum session length ``T`` in tokens.
        corpus: ``T - BLOCK`` token ids shared by every session after its header.
        sessions: the sessions, each owning ``len(checkpoints)`` entries.
        queries: lookups to time, in order.
    """

    entries: int
    tokens: int
    corpus: list[int]
    sessions: list[Session]
    queries: list[Query]

    def prompt(self, session: int, length: int) -> list[int]:
        """Token ids of ``session``'s prompt cut at ``length`` tokens (``BLOCK <= length <= T``)."""
        return [*self.sessions[session].header, *self.corpus[: length - BLOCK]]


@dataclass(frozen=True)
class BenchRow:
    """Results of one configuration. Times in microseconds (µs) or seconds (``_s``).

    Attributes:
        entries: checkpoints in each index.
        tokens: maximum session (prompt) length in tokens.
        sessions: sessions in the workload.
        queries: lookups timed on the reference (warm and cold each).
        scan_queries: lookups timed on the port (the first ``scan_queries`` of them).
        ref_warm_us: mean reference lookup time with a pre-hashed ``HashedPrompt``.
        ref_cold_us: mean reference lookup time with a plain token list.
        scan_us: mean port lookup time.
        speedup_warm: port time / warm reference time over the same ``scan_queries``.
        speedup_cold: port time / cold reference time over the same ``scan_queries``.
        build_ref_s: seconds to build the reference index.
        build_scan_s: seconds to build the port's index.
        warm_s, cold_s, scan_s: per-query seconds behind the means, in query order.
    """

    entries: int
    tokens: int
    sessions: int
    queries: int
    scan_queries: int
    ref_warm_us: float
    ref_cold_us: float
    scan_us: float
    speedup_warm: float
    speedup_cold: float
    build_ref_s: float
    build_scan_s: float
    warm_s: tuple[float, ...] = field(default=(), repr=False)
    cold_s: tuple[float, ...] = field(default=(), repr=False)
    scan_s: tuple[float, ...] = field(default=(), repr=False)


# --- workload ------------------------------------------------------------------------


def make_workload(entries: int, tokens: int, queries: int, seed: int) -> Workload:
    """The seeded workload of one configuration (see the module docstring).

    Args:
        entries: checkpoints to hold (``>= 1``).
        tokens: maximum session length ``T`` in tokens (``>= MIN_TOKENS``).
        queries: lookups to draw (``>= 1``).
        seed: base seed; the configuration's RNG is ``Random(f"{seed}:{entries}:{tokens}")``.
    """
    _check_sizes([entries], [tokens], queries, 0.0)
    rng = random.Random(f"{seed}:{entries}:{tokens}")
    corpus = [rng.randrange(VOCAB) for _ in range(tokens - BLOCK)]
    next_turn = tokens // NEXT_TURN_DIVISOR
    # Checkpoint c ends its turn at c + BLOCK + r < T - G, so c <= T - G - 2 * BLOCK.
    options = range(BLOCK, tokens - next_turn - 2 * BLOCK + 1, BLOCK)
    sessions: list[Session] = []
    remaining = entries
    while remaining:
        index = len(sessions)
        turns = min(rng.randint(*TURNS), remaining, len(options))
        checkpoints = tuple(sorted(rng.sample(options, turns)))
        end = checkpoints[-1] + BLOCK + rng.randrange(BLOCK)
        assert checkpoint_tokens(end, BLOCK) == checkpoints[-1] and end < tokens - next_turn
        header = (
            index % VOCAB,
            index // VOCAB,
            *(rng.randrange(VOCAB) for _ in range(BLOCK - 2)),
        )
        sessions.append(Session(header, checkpoints, end))
        remaining -= turns
    turns_rng = random.Random(f"{seed}:{tokens}:turns")  # same new-turn lengths for every E
    drawn: list[Query] = []
    for _ in range(queries):
        index = rng.randrange(len(sessions))
        session = sessions[index]
        length = session.end + turns_rng.randint(1, next_turn)
        drawn.append(Query(index, length, session.checkpoints[-1]))
    return Workload(entries, tokens, corpus, sessions, drawn)


# --- building ------------------------------------------------------------------------


def build_reference(workload: Workload, progress: bool = False) -> tuple[ReferenceIndex, float]:
    """The reference index holding every session's checkpoints, and the build time (s).

    Each session's prompt is hashed once through one ``HashedPrompt``; every turn's
    checkpoint is reserved and published with it.
    """
    index = make_index(workload.entries, first_slot=0, eviction="lru", hash_unit=BLOCK)
    started = time.perf_counter()
    for number, session in enumerate(
        _bar(workload.sessions, progress, f"build reference E={workload.entries}")
    ):
        prompt = HashedPrompt(workload.prompt(number, session.end), namespace=MODEL, unit=BLOCK)
        for tokens in session.checkpoints:
            outcome = index.reserve(MODEL, prompt, tokens)
            if not isinstance(outcome, Reservation):
                raise RuntimeError(
                    f"building the reference index: reserve of session {number} at {tokens} "
                    f"tokens gave {outcome!r}; capacity {workload.entries} should fit every "
                    "entry"
                )
            index.publish(outcome)
    return index, time.perf_counter() - started


def build_scan(workload: Workload, progress: bool = False) -> tuple[PrefixCheckpoints, float]:
    """The seed port holding every session's checkpoints, and the build time (s).

    Each entry's key hashes its whole prefix on its own, as the seed does.
    """
    index = PrefixCheckpoints(0, workload.entries)
    started = time.perf_counter()
    for number, session in enumerate(
        _bar(workload.sessions, progress, f"build scan E={workload.entries}")
    ):
        prompt = workload.prompt(number, session.end)
        for tokens in session.checkpoints:
            index.append_unchecked(MODEL, prompt, tokens)
    return index, time.perf_counter() - started


# --- timing --------------------------------------------------------------------------


def time_reference(workload: Workload, index: ReferenceIndex) -> tuple[list[float], list[float]]:
    """Seconds of every query's warm and cold reference lookup, in query order.

    Raises:
        BenchMismatchError: a lookup did not return the session's last checkpoint.
    """
    warm: list[float] = []
    cold: list[float] = []
    clock = time.perf_counter
    first = workload.queries[0]  # one untimed warm-up lookup
    index.lookup(MODEL, workload.prompt(first.session, first.length), 0, first.length - 1)
    with _gc_paused():
        for query in workload.queries:
            tokens = workload.prompt(query.session, query.length)
            hashed = HashedPrompt(tokens, namespace=MODEL, unit=BLOCK)
            hashed.digest(len(hashed) // BLOCK * BLOCK)  # the engine hashed it on arrival
            started = clock()
            hit = index.lookup(MODEL, hashed, 0, query.length - 1)
            warm.append(clock() - started)
            _check(query, hit[0] if hit else None, "reference (warm)")
            started = clock()
            hit = index.lookup(MODEL, tokens, 0, query.length - 1)
            cold.append(clock() - started)
            _check(query, hit[0] if hit else None, "reference (cold)")
    return warm, cold


def time_scan(workload: Workload, index: PrefixCheckpoints, budget_s: float) -> list[float]:
    """Seconds of the port's lookups: the first queries, at least one, within ``budget_s``.

    Raises:
        BenchMismatchError: a lookup did not return the session's last checkpoint.
    """
    seconds: list[float] = []
    clock = time.perf_counter
    first = workload.queries[0]  # one untimed warm-up lookup, as the reference gets
    index.lookup(MODEL, workload.prompt(first.session, first.length), 0, first.length - 1)
    deadline = clock() + budget_s
    with _gc_paused():
        for query in workload.queries:
            if seconds and clock() >= deadline:
                break
            tokens = workload.prompt(query.session, query.length)
            started = clock()
            hit = index.lookup(MODEL, tokens, 0, query.length - 1)
            seconds.append(clock() - started)
            _check(query, hit[0] if hit else None, "seed scan")
    return seconds


def run_config(
    entries: int,
    tokens: int,
    queries: int,
    seed: int,
    budget_s: float,
    progress: bool = False,
) -> BenchRow:
    """Build both indexes for one configuration, time their lookups and compare answers.

    Args:
        entries: checkpoints per index.
        tokens: maximum session length in tokens.
        queries: reference lookups to time (warm and cold each).
        seed: base seed of the workload.
        budget_s: seconds the port's lookups may take (at least one always runs).
        progress: show tqdm bars for the builds on stderr.

    Raises:
        BenchMismatchError: the implementations (or the expected answer) disagree.
    """
    workload = make_workload(entries, tokens, queries, seed)
    reference, build_ref_s = build_reference(workload, progress)
    warm, cold = time_reference(workload, reference)
    del reference
    scan, build_scan_s = build_scan(workload, progress)
    scanned = time_scan(workload, scan, budget_s)
    del scan
    ran = len(scanned)
    return BenchRow(
        entries=entries,
        tokens=tokens,
        sessions=len(workload.sessions),
        queries=len(warm),
        scan_queries=ran,
        ref_warm_us=_mean_us(warm),
        ref_cold_us=_mean_us(cold),
        scan_us=_mean_us(scanned),
        speedup_warm=sum(scanned) / max(sum(warm[:ran]), 1e-12),
        speedup_cold=sum(scanned) / max(sum(cold[:ran]), 1e-12),
        build_ref_s=build_ref_s,
        build_scan_s=build_scan_s,
        warm_s=tuple(warm),
        cold_s=tuple(cold),
        scan_s=tuple(scanned),
    )


def run_benchmark(
    entries: list[int],
    tokens: list[int],
    queries: int,
    seed: int,
    budget_s: float,
    progress: bool,
) -> list[BenchRow]:
    """One :class:`BenchRow` per ``(entries, tokens)`` pair, entries outer, in input order.

    Args:
        entries: index sizes (checkpoints), each ``>= 1``.
        tokens: maximum session lengths in tokens, each ``>= MIN_TOKENS``.
        queries: reference lookups per configuration (``>= 1``).
        seed: base seed of every workload.
        budget_s: seconds per configuration for the port's lookups (``>= 0``).
        progress: show a tqdm bar over configurations (and builds) on stderr.

    Raises:
        ValueError: a size is out of range.
        BenchMismatchError: the port and the reference disagree on a query.
    """
    _check_sizes(entries, tokens, queries, budget_s)
    configs = [(e, t) for e in _unique(entries) for t in _unique(tokens)]
    rows: list[BenchRow] = []
    with tqdm(total=len(configs), desc="bench index", unit="config", disable=not progress) as bar:
        for count, length in configs:
            bar.set_postfix_str(f"E={count} T={length}")
            rows.append(run_config(count, length, queries, seed, budget_s, progress))
            bar.update()
    return rows


# --- report --------------------------------------------------------------------------


def format_ratio(ratio: float) -> str:
    """``1234x`` when ``ratio >= 10``, else one decimal (``3.2x``)."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def format_table(rows: Sequence[BenchRow]) -> list[str]:
    """The result table as text lines (times in µs)."""
    header = (
        "entries",
        "prompt tokens",
        "ref lookup µs (warm)",
        "ref lookup µs (cold)",
        "scan µs",
        "scan n",
        "speedup warm",
        "speedup cold",
    )
    body = [
        (
            str(row.entries),
            str(row.tokens),
            f"{row.ref_warm_us:.1f}",
            f"{row.ref_cold_us:.1f}",
            f"{row.scan_us:.1f}",
            str(row.scan_queries),
            format_ratio(row.speedup_warm),
            format_ratio(row.speedup_cold),
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in (header, *body)) for i in range(len(header))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))
        for cells in (header, *body)
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def scaling_line(rows: Sequence[BenchRow]) -> str | None:
    """Warm reference lookup time at the most vs the fewest entries, at the longest prompts.

    ``None`` when the run has a single entry count. Both configurations search the same
    ranges (the same new-turn lengths), so a ratio near 1 shows that the lookup's work
    does not grow with the number of entries; the scan's ratio over the queries both of
    its runs timed is shown for contrast.
    """
    length = max(row.tokens for row in rows)
    same = [row for row in rows if row.tokens == length]
    few = min(same, key=lambda row: row.entries)
    many = max(same, key=lambda row: row.entries)
    if few.entries == many.entries:
        return None
    ratio = many.ref_warm_us / max(few.ref_warm_us, 1e-12)
    line = (
        f"reference warm lookup at {many.entries} vs {few.entries} entries, {length} tokens: "
        f"{many.ref_warm_us:.1f} µs vs {few.ref_warm_us:.1f} µs = {ratio:.2f}x "
        f"for {format_ratio(many.entries / few.entries)} the entries"
    )
    common = min(len(many.scan_s), len(few.scan_s))
    if common:
        scan_ratio = sum(many.scan_s[:common]) / max(sum(few.scan_s[:common]), 1e-12)
        line += f" (scan: {scan_ratio:.2f}x over its first {common} queries)"
    return line


def headline_row(rows: Sequence[BenchRow]) -> BenchRow:
    """The row the last line reports: ``HEADLINE`` if it ran, else the largest one run."""
    for row in rows:
        if (row.entries, row.tokens) == HEADLINE:
            return row
    return max(rows, key=lambda row: (row.entries * row.tokens, row.entries, row.tokens))


def headline(rows: Sequence[BenchRow]) -> str:
    """``lookup speedup vs scan at <E> entries, <T> tokens: <N>x`` (warm speedup)."""
    row = headline_row(rows)
    return (
        f"lookup speedup vs scan at {row.entries} entries, {row.tokens} tokens: "
        f"{format_ratio(row.speedup_warm)}"
    )


def report(rows: Sequence[BenchRow]) -> list[str]:
    """Every line ``main`` prints: table, notes, scaling line, and the headline last."""
    lines = format_table(rows)
    lines.append(
        "speedups: scan time / reference time over the same queries (the first `scan n`); "
        "warm = request pre-hashed, cold = hashing included"
    )
    scaling = scaling_line(rows)
    if scaling is not None:
        lines.append(scaling)
    lines.append(headline(rows))
    return lines


# --- command line --------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``hyckpt bench index``'s options to ``parser``."""
    parser.add_argument(
        "--entries",
        type=int,
        nargs="+",
        default=list(DEFAULT_ENTRIES),
        metavar="E",
        help="index sizes in checkpoints (default: %(default)s)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=list(DEFAULT_TOKENS),
        metavar="T",
        help="maximum session (prompt) lengths in tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--queries",
        type=int,
        default=DEFAULT_QUERIES,
        help="reference lookups per configuration; the scan runs at most as many "
        "(default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help="time for the scan's lookups per configuration; at least one always runs "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny sizes for CI: entries {' '.join(map(str, QUICK_ENTRIES))}, tokens "
        f"{' '.join(map(str, QUICK_TOKENS))}, at most {QUICK_QUERIES} queries and "
        f"{QUICK_BUDGET_S} s per configuration (overrides --entries/--tokens)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args`` (see :func:`add_arguments`); print the report.

    Returns 0, or 2 when an option is out of range (the reason goes to stderr).
    """
    entries: list[int] = list(args.entries)
    tokens: list[int] = list(args.tokens)
    queries: int = args.queries
    budget_s: float = args.budget
    if args.quick:
        entries, tokens = list(QUICK_ENTRIES), list(QUICK_TOKENS)
        queries = min(queries, QUICK_QUERIES)
        budget_s = min(budget_s, QUICK_BUDGET_S)
    try:
        _check_sizes(entries, tokens, queries, budget_s)
    except ValueError as error:
        print(f"hyckpt bench index: error: {error}", file=sys.stderr)
        return 2
    progress = not getattr(args, "no_progress", False)
    rows = run_benchmark(entries, tokens, queries, args.seed, budget_s, progress)
    for line in report(rows):
        print(line)
    return 0


# --- helpers -------------------------------------------------------------------------


def _check_sizes(
    entries: Sequence[int], tokens: Sequence[int], queries: int, budget_s: float
) -> None:
    """Raise ``ValueError`` naming the first option out of range."""
    if not entries or not tokens:
        raise ValueError("give at least one entry count and one token count")
    if any(count < 1 for count in entries):
        raise ValueError(f"entries must be >= 1, got {list(entries)}")
    if any(length < MIN_TOKENS for length in tokens):
        raise ValueError(
            f"tokens must be >= {MIN_TOKENS} (room for a checkpoint of {BLOCK}-token blocks "
            "and a next turn), "
            f"got {list(tokens)}"
        )
    if queries < 1:
        raise ValueError(f"queries must be >= 1, got {queries}")
    if not budget_s >= 0:
        raise ValueError(f"budget must be >= 0 seconds, got {budget_s}")


def _unique(values: Sequence[int]) -> list[int]:
    """``values`` without repeats, first occurrences in order."""
    return list(dict.fromkeys(values))


def _check(query: Query, tokens: int | None, who: str) -> None:
    """Raise :class:`BenchMismatchError` unless ``tokens`` is the expected answer."""
    if tokens != query.expected:
        raise BenchMismatchError(
            f"{who} returned {tokens} tokens for session {query.session} at length "
            f"{query.length}; expected its last checkpoint, {query.expected} tokens"
        )


def _mean_us(seconds: Sequence[float]) -> float:
    """Mean of ``seconds`` in microseconds (0 when empty)."""
    return sum(seconds) / len(seconds) * 1e6 if seconds else 0.0


def _bar(items: list[Session], progress: bool, desc: str) -> Iterator[Session]:
    """``items`` under a transient tqdm bar on stderr (plain iteration if not ``progress``)."""
    yield from tqdm(items, desc=desc, unit="session", leave=False, disable=not progress)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (timed loops create no cycles)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
