"""The scenario-file schema: every table, key, type, default and allowed range.

A scenario file is TOML (read with :mod:`tomllib`). Each table of :data:`SCHEMA` lists
its keys as :class:`Key` objects; tables named in :data:`FREE_TABLES` (``placement.params``,
``eviction.params``, ``workload.params``) hold parameters passed on to the policy or
generator, checked by it. ``[sweep]`` maps dotted key paths to lists of values, and
``[expect]`` keys are :data:`EXPECTATIONS`. ``docs/SCENARIOS.md`` documents the same schema.

Units are in the key names: ``*_bytes`` bytes, ``*_s`` seconds; counts are tokens unless
the name says otherwise.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reference.conformance.habits import HABIT_NAMES
from reference.errors import InvalidConfigError
from reference.eviction import POLICIES as EVICTION_POLICIES
from reference.placement import POLICIES as PLACEMENT_POLICIES
from reference.sizes import MODELS
from sim.engine.config import (
    BACKEND_NAMES,
    CLIENT_MAX_TOKENS,
    DECODE_RESERVATIONS,
    LENGTH_LIMIT_RULES,
    MAX_BLOCK_SIZE,
    MAX_BUDGET_BYTES,
    MAX_CHECKPOINT_SLOTS,
    MAX_KV_BLOCKS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MAX_RUNNING_STATES,
    MAX_SECONDS,
    MAX_SEED,
    MAX_SPEC_TOKENS,
    MAX_TOKEN_BUDGET,
    MEMORY_MODES,
    MODES,
    PREEMPTION_MODES,
    PREEMPTION_POLICIES,
    SHARE_RULES,
)
from sim.engine.costs import GPU_PRESETS
from sim.engine.deployment import MAX_PARALLEL
from sim.engine.presets import PRESET_NAMES
from sim.engine.sessions import SESSION_MODES
from sim.engine.sources import MAX_REQUESTS, TRACE_FORMATS, WORKLOAD_NAMES

#: Largest integer any key takes unless it has a tighter bound (counts in ``[expect]``).
MAX_INTEGER = 2**63 - 1


#: Characters of a value an error message shows at most (a 400-digit number is cut).
MAX_SHOWN = 200


class ScenarioError(InvalidConfigError):
    """A scenario file (or an override) is invalid.

    Attributes:
        file: the scenario file (for an override, the file of the scenario overridden).
        key: dotted key path, e.g. ``cache.block_size``.
        value: the value found.
        expected: what was expected instead.
    """

    def __init__(self, file: str, key: str, value: object, expected: str) -> None:
        self.file, self.key, self.value, self.expected = file, key, value, expected
        found = "nothing" if value is MISSING else repr(value)
        if len(found) > MAX_SHOWN:
            found = f"{found[: MAX_SHOWN // 2]}... ({len(found)} characters)"
        self.detail = f"{key}: found {found}, expected {expected}"
        super().__init__(f"{file}: {self.detail}")

    def __reduce__(self) -> tuple[type[ScenarioError], tuple[str, str, object, str]]:
        # Picklable with its four fields (process-pool sweeps send errors back).
        return (type(self), (self.file, self.key, self.value, self.expected))


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


#: Marks a key that is absent from the file (a required key's default, a value not found).
MISSING: Any = _Missing()


def suggestion(name: str, known: list[str]) -> str:
    """``"; did you mean 'x'?"`` for a near-miss of ``name`` among ``known``, else ``""``.

    Case is ignored first (``"LRU"`` -> ``'lru'``), then close spellings are looked for.
    """
    folded = [entry for entry in known if entry.casefold() == name.casefold()]
    close = folded or difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


Check = Callable[[object], str | None]
"""A value check: ``None`` when the value is fine, else what was expected."""


def integer(minimum: int = 0, maximum: int = MAX_INTEGER) -> Check:
    """An int (not a bool) in ``[minimum, maximum]``."""

    def check(value: object) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= maximum
        return None if ok else f"an integer >= {minimum} and <= {maximum}"

    return check


def model_length(value: object) -> str | None:
    """``engine.max_model_len``: tokens, or ``"model"`` (the model's context length)."""
    if value == "model":
        return None
    ok = isinstance(value, int) and not isinstance(value, bool) and 2 <= value <= MAX_MODEL_LEN
    return None if ok else f'"model" or an integer >= 2 and <= {MAX_MODEL_LEN} (tokens)'


def client_max_tokens(value: object) -> str | None:
    """``workload.max_tokens``: ``"answer"``, ``"unset"`` or a number of tokens."""
    if value in CLIENT_MAX_TOKENS:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_MODEL_LEN
    return None if ok else f'"answer", "unset" or an integer >= 1 and <= {MAX_MODEL_LEN} (tokens)'


def _as_float(value: object) -> float:
    """``value`` as a float; NaN for a bool, a non-number or an int too large for a float."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


def number(low: float = 0.0, high: float = math.inf, *, strict: bool = False) -> Check:
    """A finite int or float in ``[low, high]`` (``(low, high]`` when ``strict``)."""

    def check(value: object) -> str | None:
        as_float = _as_float(value)
        ok = (
            math.isfinite(as_float)
            and (as_float > low if strict else as_float >= low)
            and as_float <= high
        )
        if ok:
            return None
        left = "(" if strict else "["
        return (
            f"a number in {left}{low}, {high}]"
            if high != math.inf
            else (f"a number {'>' if strict else '>='} {low}")
        )

    return check


def boolean(value: object) -> str | None:
    """``true`` or ``false``."""
    return None if isinstance(value, bool) else "true or false"


def text(value: object) -> str | None:
    """A non-empty string."""
    return None if isinstance(value, str) and value else "a non-empty string"


def any_text(value: object) -> str | None:
    """A string, empty included."""
    return None if isinstance(value, str) else "a string"


def choice(options: list[str] | tuple[str, ...]) -> Check:
    """One of ``options`` (with a did-you-mean for near-misses)."""

    def check(value: object) -> str | None:
        if isinstance(value, str) and value in options:
            return None
        hint = suggestion(value, list(options)) if isinstance(value, str) else ""
        return f"one of {', '.join(options)}{hint}"

    return check


def seed_list(value: object) -> str | None:
    """A non-empty list of seeds (integers in ``[0, MAX_SEED]``)."""
    ok = (
        isinstance(value, list)
        and bool(value)
        and all(integer(0, MAX_SEED)(v) is None for v in value)
    )
    return None if ok else f"a non-empty list of integers >= 0 and <= {MAX_SEED}"


def habit_list(value: object) -> str | None:
    """A list of distinct buffer-habit names (:data:`reference.conformance.habits.HABIT_NAMES`)."""
    expected = f"a list of distinct names among {', '.join(HABIT_NAMES)}"
    if not isinstance(value, list):
        return expected
    for item in value:
        if not isinstance(item, str) or item not in HABIT_NAMES:
            hint = suggestion(item, list(HABIT_NAMES)) if isinstance(item, str) else ""
            return f"{expected}{hint}"
    return None if len(set(value)) == len(value) else f"{expected} (each at most once)"


#: Most components a mixed workload (``[[workload.mix]]``) may have.
MAX_MIX_COMPONENTS = 32


def mix_tables(value: object) -> str | None:
    """A non-empty array of at most :data:`MAX_MIX_COMPONENTS` tables (``[[workload.mix]]``;
    :mod:`sim.scenarios.workload_mix` checks each table's keys)."""
    ok = (
        isinstance(value, list)
        and 1 <= len(value) <= MAX_MIX_COMPONENTS
        and all(isinstance(item, dict) for item in value)
    )
    return (
        None
        if ok
        else f"a non-empty array of at most {MAX_MIX_COMPONENTS} tables ([[workload.mix]], "
        "each with generator and optional name and params)"
    )


#: ``scenario.name``: it names result files and ``reports/<name>/``, so it stays a plain
#: file name (no path separators, no leading dot).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
#: Characters in ``scenario.name`` at most.
MAX_NAME_LENGTH = 100


def scenario_name(value: object) -> str | None:
    """A file name: letters, digits, ``-``, ``_`` and ``.``, not starting with ``.``."""
    ok = (
        isinstance(value, str)
        and len(value) <= MAX_NAME_LENGTH
        and NAME_PATTERN.fullmatch(value) is not None
    )
    return (
        None
        if ok
        else f"a name of at most {MAX_NAME_LENGTH} letters, digits, '-', '_' and '.', "
        "not starting with '.' (it names result files and reports/<name>/)"
    )


@dataclass(frozen=True)
class Key:
    """One key of a table.

    Attributes:
        check: validates a present value.
        default: the value when absent (``MISSING`` = required; ``None`` = unset).
        doc: one line for docs and error messages.
    """

    check: Check
    default: object
    doc: str


_SIM_ENGINE: dict[str, Key] = {
    "mode": Key(
        choice(list(MODES)),
        "engine",
        "engine: the timed SimPy engine; replay: cache-only replay in arrival order",
    ),
    "max_num_seqs": Key(integer(1, MAX_NUM_SEQS), 256, "running sequences at most (batch slots)"),
    "warmup_requests": Key(
        integer(0, 2**40),
        None,
        "hit rates after warm-up count the requests admitted after this many (unset: after "
        "the cache first evicted to make room)",
    ),
    "spec_tokens": Key(
        integer(0, MAX_SPEC_TOKENS), 0, "speculative (MTP) tokens proposed per decode step"
    ),
    "spec_acceptance": Key(number(0.0, 1.0), 0.7, "probability each proposed token is accepted"),
    "sample_interval_s": Key(
        number(0.0, MAX_SECONDS, strict=True), 1.0, "seconds between series samples"
    ),
    "fuse_decode_steps": Key(boolean, True, "fuse decode-only steps (same results, faster)"),
    "async_scheduling": Key(
        boolean,
        False,
        "plan a step before taking in the previous step's output (vLLM's default): a "
        "finished request's memory comes back after the next step is planned",
    ),
    "mixed_batches": Key(
        boolean,
        True,
        "a step runs decodes and prefill chunks together (vLLM); false: prefill chunks and "
        "admissions when there are any, decodes only in a step without (SGLang)",
    ),
    "refresh_waiting_prefixes": Key(
        boolean,
        False,
        "every 32nd planning pass, the first 128 waiting requests' cached prefixes (their "
        "hit's checkpoint and the KV before it) become most recently used (SGLang's "
        "_touch_waiting_prefixes)",
    ),
    "pause_after_refusal": Key(
        boolean,
        False,
        "after the admission reservation refuses a request while others run, admit no one "
        "until a running request leaves (SGLang's batch_is_full)",
    ),
    "lookup_refreshes_prefix": Key(
        boolean,
        False,
        "an admission's lookup makes the KV before its hit most recently used even when "
        "the request is not admitted (SGLang's match_prefix before PrefillAdder decides)",
    ),
    "allocate_after_lookups": Key(
        boolean,
        False,
        "a prefill step allocates its KV blocks once every admission of the step has "
        "taken its hit, so the step never evicts a prefix it hits (SGLang's "
        'prepare_for_extend after PrefillAdder); needs cache.memory = "split"',
    ),
    "decode_reservation": Key(
        choice(list(DECODE_RESERVATIONS)),
        "none",
        "what admission keeps free for running requests' future output: none, or sglang "
        "(SGLang's PrefillAdder: their remaining output times the new-token ratio, and the "
        "new request's prompt and output must fit beside it)",
    ),
    "admit_after_preemption": Key(
        boolean,
        True,
        "a step that preempted a request still admits waiting ones (vLLM: false, it "
        "schedules the waiting queue only in a step that preempted none)",
    ),
    "max_model_len": Key(
        model_length,
        None,
        'longest sequence served, tokens (prompt + output), or "model": the model\'s '
        "max_position_embeddings, vLLM's and SGLang's default; longer prompts are refused, "
        'output stops there (unset: no limit; the vllm and sglang presets set "model")',
    ),
    "length_limits": Key(
        choice(list(LENGTH_LIMIT_RULES)),
        "vllm",
        "whose rule max_model_len follows: vllm (prompts < max_model_len, output up to it) "
        "or sglang (prompts < max_model_len - 6, output up to max_model_len - 2)",
    ),
    "preemption": Key(
        choice(list(PREEMPTION_MODES)),
        "restart",
        "what a preempted request keeps: restart (nothing: it generates its output anew) "
        "or resume (its output: it prefills its prompt and output, then decodes on)",
    ),
    "preemption_policy": Key(
        choice(list(PREEMPTION_POLICIES)),
        "youngest",
        "which running request a step short of pages preempts: youngest (vLLM: any "
        "phase, requeued first) or sglang (SGLang's retract_decode: decoding requests only, "
        "fewest output tokens first, longest prompt on ties, requeued last; prefill chunks "
        "wait)",
    ),
    "mfu": Key(number(0.0, 1.0, strict=True), 0.5, "achieved fraction of peak FLOP/s"),
    "mbu": Key(number(0.0, 1.0, strict=True), 0.8, "achieved fraction of HBM bandwidth"),
    "copy_efficiency": Key(number(0.0, 1.0, strict=True), 0.8, "copy fraction of HBM bandwidth"),
    "step_overhead_s": Key(number(0.0, MAX_SECONDS), 0.0005, "fixed seconds per step"),
    "copy_launch_s": Key(number(0.0, MAX_SECONDS), 0.000005, "fixed seconds per copy"),
}

#: Keys that only the timed engine reads: set with ``engine.mode = "replay"`` they are
#: an error, not silently ignored.
TIMING_ONLY_KEYS = (
    "engine.sample_interval_s",
    "engine.fuse_decode_steps",
    "engine.async_scheduling",
    "engine.preemption",
    "engine.preemption_policy",
    "engine.mixed_batches",
    "engine.refresh_waiting_prefixes",
    "engine.pause_after_refusal",
    "engine.allocate_after_lookups",
    "engine.lookup_refreshes_prefix",
    "engine.decode_reservation",
    "engine.admit_after_preemption",
    "engine.mfu",
    "engine.mbu",
    "engine.copy_efficiency",
    "engine.step_overhead_s",
    "engine.copy_launch_s",
    "workload.sessions",
    "faults.preempt_mid_prefill_rate",
    "faults.copy_delay_s",
    "faults.publish_on_issue",
    "faults.skip_abort_on_preempt",
    "expect.max_ttft_p99_s",
)

#: Every table and its keys. ``None`` defaults mean "unset" (the engine sizes it).
SCHEMA: dict[str, dict[str, Key]] = {
    "scenario": {
        "name": Key(scenario_name, MISSING, "scenario name: result file names and reports/<name>/"),
        "description": Key(any_text, "", "one or two sentences on what the scenario models"),
        "seed": Key(integer(0, MAX_SEED), None, "the seed of the workload and the engine"),
        "seeds": Key(seed_list, None, "seeds to run (sweeps, reports); the first is `seed`"),
    },
    "model": {
        "name": Key(
            text,
            "nemotron-h-8b",
            f"a shipped model ({', '.join(MODELS)}), or the name of the model the "
            "description keys describe (docs/SCENARIOS.md, [model])",
        ),
        "gpu": Key(choice(list(GPU_PRESETS)), "h200", "GPU preset (sim/engine/costs.py)"),
        "base": Key(choice(list(MODELS)), None, "a shipped model the description starts from"),
        "file": Key(text, None, "a model file (TOML, one [model] table) describing the model"),
    },
    "deployment": {
        "tensor_parallel": Key(
            integer(1, MAX_PARALLEL), 1, "GPUs each layer is split over by heads"
        ),
        "pipeline_parallel": Key(
            integer(1, MAX_PARALLEL), 1, "stages the layers are split into, one GPU each"
        ),
        "allreduce_latency_s": Key(
            number(0.0, 1.0), 10e-6, "fixed seconds of one all-reduce or stage transfer"
        ),
        "link_efficiency": Key(
            number(0.0, 1.0, strict=True), 0.8, "achieved fraction of NVLink bandwidth"
        ),
    },
    "cache": {
        "block_size": Key(integer(1, MAX_BLOCK_SIZE), 16, "tokens per KV page B"),
        "hash_unit": Key(
            integer(1, MAX_BLOCK_SIZE), None, "prefix-hash unit h in tokens (divides B; unset = B)"
        ),
        "token_budget": Key(integer(1, MAX_TOKEN_BUDGET), 8192, "tokens scheduled per engine step"),
        "decodes_share_budget": Key(
            boolean,
            True,
            "a step's decode tokens come out of token_budget before its prefill chunks "
            "(vLLM); false: prefill chunks get the whole token_budget (SGLang's separate "
            "prefill batches)",
        ),
        "kv_blocks": Key(
            integer(1, MAX_KV_BLOCKS), None, "KV pages (unset: kv_budget_bytes or GPU memory)"
        ),
        "kv_budget_bytes": Key(
            integer(1, MAX_BUDGET_BYTES), None, "KV-axis byte budget (pages = bytes / page)"
        ),
        "checkpoint_slots": Key(
            integer(1, MAX_CHECKPOINT_SLOTS), None, "snapshot slots (unset: the byte budget)"
        ),
        "checkpoint_budget_bytes": Key(
            integer(1, MAX_BUDGET_BYTES),
            16 * 2**30,
            "checkpoint-pool bytes (recurrent + partial-KV axes)",
        ),
        "engine": Key(
            choice(list(PRESET_NAMES)),
            "none",
            "engine preset: placement, eviction, generated-token caching and memory as that "
            "engine does (keys the file sets win)",
        ),
        "memory": Key(
            choice(list(MEMORY_MODES)),
            "split",
            "split: a KV pool and a checkpoint pool; unified: one budget for both",
        ),
        "cache_budget_bytes": Key(
            integer(1, MAX_BUDGET_BYTES),
            None,
            "memory = unified: the budget (unset: what the GPU leaves after weights)",
        ),
        "reserved_pages": Key(
            integer(0, MAX_KV_BLOCKS),
            0,
            "memory = unified: pages of the budget the engine never caches in (vLLM's null "
            "block: 1)",
        ),
        "cache_generated": Key(
            boolean,
            False,
            "a finished request caches its answer's full KV blocks and its final state",
        ),
        "generated_state": Key(
            boolean,
            True,
            "with cache_generated: also capture the state at the end of the answer "
            "(false: its KV blocks only, as vLLM)",
        ),
        "generated_state_grid": Key(
            integer(0, MAX_TOKEN_BUDGET),
            0,
            "tokens; 0: the answer's state at its end; T: at the last multiple of T past "
            "the prompt, if any (SGLang extra_buffer)",
        ),
        "kv_up_to_checkpoint": Key(
            boolean,
            False,
            "a request's KV blocks are cached only up to its furthest checkpoint (SGLang "
            "extra_buffer); false: every full block computed",
        ),
        "capture_all": Key(
            boolean,
            False,
            "every position placement yields for a chunk is reserved, evicting if needed "
            "(vLLM keeps every reachable boundary); false: a chunk's later positions go "
            "into free memory only (SEMANTICS H5)",
        ),
        "keep_block_copies": Key(
            boolean,
            False,
            "a KV block computed again under a cached digest is cached as another copy "
            "(vLLM); false: it stays private",
        ),
        "adopt_cached_blocks": Key(
            boolean,
            False,
            "a KV block computed again under a cached digest is swapped for the cached "
            "copy when the request registers its blocks, its own freed (SGLang's insert); "
            "not with keep_block_copies",
        ),
        "captures_in_step": Key(
            boolean,
            False,
            "a step's checkpoint copies run within the step: each checkpoint is published "
            "when the step that wrote it ends, before the next is planned (SGLang); false: "
            "on a copy stream of their own, published when it finishes them",
        ),
        "hold_latest_checkpoint": Key(
            boolean,
            False,
            "a running request holds its latest checkpoint out of eviction's reach (its hit, "
            "then each checkpoint its chunks publish) until it finishes or is preempted "
            "(SGLang's req.lock on the tree node it has reached)",
        ),
        "drop_leaf_kv": Key(
            boolean,
            False,
            "split memory: an evicted checkpoint that no cached KV continues takes its free "
            "cached KV blocks with it, back to the nearest block still needed (SGLang's "
            "radix tree deletes a leaf with its state)",
        ),
        "running_states": Key(
            integer(0, MAX_RUNNING_STATES),
            0,
            "recurrent states each running request holds in the checkpoint budget while it "
            "runs (SGLang: 1, 3 with extra_buffer; vLLM: 1), evicting cached checkpoints "
            "to make room at admission; 0: live states are outside the cache",
        ),
        "state_handover": Key(
            boolean,
            False,
            "memory = unified, running_states >= 1: a decode step that takes a running "
            "request's state into a new block holds one more state for that step (vLLM)",
        ),
        "block_aligned_chunks": Key(
            boolean,
            False,
            "a prefill chunk that does not finish the prompt ends on a block boundary, and "
            "stops at the junction inside it (vLLM's align mode)",
        ),
        "release_recency": Key(
            boolean,
            False,
            "a request's checkpoints count as used when it lets go of them: a chunk's "
            "captures highest first, then the checkpoint it started from (vLLM)",
        ),
        "interleaved_free": Key(
            boolean,
            False,
            "memory = unified, release_recency: the checkpoints a chunk lets go of wait in "
            "the free queue one page of each first, so evicting them takes one page each "
            "(vLLM frees a step's states layer group by layer group)",
        ),
        "required_captures": Key(
            boolean,
            False,
            "memory = unified: a prefill chunk runs only with the pages of its checkpoints "
            "(an admission waits, a running chunk preempts), as vLLM's align mode allocates them",
        ),
        "states_in_place": Key(
            boolean,
            False,
            "the model reads a hit's state and writes checkpoints in their own memory: no "
            "restore or capture copies, captures publish at the step's end (vLLM's align mode)",
        ),
        "admit_full_prompt": Key(
            boolean,
            False,
            "a request is admitted only when the pages its whole prompt would take as one "
            "chunk are free (vLLM's scheduler_reserve_full_isl)",
        ),
        "checkpoint_share": Key(
            number(0.0, 1.0, strict=True),
            None,
            "memory = split: the share of one budget (cache_budget_bytes) for checkpoints; "
            "the rest is KV",
        ),
        "checkpoint_share_rule": Key(
            choice(list(SHARE_RULES)),
            "share",
            "how checkpoint_share cuts the budget: share (floor(budget * share / slot)), "
            "sglang (SGLang's _handle_max_mamba_cache: states alone, one padding state; "
            "running requests capped at states // 3) or sglang-extra-buffer (the same, "
            "capped at states // 5)",
        ),
        "ssm_state_dtype": Key(
            choice(["model", "bfloat16", "float16", "float32"]),
            "model",
            "the dtype the engine stores the recurrent state in (vLLM "
            "--mamba-ssm-cache-dtype, SGLang --mamba-ssm-dtype); model: the model's own",
        ),
    },
    "engine": _SIM_ENGINE,
    "placement": {
        "policy": Key(choice(list(PLACEMENT_POLICIES)), "block-floor", "placement policy"),
        "workload_hints": Key(
            boolean,
            True,
            "placement is told the workload's branch points and turn starts (false: only "
            "what the cache shows)",
        ),
    },
    "eviction": {
        "policy": Key(choice(list(EVICTION_POLICIES)), "lru", "eviction policy of the index"),
    },
    "workload": {
        "generator": Key(choice(list(WORKLOAD_NAMES)), None, "workload generator"),
        "trace": Key(text, None, "JSONL trace path (relative to the scenario file)"),
        "trace_format": Key(
            choice(list(TRACE_FORMATS)),
            "sessions",
            "trace format: sessions, mooncake or marconi (docs/WORKLOADS.md, Trace replay)",
        ),
        "trace_block_size": Key(
            integer(1, 2**20),
            512,
            "mooncake trace: tokens per hash_ids entry (512 in the published traces)",
        ),
        "sessions": Key(
            choice(list(SESSION_MODES)),
            None,
            "closed: a turn arrives its think time after the previous one finished; open: at "
            "the workload's time (default: closed for a generator, open for a trace)",
        ),
        "requests": Key(integer(1, MAX_REQUESTS), MISSING, "requests to simulate"),
        "max_tokens": Key(
            client_max_tokens,
            "answer",
            "the max_tokens clients send: answer (each request its answer's length, as "
            "benchmark clients), unset (none: the engine's cap) or tokens (longer answers "
            "are cut there); SGLang's admission reserves by it (docs/SEMANTICS.md H9k)",
        ),
        "mix": Key(
            mix_tables,
            None,
            "a mixed workload: [[workload.mix]] components (generator, name, params), "
            "merged by arrival time",
        ),
    },
    "backend": {
        "name": Key(choice(list(BACKEND_NAMES)), "shadow", "data backend"),
        "impl": Key(text, None, "module:factory of the implementation"),
        "check_exactness": Key(boolean, True, "real tensors: compare restores bitwise"),
        "buffer_habits": Key(habit_list, [], "real tensors: buffer habits of real engines to play"),
    },
    "faults": {
        "capture_failure_rate": Key(number(0.0, 1.0), 0.0, "probability a capture fails"),
        "preempt_mid_prefill_rate": Key(number(0.0, 1.0), 0.0, "per-step preemption chance"),
        "copy_delay_s": Key(number(0.0, MAX_SECONDS), 0.0, "extra seconds per copy job"),
        "broken_backend": Key(boolean, False, "declines inside-chunk captures (a violation)"),
        "publish_failed_captures": Key(boolean, False, "engine mistake: publish failures"),
        "skip_abort_on_preempt": Key(boolean, False, "engine mistake: no abort on preempt"),
        "publish_on_issue": Key(boolean, False, "engine mistake: publish before the copy"),
    },
}

#: Tables of free-form parameters, checked by the policy or generator they go to.
FREE_TABLES: dict[str, str] = {
    "placement.params": "keyword arguments of the placement policy",
    "eviction.params": "keyword arguments of the eviction policy",
    "workload.params": "fields of the generator's configuration (docs/WORKLOADS.md)",
}


@dataclass(frozen=True)
class Expectation:
    """One ``[expect]`` key: a bound on a number read from the result.

    Attributes:
        what: the quantity, for messages.
        read: reads it from ``(totals, lockstep)`` of a result.
        upper: the key is an upper bound (``max_*``), else a lower bound.
        integral: the bound is an integer (counts).
    """

    what: str
    read: Callable[[Mapping[str, Any], Mapping[str, Any]], float | None]
    upper: bool
    integral: bool


def _violations(totals: Mapping[str, Any], lockstep: Mapping[str, Any]) -> float:
    counts = lockstep.get("counts", {})
    return float(sum(counts.values())) if isinstance(counts, Mapping) else 0.0


def _evictions(totals: Mapping[str, Any], lockstep: Mapping[str, Any]) -> float:
    return float(sum(totals["evictions"].values()))


def _checkpoint_evictions(totals: Mapping[str, Any], lockstep: Mapping[str, Any]) -> float:
    return float(sum(v for k, v in totals["evictions"].items() if k.startswith("checkpoint")))


def _ttft_p99(totals: Mapping[str, Any], lockstep: Mapping[str, Any]) -> float:
    value = totals["ttft"]["p99_s"]
    return float(value) if isinstance(value, int | float) else math.inf


def _rate(name: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], float | None]:
    """Reads a hit rate: ``None`` (no bound is met) when the run admitted nothing."""

    def read(totals: Mapping[str, Any], lockstep: Mapping[str, Any]) -> float | None:
        value = totals[name]
        return None if value is None else float(value)

    return read


#: Every ``[expect]`` key.
EXPECTATIONS: dict[str, Expectation] = {
    "min_token_hit_rate": Expectation("token hit rate", _rate("token_hit_rate"), False, False),
    "max_token_hit_rate": Expectation("token hit rate", _rate("token_hit_rate"), True, False),
    "min_request_hit_rate": Expectation(
        "request hit rate", _rate("request_hit_rate"), False, False
    ),
    "max_request_hit_rate": Expectation("request hit rate", _rate("request_hit_rate"), True, False),
    "max_lockstep_violations": Expectation("lockstep violations", _violations, True, True),
    "min_lockstep_violations": Expectation("lockstep violations", _violations, False, True),
    "min_restores": Expectation(
        "restores", lambda t, _: float(t["restores"]["count"]), False, True
    ),
    "min_captures_published": Expectation(
        "published captures", lambda t, _: float(t["captures"]["published"]), False, True
    ),
    "min_evictions": Expectation("evictions (all reasons)", _evictions, False, True),
    "min_checkpoint_evictions": Expectation(
        "checkpoint evictions", _checkpoint_evictions, False, True
    ),
    "max_rejected": Expectation(
        "rejected requests", lambda t, _: float(t["requests"]["rejected"]), True, True
    ),
    "max_preemptions": Expectation("preemptions", lambda t, _: float(t["preemptions"]), True, True),
    "min_spec_accepted": Expectation(
        "accepted speculative tokens", lambda t, _: float(t["speculative"]["accepted"]), False, True
    ),
    "max_ttft_p99_s": Expectation("TTFT p99 (s)", _ttft_p99, True, False),
}

#: What a scenario expects when its ``[expect]`` table does not say otherwise.
DEFAULT_EXPECT: dict[str, float] = {"max_lockstep_violations": 0}

#: Top-level tables in file order (also the order of docs/SCENARIOS.md).
TABLES: tuple[str, ...] = (*SCHEMA, "expect", "sweep")


#: ``[expect]`` keys that bound a rate (a fraction in ``[0, 1]``).
RATE_EXPECTATIONS = frozenset(
    {"min_token_hit_rate", "max_token_hit_rate", "min_request_hit_rate", "max_request_hit_rate"}
)


def check_expect_value(name: str, value: object) -> str | None:
    """What an ``[expect]`` value should be, or ``None`` when it is fine."""
    spec = EXPECTATIONS[name]
    if spec.integral:
        return integer(0)(value)
    if name in RATE_EXPECTATIONS:
        return number(0.0, 1.0)(value)
    return number(0.0)(value)
