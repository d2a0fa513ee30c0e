"""Metrics of a run: counters the scheduler bumps, a sampled time series, and totals.

Definitions (tokens are prompt tokens unless said otherwise):

- **prompt tokens**: sum of every admitted request's prompt length, counted once per
  request (at its first admission).
- **hit tokens**: the checkpoint hit ``p`` of each request's first admission (0 = miss).
- **token hit rate** = hit tokens / prompt tokens; **request hit rate** = requests whose
  first admission hit / requests admitted.
- **recomputed tokens**: prompt tokens actually prefilled, every chunk counted, so the
  work redone after a preemption is included (= prompt tokens - hit tokens when nothing
  is preempted).
- **decode tokens**: output tokens decoded, every step counted, so the output a
  preemption threw away and the request decoded again is included; **discarded decode
  tokens**: that thrown-away output. Output delivered = decode tokens - discarded
  decode tokens (each request's output once).
- **FLOPs saved**: ``prefill_flops(p)`` of each request's first *issued* restore: the
  forward FLOPs its prefix hit did not recompute. Counted when the copy is issued, so a
  restore dropped by a preemption is not counted. **Resume FLOPs saved**: the same for
  every later restore of a request (after a preemption), kept apart because it measures
  recovery from memory pressure, not prefix sharing.
- **checkpoint bytes in use**: bytes of the slots that are reserved or published:
  the recurrent axis, plus ``(p mod B)`` partial-KV rows for a checkpoint at ``p``.
- **KV blocks in use**: blocks held by a running request; **cached**: blocks
  registered for prefix sharing (held or free).
- **evictions**: ``checkpoint:<reason>`` from the index's ``evictions`` counter
  (``capacity``, ``invalidate``, ``clear``) and ``kv:lru`` for registered KV blocks
  reused for new data.
- **TTFT**: simulated time from a request's arrival to the end of the step that computes
  its last prompt token (its first output token), seconds; percentiles use linear
  interpolation between order statistics.

The time series has one sample per ``sample_interval_s`` of simulated time (taken at the
first step end at or after each interval boundary) plus one at the end; its TTFT columns
are over the requests whose first token came since the previous row. It keeps at most
:data:`~sim.engine.series.MAX_ROWS` rows: a longer run merges adjacent rows
(:mod:`sim.engine.series` says how each column merges), so neither the result nor the
process grows with the run's length. The run's TTFTs are kept whole (8 bytes per
request with a first token, an ``array('d')``) so that every percentile is exact; they
never reach the JSON.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field

from sim.engine.series import MAX_ROWS, PERCENTILES, Series, percentile

#: Columns of the time series, in order.
SERIES_COLUMNS = (
    "t_s",
    "step",
    "running",
    "waiting",
    "finished",
    "kv_blocks_in_use",
    "kv_blocks_cached",
    "checkpoint_slots_in_use",
    "checkpoint_bytes_in_use",
    "prompt_tokens",
    "hit_tokens",
    "recomputed_tokens",
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "evictions_checkpoint",
    "evictions_kv",
    "preemptions",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
)


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else value


def shown_rate(value: object) -> str:
    """A hit rate as the command line prints it: ``0.412``, or ``n/a`` for ``None``."""
    return f"{value:.3f}" if isinstance(value, int | float) else "n/a"


@dataclass
class Gauges:
    """Instantaneous state sampled into the time series."""

    running: int
    waiting: int
    kv_blocks_in_use: int
    kv_blocks_cached: int
    checkpoint_slots_in_use: int
    checkpoint_bytes_in_use: int
    evictions_checkpoint: int
    evictions_kv: int


@dataclass
class Metrics:
    """Counters (the scheduler increments them directly), series and totals."""

    sample_interval_s: float = 1.0
    requests_arrived: int = 0
    requests_admitted: int = 0
    requests_finished: int = 0
    requests_rejected: int = 0
    requests_length_capped: int = 0
    requests_over_context: int = 0
    requests_with_hit: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    resume_hit_tokens: int = 0
    recomputed_tokens: int = 0
    decode_tokens: int = 0
    discarded_decode_tokens: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    flops_saved: int = 0
    resume_flops_saved: int = 0
    prefill_flops: int = 0
    decode_flops: int = 0
    preemptions: int = 0
    steps: int = 0
    captures_planned: int = 0
    captures_reserved: int = 0
    captures_already_cached: int = 0
    captures_no_slot: int = 0
    captures_skipped_full: int = 0
    captures_generated: int = 0
    generated_blocks_registered: int = 0
    captures_failed: int = 0
    captures_aborted: int = 0
    captures_published: int = 0
    captures_cancelled: int = 0
    restores: int = 0
    restore_bytes: int = 0
    capture_bytes: int = 0
    compute_busy_s: float = 0.0
    copy_busy_s: float = 0.0
    peak_kv_blocks_in_use: int = 0
    peak_checkpoint_bytes_in_use: int = 0
    # Warm-up (docs/REPORTS.md): requests admitted from ``warm_from_request`` on count
    # in these too; ``None`` while the cache has not yet filled.
    warm_from_request: int | None = None
    warm_requests: int = 0
    warm_requests_with_hit: int = 0
    warm_prompt_tokens: int = 0
    warm_hit_tokens: int = 0
    # Saturation (docs/REPORTS.md): samples taken, those with requests waiting for
    # admission, the longest queue, and the queue when the last request arrived.
    first_arrival_s: float | None = None
    last_arrival_s: float | None = None
    samples: int = 0
    samples_queued: int = 0
    peak_waiting: int = 0
    waiting_at_last_arrival: int = 0
    #: Every TTFT, seconds, in the order the first tokens came (exact percentiles).
    ttft_s: array[float] = field(default_factory=lambda: array("d"))
    #: The most rows the series keeps (:mod:`sim.engine.series`).
    max_series_rows: int = MAX_ROWS
    _series: Series = field(init=False, repr=False)
    _next_sample_s: float = 0.0

    def __post_init__(self) -> None:
        self._series = Series(self.max_series_rows)

    @property
    def series(self) -> dict[str, list[float | int | None]]:
        """The sampled time series, column (:data:`SERIES_COLUMNS`) → one value per row:
        at most :attr:`max_series_rows` rows, adjacent samples merged beyond
        (:mod:`sim.engine.series`). A new dict each call."""
        return self._series.columns(self.ttft_s, SERIES_COLUMNS)

    def series_summary(self) -> dict[str, int]:
        """JSON-ready: samples taken, rows kept, samples per row, the cap on rows."""
        return {"samples": self.samples, **self._series.describe()}

    def token_hit_rate(self) -> float | None:
        """Hit tokens over admitted prompt tokens; ``None`` before any prompt was admitted
        (a run that admitted nothing has no hit rate, not a zero one)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def request_hit_rate(self) -> float | None:
        """Admitted requests with a hit over admitted requests; ``None`` before any."""
        return self.requests_with_hit / self.requests_admitted if self.requests_admitted else None

    def after_warmup(self) -> dict[str, object]:
        """JSON-ready hit rates of the requests admitted after warm-up (``from_request``:
        the arrival index of the first; ``None`` when the cache never filled: the run
        has no steady state)."""
        return {
            "from_request": self.warm_from_request,
            "requests": self.warm_requests,
            "prompt_tokens": self.warm_prompt_tokens,
            "hit_tokens": self.warm_hit_tokens,
            "token_hit_rate": self.warm_hit_tokens / self.warm_prompt_tokens
            if self.warm_prompt_tokens
            else None,
            "request_hit_rate": self.warm_requests_with_hit / self.warm_requests
            if self.warm_requests
            else None,
        }

    @property
    def next_sample_s(self) -> float:
        """Simulated time from which the next sample is due, seconds."""
        return self._next_sample_s

    def due(self, now_s: float) -> bool:
        """Whether a sample is due at ``now_s``."""
        return now_s >= self._next_sample_s

    def sample(self, now_s: float, step: int, gauges: Gauges) -> None:
        """Take one sample into the series (a row of its own, or merged into the last
        row once the series has been capped) and schedule the next sample."""
        self.peak_kv_blocks_in_use = max(self.peak_kv_blocks_in_use, gauges.kv_blocks_in_use)
        self.peak_checkpoint_bytes_in_use = max(
            self.peak_checkpoint_bytes_in_use, gauges.checkpoint_bytes_in_use
        )
        self.samples += 1
        if gauges.waiting:
            self.samples_queued += 1
        row: dict[str, float | int | None] = {
            "t_s": now_s,
            "step": step,
            "running": gauges.running,
            "waiting": gauges.waiting,
            "finished": self.requests_finished,
            "kv_blocks_in_use": gauges.kv_blocks_in_use,
            "kv_blocks_cached": gauges.kv_blocks_cached,
            "checkpoint_slots_in_use": gauges.checkpoint_slots_in_use,
            "checkpoint_bytes_in_use": gauges.checkpoint_bytes_in_use,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "token_hit_rate": self.token_hit_rate(),
            "request_hit_rate": self.request_hit_rate(),
            "flops_saved": self.flops_saved,
            "evictions_checkpoint": gauges.evictions_checkpoint,
            "evictions_kv": gauges.evictions_kv,
            "preemptions": self.preemptions,
        }
        self._series.add(row, len(self.ttft_s))
        interval = self.sample_interval_s
        self._next_sample_s = (math.floor(now_s / interval) + 1) * interval

    def observe_peaks(self, kv_blocks_in_use: int, checkpoint_bytes_in_use: int) -> None:
        """Track peaks between samples."""
        if kv_blocks_in_use > self.peak_kv_blocks_in_use:
            self.peak_kv_blocks_in_use = kv_blocks_in_use
        if checkpoint_bytes_in_use > self.peak_checkpoint_bytes_in_use:
            self.peak_checkpoint_bytes_in_use = checkpoint_bytes_in_use

    def ttft_summary(self) -> dict[str, float | None]:
        """Mean, max and percentiles of every TTFT, seconds (``None`` when no request)."""
        values = sorted(self.ttft_s)
        summary: dict[str, float | None] = {
            f"p{q}_s": _json_float(percentile(values, q)) for q in PERCENTILES
        }
        summary["mean_s"] = sum(values) / len(values) if values else None
        summary["max_s"] = values[-1] if values else None
        summary["count"] = len(values)
        return summary

    def totals(
        self, evictions: Counter[str], final: Gauges, sim_time_s: float
    ) -> dict[str, object]:
        """JSON-ready totals of the run."""
        return {
            "sim_time_s": sim_time_s,
            "steps": self.steps,
            "requests": {
                "arrived": self.requests_arrived,
                "admitted": self.requests_admitted,
                "finished": self.requests_finished,
                "rejected": self.requests_rejected,
                "with_hit": self.requests_with_hit,
            },
            "token_hit_rate": self.token_hit_rate(),
            "request_hit_rate": self.request_hit_rate(),
            "after_warmup": self.after_warmup(),
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "resume_hit_tokens": self.resume_hit_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "decode_tokens": self.decode_tokens,
            "discarded_decode_tokens": self.discarded_decode_tokens,
            "speculative": {"proposed": self.spec_proposed, "accepted": self.spec_accepted},
            "flops_saved": self.flops_saved,
            "resume_flops_saved": self.resume_flops_saved,
            "prefill_flops": self.prefill_flops,
            "decode_flops": self.decode_flops,
            "preemptions": self.preemptions,
            "captures": {
                "planned": self.captures_planned,
                "reserved": self.captures_reserved,
                "already_cached": self.captures_already_cached,
                "no_slot": self.captures_no_slot,
                "skipped_full": self.captures_skipped_full,
                "generated": self.captures_generated,
                "failed": self.captures_failed,
                "aborted": self.captures_aborted,
                "published": self.captures_published,
                "cancelled": self.captures_cancelled,
                "bytes": self.capture_bytes,
            },
            "restores": {"count": self.restores, "bytes": self.restore_bytes},
            "evictions": dict(sorted(evictions.items())),
            "kv_blocks_in_use": {
                "final": final.kv_blocks_in_use,
                "peak": self.peak_kv_blocks_in_use,
            },
            "kv_blocks_cached_final": final.kv_blocks_cached,
            "generated_blocks_registered": self.generated_blocks_registered,
            "checkpoint_bytes_in_use": {
                "final": final.checkpoint_bytes_in_use,
                "peak": self.peak_checkpoint_bytes_in_use,
            },
            "checkpoint_slots_in_use_final": final.checkpoint_slots_in_use,
            "ttft": self.ttft_summary(),
            "arrivals": {"first_s": self.first_arrival_s, "last_s": self.last_arrival_s},
            "queue": {
                "queued_share": self.samples_queued / self.samples if self.samples else None,
                "peak_waiting": self.peak_waiting,
                "waiting_at_last_arrival": self.waiting_at_last_arrival,
            },
            "compute_busy_s": self.compute_busy_s,
            "copy_busy_s": self.copy_busy_s,
            "series": self.series_summary(),
        }
