"""A run's sampled time series, kept at a bounded number of rows (docs/REPORTS.md, "The
time series' cap").

The engine takes one *sample* per ``sample_interval_s`` of simulated time
(:meth:`sim.engine.metrics.Metrics.sample`). Each row of the series holds
:attr:`Series.samples_per_row` consecutive samples, 1 until the series first reaches
:attr:`Series.max_rows` rows: then every two adjacent rows are merged into one and
``samples_per_row`` doubles, so a run of any length keeps between ``max_rows / 2`` and
``max_rows`` rows (fewer only when it never had more), each row covering the same
number of samples but the last (which may be partial). A run that never reaches the cap
keeps every sample as its own row, exactly as sampled.

How a merged row combines its samples, column by column:

- :data:`LAST_COLUMNS` — the sample time and step, and every running total (requests
  finished, prompt / hit / recomputed tokens, FLOPs saved, evictions, preemptions, and
  the cumulative hit rates): the row's **last** sample. They are cumulative, so that
  value is the exact sum of everything counted up to the row's end; consecutive rows
  still differ by what happened between them.
- :data:`MEAN_COLUMNS` — the gauges (requests running and waiting, KV blocks in use and
  cached, checkpoint slots and bytes in use): the **mean** over the row's samples (each
  sample counted once, not weighted by time), computed from the exact integer sum and
  rounded once. A merged series writes them as floats; peaks are exact in the totals.
- :data:`TTFT_COLUMNS` — the TTFT percentiles over every request whose first token came
  in the row's span (the union of its samples' windows), computed exactly from the
  run's TTFTs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

#: The most rows a series keeps (even). At about 350 bytes of indented JSON a row (21
#: cells of at most 32 bytes), a result's series stays under 1.4 MB however long the run.
MAX_ROWS = 2048
#: Columns a merged row takes from its last sample (the time, the step, running totals).
LAST_COLUMNS = (
    "t_s",
    "step",
    "finished",
    "prompt_tokens",
    "hit_tokens",
    "recomputed_tokens",
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "evictions_checkpoint",
    "evictions_kv",
    "preemptions",
)
#: Gauges: a merged row holds their mean over its samples.
MEAN_COLUMNS = (
    "running",
    "waiting",
    "kv_blocks_in_use",
    "kv_blocks_cached",
    "checkpoint_slots_in_use",
    "checkpoint_bytes_in_use",
)
#: TTFT percentiles (0..100) of the series' TTFT columns, ``ttft_p<q>_s``.
PERCENTILES = (50, 90, 99)
#: TTFT columns: percentiles over the TTFTs of the row's span.
TTFT_COLUMNS = tuple(f"ttft_p{q}_s" for q in PERCENTILES)

Value = float | int | None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ascending ``sorted_values``, linearly
    interpolated between order statistics; ``nan`` when empty."""
    if not sorted_values:
        return math.nan
    rank = (len(sorted_values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


class Series:
    """The bounded series: rows of :attr:`samples_per_row` samples each, at most
    :attr:`max_rows` of them.

    Raises:
        ValueError: ``max_rows`` is not an even number of at least 2.
    """

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        if isinstance(max_rows, bool) or max_rows < 2 or max_rows % 2:
            raise ValueError(f"max_rows must be an even number >= 2, got {max_rows!r}")
        self.max_rows = max_rows
        #: Samples each row holds (the last row may hold fewer): a power of two.
        self.samples_per_row = 1
        self._last: dict[str, list[Value]] = {column: [] for column in LAST_COLUMNS}
        self._sums: dict[str, list[int]] = {column: [] for column in MEAN_COLUMNS}
        self._counts: list[int] = []
        #: Per row, the index into the run's TTFTs where its span ends.
        self._ttft_end: list[int] = []

    def __len__(self) -> int:
        """Rows kept."""
        return len(self._counts)

    def add(self, sample: Mapping[str, Value], ttft_end: int) -> None:
        """Fold one sample into the series: into the last row while it holds fewer than
        :attr:`samples_per_row`, else as a new row (merging adjacent rows first when the
        series is full). ``sample`` maps every column of :data:`LAST_COLUMNS` and
        :data:`MEAN_COLUMNS` to its value (gauges are integers); ``ttft_end`` is how many
        TTFTs the run had recorded at this sample."""
        if self._counts and self._counts[-1] < self.samples_per_row:
            for column, values in self._last.items():
                values[-1] = sample[column]
            for column, sums in self._sums.items():
                sums[-1] += int(sample[column] or 0)
            self._counts[-1] += 1
            self._ttft_end[-1] = ttft_end
            return
        if len(self._counts) == self.max_rows:
            self._halve()
        for column, values in self._last.items():
            values.append(sample[column])
        for column, sums in self._sums.items():
            sums.append(int(sample[column] or 0))
        self._counts.append(1)
        self._ttft_end.append(ttft_end)

    def _halve(self) -> None:
        """Merge rows ``2i`` and ``2i + 1`` (every row is full here) and double
        :attr:`samples_per_row`."""
        for values in self._last.values():
            values[:] = values[1::2]
        for sums in self._sums.values():
            sums[:] = [a + b for a, b in zip(sums[::2], sums[1::2], strict=True)]
        self._counts = [a + b for a, b in zip(self._counts[::2], self._counts[1::2], strict=True)]
        self._ttft_end = self._ttft_end[1::2]
        self.samples_per_row *= 2

    def columns(self, ttft: Sequence[float], order: Sequence[str]) -> dict[str, list[Value]]:
        """The series as column → values (one per row), columns in ``order``. ``ttft``:
        the run's TTFTs in the order they were recorded (seconds); a TTFT column is
        ``None`` for a row whose span had no first token."""
        found: dict[str, list[Value]] = {column: list(v) for column, v in self._last.items()}
        merged = self.samples_per_row > 1
        for column, sums in self._sums.items():
            if merged:
                found[column] = [s / n for s, n in zip(sums, self._counts, strict=True)]
            else:
                found[column] = list(sums)
        spans: dict[str, list[Value]] = {column: [] for column in TTFT_COLUMNS}
        start = 0
        for end in self._ttft_end:
            window = sorted(ttft[start:end])
            start = end
            for q, column in zip(PERCENTILES, TTFT_COLUMNS, strict=True):
                value = percentile(window, q)
                spans[column].append(None if math.isnan(value) else value)
        found.update(spans)
        return {column: found[column] for column in order}

    def describe(self) -> dict[str, int]:
        """JSON-ready: rows kept, samples per row, the cap."""
        return {
            "rows": len(self),
            "samples_per_row": self.samples_per_row,
            "max_rows": self.max_rows,
        }
