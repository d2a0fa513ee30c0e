"""Configuration of one simulation run: engine, pools, policies, backend, faults.

Counts are tokens unless the name says otherwise; ``*_bytes`` are bytes, ``*_s`` seconds.
Every value is checked when the object is built; a bad one raises
:class:`~reference.errors.InvalidConfigError` naming the field.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reference.conformance.habits import habits_named
from reference.errors import InvalidConfigError
from reference.eviction import POLICIES as EVICTION_POLICIES
from reference.placement import POLICIES as PLACEMENT_POLICIES
from reference.sizes import ModelSizes, describe_model, get_model
from sim.engine.costs import GIB, CostModel, get_gpu
from sim.engine.deployment import MAX_PARALLEL, Deployment, PlanDoesNotFitError, shard_model

#: How memory is split between cached KV blocks and checkpoint slots.
MEMORY_MODES = ("split", "unified")
#: How ``checkpoint_share`` cuts one budget into two pools (``SimConfig.checkpoint_share_rule``).
SHARE_RULES = ("share", "sglang", "sglang-extra-buffer")
#: Mamba states a running request needs, by SGLang share rule: SGLang 0.5.23 caps its
#: running requests at ``max_mamba_cache_size // ratio`` (``kv_cache_configurator.py``
#: ``resolve_max_num_reqs`` and ``_calculate_mamba_ratio``:
#: ``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`` 3, plus ``get_mamba_tracking_slots`` 2
#: with the overlapped extra buffer).
SGLANG_STATES_PER_RUNNING_REQUEST = {"sglang": 3, "sglang-extra-buffer": 5}
#: Storage dtypes an engine may keep the recurrent (SSM / DeltaNet) state in
#: (``SimConfig.ssm_state_dtype``).
STATE_DTYPES = ("bfloat16", "float16", "float32")
#: How a run is driven: the timed SimPy engine, or a cache-only replay in arrival order.
MODES = ("engine", "replay")
#: What a preempted request keeps (``SimConfig.preemption``).
PREEMPTION_MODES = ("restart", "resume")
#: Which running request a step preempts for pages (``SimConfig.preemption_policy``).
PREEMPTION_POLICIES = ("youngest", "sglang")
#: What admission reserves for running requests' output (``SimConfig.decode_reservation``).
DECODE_RESERVATIONS = ("none", "sglang")
#: Whose rule ``SimConfig.max_model_len`` follows (:mod:`sim.engine.length_limits`).
LENGTH_LIMIT_RULES = ("vllm", "sglang")
#: What clients ask for as ``max_tokens`` besides a number (``SimConfig.client_max_tokens``):
#: each request exactly its answer's length, or nothing (the engine's own cap).
CLIENT_MAX_TOKENS = ("answer", "unset")
#: The longest ``max_model_len`` a configuration may set (tokens).
MAX_MODEL_LEN = 2**30
#: Fault switches that only a timed engine has (copy timing, preemption).
TIMED_FAULTS = (
    "preempt_mid_prefill_rate",
    "copy_delay_s",
    "publish_on_issue",
    "skip_abort_on_preempt",
)
#: Backends a run can use (see :mod:`sim.engine.backends`).
BACKEND_NAMES = ("shadow", "reference", "gpu", "external")
#: Fraction of the GPU's memory the engine may use (the rest is left to the runtime).
GPU_MEMORY_UTILIZATION = 0.9
#: Default byte budget of the checkpoint pool: 16 GiB.
DEFAULT_CHECKPOINT_BUDGET_BYTES = 16 * 2**30

# Upper bounds: far beyond any real deployment, low enough that the pools the engine
# allocates (lists of pages, slots and batch slots) fit in memory and that every number
# converts to a float. docs/SCENARIOS.md lists them.
#: Tokens per KV page at most.
MAX_BLOCK_SIZE = 2**16
#: Tokens per engine step at most.
MAX_TOKEN_BUDGET = 2**20
#: Running sequences (batch slots) at most.
MAX_NUM_SEQS = 2**20
#: Speculative tokens per decode step at most.
MAX_SPEC_TOKENS = 2**10
#: ``running_states`` at most: vLLM's ``1 + num_speculative_tokens`` blocks per group.
MAX_RUNNING_STATES = 1 + MAX_SPEC_TOKENS
#: KV pages at most (given, or derived from a byte budget or the GPU's memory; a derived
#: value is capped at it, e.g. for a model without full-attention layers).
MAX_KV_BLOCKS = 2**22
#: Snapshot slots at most (given, or derived from the checkpoint byte budget).
MAX_CHECKPOINT_SLOTS = 2**20
#: Byte budgets (KV, checkpoint pool) at most: 1 PiB.
MAX_BUDGET_BYTES = 2**50
#: Seconds of a fixed cost (per step, per copy, a fault's copy delay) or of the sample
#: interval at most.
MAX_SECONDS = 3600.0
#: Seeds lie in ``[0, MAX_SEED]``.
MAX_SEED = 2**63 - 1
#: ``warmup_requests`` at most.
MAX_REQUESTS_WARMUP = 2**40


def _check_int(
    owner: str, name: str, value: object, minimum: int, maximum: int | None = None
) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise InvalidConfigError(f"{owner}.{name} must be an int {bounds}, got {value!r}")
    return value


def _check_float(owner: str, name: str, value: object, low: float, high: float = math.inf) -> float:
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):  # an int too large for a float: NaN
            number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        bounds = f"in [{low}, {high}]" if high != math.inf else f">= {low}"
        raise InvalidConfigError(f"{owner}.{name} must be a finite number {bounds}, got {value!r}")
    return number


def check_finite_params(owner: str, params: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidConfigError` for a non-finite float in ``params`` (nested
    lists and tables included): results are JSON, which has no NaN or infinity."""

    def visit(path: str, value: object) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidConfigError(f"{owner}[{path}] must be a finite number, got {value!r}")
        if isinstance(value, Mapping):
            for key, item in value.items():
                visit(f"{path}.{key}", item)
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                visit(f"{path}[{index}]", item)

    for key, value in params.items():
        visit(repr(key), value)


#: The parts of :meth:`SimConfig.memory_plan` that add up to what a run keeps in GPU memory.
MEMORY_PARTS = ("weights_bytes", "live_state_bytes", "checkpoint_pool_bytes", "kv_pool_bytes")


@dataclass(frozen=True)
class Faults:
    """Fault-injection switches (all off by default).

    Conditions a correct engine must survive with zero lockstep violations:

    Attributes:
        capture_failure_rate: probability that the backend reports a capture as failed
            when it is issued; the engine must abort the reservation (abort path).
        preempt_mid_prefill_rate: probability, per step, that the youngest request with a
            scheduled prefill chunk is preempted after scheduling and before the step
            runs; its reservations of the step must be aborted. Only a step with other
            work is drawn for, so a lone request always makes progress.
        copy_delay_s: extra seconds added to every copy-stream job, so captures complete
            (and publish) well after their step ends.
        broken_backend: the backend declines every capture strictly inside a chunk but
            reports it as written: reserved, never written, then published — the
            vLLM mamba seed's warning. Always a violation.

    Engine mistakes, to show the checker catches what the faults above would cause:

    Attributes:
        publish_failed_captures: publish a failed capture instead of aborting it.
        skip_abort_on_preempt: forget the reservations of a request preempted after its
            chunk was scheduled.
        publish_on_issue: publish when a capture is issued, not when its copy completes.
    """

    capture_failure_rate: float = 0.0
    preempt_mid_prefill_rate: float = 0.0
    copy_delay_s: float = 0.0
    broken_backend: bool = False
    publish_failed_captures: bool = False
    skip_abort_on_preempt: bool = False
    publish_on_issue: bool = False

    def __post_init__(self) -> None:
        _check_float("Faults", "capture_failure_rate", self.capture_failure_rate, 0.0, 1.0)
        _check_float("Faults", "preempt_mid_prefill_rate", self.preempt_mid_prefill_rate, 0.0, 1.0)
        _check_float("Faults", "copy_delay_s", self.copy_delay_s, 0.0, MAX_SECONDS)
        for name in (
            "broken_backend",
            "publish_failed_captures",
            "skip_abort_on_preempt",
            "publish_on_issue",
        ):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfigError(f"Faults.{name} must be True or False")

    def active(self) -> dict[str, object]:
        """The switches that differ from their defaults."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }


@dataclass(frozen=True)
class SimConfig:
    """One simulated serving engine.

    Attributes:
        model: real model priced by the cost model (:data:`reference.sizes.MODELS`), or the
            name of ``model_sizes``.
        model_sizes: a model described by the planner (``[model]`` in a scenario,
            :mod:`sim.scenarios.model_table`); ``None`` = the preset ``model`` names. When
            set, ``model`` becomes its name.
        gpu: GPU preset (:data:`sim.engine.costs.GPU_PRESETS`).
        tensor_parallel, pipeline_parallel: GPUs of the deployment
            (:mod:`sim.engine.deployment`); every memory figure (budgets, pools, the memory
            plan) is per GPU.
        allreduce_latency_s, link_efficiency: the deployment's communication costs.
        block_size: tokens per KV page ``B``.
        hash_unit: hash unit ``h`` of the checkpoint index (divides ``B``); ``None`` = ``B``.
        token_budget: tokens scheduled per step (decode first, then prefill chunks).
        decodes_share_budget: a step's decode tokens come out of ``token_budget`` before
            its prefill chunks (vLLM's mixed batches); ``False``: the prefill chunks and
            admissions get the whole ``token_budget`` whatever the step decodes (SGLang
            runs prefill and decode in separate batches, so its chunk is
            ``chunked_prefill_size`` tokens however many requests decode).
        max_num_seqs: running sequences at most (batch slots).
        kv_blocks: KV pages in the pool; ``None`` = sized from the GPU memory left after
            weights, live recurrent state and the checkpoint pool.
        checkpoint_slots: snapshot slots; ``None`` = ``checkpoint_budget_bytes`` / slot bytes.
        checkpoint_budget_bytes: byte budget of the checkpoint pool when
            ``checkpoint_slots`` is ``None``.
        placement: placement policy name; ``placement_params`` override its defaults
            (:func:`default_placement_params`).
        eviction: eviction policy of the checkpoint index; ``eviction_params`` go to it.
        spec_tokens: speculative tokens proposed per decode step (0 = off).
        spec_acceptance: probability each proposed token is accepted (until the first
            rejection).
        backend: ``shadow``, ``reference``, ``gpu`` or ``external``.
        impl: ``module:factory`` of the implementation (``external``; optional for the
            others: ``shadow`` defaults to the reference's index and placement).
        seed: seed of every random draw of the engine (acceptance, faults).
        namespace: namespace of every checkpoint key; ``None`` = the model name.
        sample_interval_s: simulated seconds between time-series samples.
        fuse_decode_steps: run consecutive decode-only steps without a SimPy event each
            (same results; faster).
        closed_loop: closed-loop sessions (:mod:`sim.engine.sessions`): a session's next
            turn arrives its think time after the previous turn left, not at the
            workload's own (open-loop) time. Scenarios and ``hyckpt simulate`` turn it on
            for generated workloads and off for replayed traces.
        check_exactness: real-tensor backends compare every restored request with a
            scratch prefill.
        buffer_habits: names of the buffer habits of real engines a real-tensor backend
            plays (:mod:`reference.conformance.buffer_habits`: ``padded_pools``, ``reallocation``,
            ``shared_export``, ``sliced_inputs``); none by default.
        mfu, mbu, copy_efficiency, step_overhead_s, copy_launch_s: cost model parameters
            (:class:`~sim.engine.costs.CostModel`).
        cache_generated: a finished request caches what it generated, as SGLang's
            ``cache_finished_req`` and vLLM's block caching of decoded tokens do: the full
            KV blocks of its answer are registered by block hash and its recurrent state
            at the end of what it computed (prompt + output - 1 tokens: the last
            generated token was never fed through the model) is captured, so the next
            turn of a conversation hits at the end of the previous answer
            (docs/SIMULATION.md section 1). Needs requests that carry their ``answer``
            (the real-tensor backends decode its tokens, so the checkpoint holds the
            real state after decode).
        generated_state: with ``cache_generated``, also capture the recurrent state at
            the end of the answer (SGLang, Marconi); ``False`` registers the answer's KV
            blocks only (vLLM 0.33, whose Mamba groups keep no decode-time state).
        generated_state_grid: tokens ``T`` (``0``: off). With ``cache_generated`` and
            ``generated_state``, the answer's state is captured at ``floor(p / T) * T``
            instead of ``p = prompt + output - 1``, and only when that lies past the
            prompt (none otherwise; the prompt's chunks keep their own): SGLang's
            ``extra_buffer`` strategy tracks decode states on ``mamba_track_grid`` and
            donates the latest at the finish (docs/SEMANTICS.md H8a). Shadow backend
            only: a real state at ``floor(p / T) * T`` is gone when the request finishes.
        kv_up_to_checkpoint: a request's KV blocks are cached only up to its furthest
            checkpoint (the positions placement chose, its hit, its answer's state): SGLang's
            ``extra_buffer`` inserts KV into the radix tree with each tracked state and
            frees the KV past the last (``UnifiedRadixCache.checkpoint_into_tree``);
            ``False``: every full block computed is cached (docs/SEMANTICS.md H8a).
        capture_all: every position placement yields for a chunk is reserved, each
            evicting what it needs (vLLM: a retained Mamba state is the request's own
            state block, ``MambaManager.allocate_new_blocks``, so every reachable boundary
            is kept); ``False``: SEMANTICS H5 (a chunk's positions after its first only
            into free memory).
        keep_block_copies: a KV block computed again under a digest that is already
            registered (a request whose hit stopped short of the cached prefix) is
            registered as another copy, so the prefix stays cached as long as its most
            recently used copy (vLLM's ``BlockHashToBlockMap`` keeps every copy);
            ``False``: the copy stays private and is reused first.
        adopt_cached_blocks: a KV block a request computed again under a digest that is
            already registered (its hit stopped short of the cached prefix) is swapped
            for the cached copy when the request registers its blocks: it holds the
            cached block from then on and its own goes back to the free pool, as
            SGLang's insert frees a request's duplicate KV and repoints the request at
            the tree's (``UnifiedRadixCache.checkpoint_into_tree``; docs/SEMANTICS.md
            H10a); needs ``keep_block_copies=False``; ``False``: the request keeps its
            private copy until it finishes.
        captures_in_step: a step's checkpoint copies run within the step, in the compute
            stream's order, so each checkpoint is published when the step that wrote it
            ends, before the next step is planned, as SGLang copies a chunk's state into
            a new Mamba slot in stream order and inserts it into its tree before it plans
            again (``Scheduler.stash_chunked_request`` / ``checkpoint_kv_cache`` at the
            start of ``get_next_batch_to_run``; docs/SEMANTICS.md H9n). ``False``: the
            copies run on a copy stream of their own and publish when it finishes them.
        hold_latest_checkpoint: a running request holds its latest checkpoint pinned, out
            of eviction's reach: its hit from its admission, then each checkpoint its
            prefill chunks publish in turn (the newer one taking over), until it finishes
            or is preempted, as SGLang's request locks the tree node it has reached
            (``req.lock``, moved by ``checkpoint_kv_cache`` and released by
            ``release_kv_cache``; docs/SEMANTICS.md H9l). ``False``: a hit is pinned only
            until its restore completes and a request's captures are evictable once
            published.
        drop_leaf_kv: split memory: when a checkpoint that no cached KV continues is
            evicted, its free cached KV blocks go too, back to the nearest block another
            cached sequence continues, a sequence holds, or a cached checkpoint on its
            prefix needs (SGLang's radix tree deletes a leaf node with its state;
            docs/SEMANTICS.md H10); ``False``: KV blocks and checkpoints are evicted apart.
        running_states: recurrent states each running request holds in the checkpoint
            budget while it runs (its live state and any tracking buffers), taken at
            admission, evicting cached checkpoints as needed, and given back when it
            finishes or is preempted (docs/SEMANTICS.md H9): SGLang's running request
            holds its own Mamba slot (1; 3 with ``extra_buffer``'s two ping-pong track
            slots), vLLM's one state block per Mamba group. ``0``: live states are
            outside the cache (the budget left for the cache already excludes them).
        state_handover: unified memory, with ``running_states``: a decode step that
            takes a running request's state into a new block (its length crosses a
            multiple of ``block_size``) holds one more state's pages for that step, freed
            when the step completes: vLLM's align mode writes the state into a new block
            each time and frees the old one a step later
            (``MambaManager.remove_skipped_blocks``; docs/SEMANTICS.md H9);
            ``False``: a running request's states stay where they are.
        block_aligned_chunks: a prefill chunk that does not finish the prompt ends on a
            block boundary, and any chunk stops at a branch point of the request inside
            it (with ``workload_hints`` off, the junction where its prompt leaves the
            cached KV): vLLM's align mode writes states at chunk ends
            (``Scheduler._mamba_block_aligned_split``); ``False``: a chunk is as long as
            the step's budget allows.
        release_recency: a request's checkpoints count as used when it lets go of them:
            a chunk's captures publish highest position first, and the checkpoint the
            chunk started from (its hit, or the previous chunk's end) is used again after
            them (vLLM frees the state blocks a request moved past a step later, highest
            position first, ``MambaManager._remove_blocks_in_range``; docs/SEMANTICS.md
            H9b); ``False``: by publication and hits alone.
        interleaved_free: unified memory, with ``release_recency``: the checkpoints a
            chunk lets go of (its captures and the checkpoint it started from) wait in the
            free queue one page of each before the rest of any, so evicting several of
            them takes one page each: an evicted one's other pages come back only once
            every other one is evicted or used again (vLLM frees a step's states one
            layer group after another, ``KVCacheCoordinator.free`` and
            ``BlockPool.free_blocks``; docs/SEMANTICS.md H9d); ``False``: an evicted
            checkpoint's pages are all reusable at once.
        required_captures: unified memory: a prefill chunk runs only with the pages of the
            checkpoints placement puts inside it (not the one its running state becomes):
            an admission waits, and a running request's chunk preempts the youngest
            running request, until they are free, as vLLM's align mode allocates a chunk's
            checkpoint block with its KV (``MambaManager.get_num_blocks_to_allocate``;
            docs/SEMANTICS.md H9e); ``False``: a checkpoint that finds no memory is
            skipped and the chunk runs without it.
        states_in_place: the model reads a hit's state and writes its checkpoints in their
            own memory: no restore or capture copies (a step never waits for a restore; a
            capture is published when its step completes), as vLLM's align mode
            (the Mamba kernels take state indices into the cache blocks,
            ``mamba_mixer2.py``; docs/SEMANTICS.md H9e); in the timed engine the request
            holds what a step read or wrote until its turn in the next step's planning
            (two steps on with ``async_scheduling``; H9h). ``False``: copies on the copy
            stream.
        async_scheduling: the timed engine plans a step before it has taken in the
            previous step's output, as vLLM does by default (``AsyncScheduler``,
            ``EngineCore.step_with_batch_queue``): a request that finished in a step gives
            its KV, states and batch slot back only after the next step is planned
            (docs/SEMANTICS.md H9f); ``False``: at the end of its step. A replay ignores it.
        admit_after_preemption: a step whose planning preempted a request still admits
            from the waiting queue (the preempted request first); ``False``: it admits
            nothing, as vLLM's ``Scheduler.schedule`` schedules waiting requests only when
            it preempted none this step (docs/SEMANTICS.md H9g). A replay never preempts.
        preemption: what a preempted request keeps (timed engine). ``restart``: nothing;
            readmitted, it looks its prompt up again and generates its output anew.
            ``resume``: its output tokens, as vLLM and SGLang keep them
            (``Request.num_tokens`` = prompt + output; SGLang's ``reset_for_retract``
            leaves ``output_ids``): readmitted, it looks up and prefills its prompt and
            the output it had, then goes on decoding (docs/SEMANTICS.md H9g). A request
            whose workload gives no ``answer`` restarts. A replay never preempts.
        preemption_policy: which running request the timed engine preempts when a step
            finds no free pages. ``youngest``: the youngest running request, decoding or
            prefilling, requeued at the head of the waiting queue (vLLM's
            ``Scheduler.schedule``, ``running.pop()``, ``waiting.prepend_request``).
            ``sglang``: SGLang's decode retraction (``ScheduleBatch.retract_decode``,
            ``retraction_policy = "length"``): only decoding requests, fewest output
            tokens first, the longest prompt first among equals, then the youngest; the
            request goes to the back of the waiting queue, and the KV it decoded is freed
            uncached (``release_kv_cache(checkpoint=False)``); a prefill chunk that finds
            no pages waits for a later step while any request decodes (docs/SEMANTICS.md
            H9g). A replay never preempts.
        mixed_batches: a timed step runs the decoding requests' decodes and the
            prefilling requests' chunks together, as vLLM's batches mix them. ``False``: a
            step runs prefill chunks and admissions when it can plan any, and decodes only
            when it cannot, as SGLang's scheduler runs a prefill batch first and the
            decode batch otherwise (``get_next_batch_to_run``, ``enable_mixed_chunk`` off
            by default; docs/SEMANTICS.md H9i). A replay serves one request at a time.
        refresh_waiting_prefixes: the timed engine refreshes the cached prefixes of the
            requests waiting to be admitted, as SGLang's scheduler does
            (``SchedulePolicy._touch_waiting_prefixes``): every 32nd planning pass that
            looks at a non-empty waiting queue, each of its first 128 requests, the head
            last, has the checkpoint its lookup would hit and the free KV blocks before
            it made most recently used (docs/SEMANTICS.md H9m). ``False``: a waiting
            request touches nothing until its admission.
        pause_after_refusal: once the admission reservation (``decode_reservation``)
            refuses a request while others run, the timed engine admits no one (and, with
            ``refresh_waiting_prefixes``, does not look at the waiting queue unless a
            request is mid-prefill) until a running request leaves or a prefill step
            leaves a request mid-prefill, as SGLang's ``running_batch.batch_is_full``
            (docs/SEMANTICS.md H9o). ``False``: admission is tried every step.
        allocate_after_lookups: a timed prefill step allocates its KV blocks (the
            continuing chunks' and the admitted requests') after every admission of the
            step has looked up and taken its hit's blocks, in one allocation, as SGLang's
            ``ScheduleBatch.prepare_for_extend`` allocates the batch's tokens once
            ``PrefillAdder`` has locked each admitted request's matched node: what the
            step evicts is never a prefix a request admitted in the same step hits
            (docs/SEMANTICS.md H9p). ``False``: each chunk and admission allocates as it
            is planned, as vLLM's ``Scheduler.schedule`` does; a later admission of the
            step may find its prefix evicted by an earlier one's allocation. Split
            memory only.
        lookup_refreshes_prefix: an admission's lookup makes the free cached KV blocks
            before its hit the most recently used whether or not the request is then
            admitted, as SGLang's ``match_prefix`` stamps the nodes from its hit to the
            root before ``PrefillAdder`` decides (docs/SEMANTICS.md H9q). ``False``: a
            request the step does not admit (the reservation refuses it, the budget or
            the pool is short) leaves the KV's recency as it was, as vLLM's lookup does.
        decode_reservation: what the timed engine's admission keeps free for the running
            requests' future output. ``none``: nothing; a request is admitted when its
            first chunk's blocks are free. ``sglang``: SGLang's ``PrefillAdder``: the
            free and evictable KV tokens less each decoding request's remaining output
            times the new-token ratio (0.7, decaying to 0.098 over 600 decode steps,
            re-estimated at a retraction, reset when idle) and less the output of the
            requests whose prefill this step completes, must exceed the new request's
            uncached prompt plus its output plus a page; a continuing chunk is cut to
            what is left (:mod:`sim.engine.decode_reservation`, docs/SEMANTICS.md H9j).
        max_model_len: the longest sequence (prompt + output, tokens) the engine serves,
            as vLLM's ``max_model_len`` and SGLang's ``context_length``, which both take
            from the model's ``max_position_embeddings`` by default: a longer prompt is
            rejected on arrival and a request's output stops at the limit, by
            ``length_limits``'s rule (:mod:`sim.engine.length_limits`). ``None``: no
            limit.
        client_max_tokens: the ``max_tokens`` clients send (SEMANTICS H9k). ``"answer"``:
            each request asks for exactly its answer's length, as benchmark clients do
            (``sglang.bench_serving`` sends ``max_new_tokens`` = the output length).
            ``"unset"``: no ``max_tokens``, as an OpenAI-API client that leaves it out;
            the engine caps it at what the context and memory leave. An int: every
            request asks for that many; a longer answer is cut there (counted in
            ``requests.length_capped``). Only SGLang's admission reservation
            (``decode_reservation = "sglang"``) reserves by it; vLLM's scheduler
            reserves nothing for output.
        length_limits: whose rule ``max_model_len`` follows: ``vllm`` (a prompt of at
            least ``max_model_len`` tokens is refused; output stops at ``max_model_len``
            tokens in all) or ``sglang`` (a prompt of at least ``max_model_len - 6`` is
            refused; output stops at ``max_model_len - 2``).
        admit_full_prompt: a request is admitted only when the pages its whole prompt
            would take as one chunk (its KV past the hit, and with unified memory its
            running states and that chunk's checkpoints) are free, as vLLM's
            ``scheduler_reserve_full_isl`` admits (``KVCacheManager.allocate_slots`` with
            ``full_sequence_must_fit``; docs/SEMANTICS.md H9e); ``False``: when its first
            chunk's are.
        workload_hints: the engine is told the workload's structure (each request's
            ``branch_points`` and ``turn_starts``, for placement and H5's reservation
            order); ``False``: it knows only what it sees in the cache (the end of the
            cached KV blocks at lookup), as a real engine does.
        checkpoint_share: with ``split`` memory, size both pools from one budget
            (``cache_budget_bytes``, else the GPU's memory after weights and live state):
            this share for checkpoint slots, the rest for KV pages (SGLang's
            ``mamba_full_memory_ratio`` r gives a share of r / (1 + r)); ``None``: the
            pools are sized by ``kv_blocks`` and ``checkpoint_slots`` /
            ``checkpoint_budget_bytes``.
        checkpoint_share_rule: how ``checkpoint_share`` cuts the budget. ``share``:
            ``floor(budget * share / slot bytes)`` slots, the rest of the budget in KV
            pages. ``sglang``: SGLang 0.5.23's ``_handle_max_mamba_cache``
            (``srt/mem_cache/kv_cache_configurator.py``): ``int((budget * share - R) //
            R)`` slots of the recurrent state ``R`` alone (its Mamba pool also allocates a
            padding state, and at SGLang's page size 1 a state carries no partial page),
            and KV pages from what ``(slots + 1) * R`` leaves of the budget; running
            requests capped at ``slots // 3``. ``sglang-extra-buffer``: the same pool,
            capped at ``slots // 5`` (what a running request holds of it is
            ``running_states``).
        ssm_state_dtype: the dtype the engine stores the recurrent state in (vLLM
            ``--mamba-ssm-cache-dtype``, SGLang ``--mamba-ssm-dtype``), replacing the
            model's ``ssm_state_dtype`` in every size and price; ``None``: the model's.
        warmup_requests: the hit rates "after warm-up" (``totals.after_warmup``) count
            the requests admitted after this many; ``None``: after the cache first
            evicted to make room (it was full).
        memory: ``split`` (a KV pool and a checkpoint pool of their own sizes) or
            ``unified``: one budget of pages from which both cached KV blocks and
            checkpoint slots are drawn, least recently used side freed first
            (:mod:`sim.engine.unified`; vLLM's hybrid allocator, Marconi).
        cache_budget_bytes: with ``unified`` (or ``split`` with ``checkpoint_share``), the
            budget in bytes; ``None`` = what the GPU's memory leaves after weights and
            live recurrent state.
        reserved_pages: with ``unified``, pages of the budget the engine keeps for itself
            and never caches in: vLLM's ``BlockPool`` takes block 0 as its null block
            (``vllm/v1/core/block_pool.py``), so 1 for vLLM (docs/SEMANTICS.md H6).
        mode: ``engine`` (the timed SimPy engine) or ``replay``: a cache-only replay of
            the workload in arrival order, one request at a time, through the same
            index, placement, eviction, KV pool and generated-token caching code
            (:mod:`sim.engine.replay`); no timing, no live-KV pressure, no preemption.
        faults: fault-injection switches.
    """

    model: str = "nemotron-h-8b"
    gpu: str = "h200"
    model_sizes: ModelSizes | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    allreduce_latency_s: float = 10e-6
    link_efficiency: float = 0.8
    block_size: int = 16
    hash_unit: int | None = None
    token_budget: int = 8192
    decodes_share_budget: bool = True
    max_num_seqs: int = 256
    kv_blocks: int | None = None
    checkpoint_slots: int | None = None
    checkpoint_budget_bytes: int = DEFAULT_CHECKPOINT_BUDGET_BYTES
    placement: str = "block-floor"
    placement_params: Mapping[str, Any] = field(default_factory=dict)
    eviction: str = "lru"
    eviction_params: Mapping[str, Any] = field(default_factory=dict)
    spec_tokens: int = 0
    spec_acceptance: float = 0.7
    backend: str = "shadow"
    impl: str | None = None
    seed: int = 0
    namespace: str | None = None
    sample_interval_s: float = 1.0
    fuse_decode_steps: bool = True
    closed_loop: bool = False
    check_exactness: bool = True
    buffer_habits: tuple[str, ...] = ()
    mfu: float = 0.5
    mbu: float = 0.8
    copy_efficiency: float = 0.8
    step_overhead_s: float = 0.0005
    copy_launch_s: float = 0.000005
    cache_generated: bool = False
    generated_state: bool = True
    generated_state_grid: int = 0
    kv_up_to_checkpoint: bool = False
    capture_all: bool = False
    keep_block_copies: bool = False
    adopt_cached_blocks: bool = False
    hold_latest_checkpoint: bool = False
    captures_in_step: bool = False
    drop_leaf_kv: bool = False
    running_states: int = 0
    state_handover: bool = False
    block_aligned_chunks: bool = False
    release_recency: bool = False
    interleaved_free: bool = False
    required_captures: bool = False
    states_in_place: bool = False
    async_scheduling: bool = False
    preemption: str = "restart"
    preemption_policy: str = "youngest"
    mixed_batches: bool = True
    refresh_waiting_prefixes: bool = False
    pause_after_refusal: bool = False
    allocate_after_lookups: bool = False
    lookup_refreshes_prefix: bool = False
    decode_reservation: str = "none"
    admit_after_preemption: bool = True
    max_model_len: int | None = None
    length_limits: str = "vllm"
    client_max_tokens: int | str = "answer"
    admit_full_prompt: bool = False
    workload_hints: bool = True
    checkpoint_share: float | None = None
    checkpoint_share_rule: str = "share"
    ssm_state_dtype: str | None = None
    warmup_requests: int | None = None
    mode: str = "engine"
    memory: str = "split"
    cache_budget_bytes: int | None = None
    reserved_pages: int = 0
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        owner = "SimConfig"
        if self.model_sizes is not None:
            if not isinstance(self.model_sizes, ModelSizes):
                raise InvalidConfigError(
                    f"SimConfig.model_sizes must be a ModelSizes, got {self.model_sizes!r}"
                )
            object.__setattr__(self, "model", self.model_sizes.name)
        else:
            get_model(self.model)
        get_gpu(self.gpu)
        _check_int(owner, "tensor_parallel", self.tensor_parallel, 1, MAX_PARALLEL)
        _check_int(owner, "pipeline_parallel", self.pipeline_parallel, 1, MAX_PARALLEL)
        _check_float(owner, "allreduce_latency_s", self.allreduce_latency_s, 0.0, 1.0)
        if not _check_float(owner, "link_efficiency", self.link_efficiency, 0.0, 1.0) > 0:
            raise InvalidConfigError("SimConfig.link_efficiency must be > 0")
        if self.ssm_state_dtype is not None and self.ssm_state_dtype not in STATE_DTYPES:
            raise InvalidConfigError(
                f"SimConfig.ssm_state_dtype must be None or one of {', '.join(STATE_DTYPES)}, "
                f"got {self.ssm_state_dtype!r}"
            )
        try:
            shard_model(self.sizes(), self.tensor_parallel, self.pipeline_parallel)
        except InvalidConfigError as error:
            raise InvalidConfigError(f"SimConfig: {error}") from None
        block = _check_int(owner, "block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        unit = (
            block
            if self.hash_unit is None
            else _check_int(owner, "hash_unit", self.hash_unit, 1, MAX_BLOCK_SIZE)
        )
        if block % unit:
            raise InvalidConfigError(
                f"SimConfig.hash_unit={unit} must divide block_size={block} (KV block "
                "digests are the index's unit digests every B/h units)"
            )
        _check_int(owner, "token_budget", self.token_budget, 1, MAX_TOKEN_BUDGET)
        _check_int(owner, "max_num_seqs", self.max_num_seqs, 1, MAX_NUM_SEQS)
        if self.kv_blocks is not None:
            _check_int(owner, "kv_blocks", self.kv_blocks, 1, MAX_KV_BLOCKS)
        if self.checkpoint_slots is not None:
            _check_int(owner, "checkpoint_slots", self.checkpoint_slots, 1, MAX_CHECKPOINT_SLOTS)
        _check_int(
            owner, "checkpoint_budget_bytes", self.checkpoint_budget_bytes, 1, MAX_BUDGET_BYTES
        )
        if self.placement not in PLACEMENT_POLICIES:
            raise InvalidConfigError(
                f"unknown placement policy {self.placement!r} "
                f"(known: {', '.join(sorted(PLACEMENT_POLICIES))})"
            )
        if self.eviction not in EVICTION_POLICIES:
            raise InvalidConfigError(
                f"unknown eviction policy {self.eviction!r} "
                f"(known: {', '.join(sorted(EVICTION_POLICIES))})"
            )
        spec = _check_int(owner, "spec_tokens", self.spec_tokens, 0, MAX_SPEC_TOKENS)
        _check_float(owner, "spec_acceptance", self.spec_acceptance, 0.0, 1.0)
        if self.token_budget < self.max_num_seqs * (1 + spec):
            raise InvalidConfigError(
                f"SimConfig.token_budget={self.token_budget} must cover one decode step of "
                f"every running sequence: max_num_seqs * (1 + spec_tokens) = "
                f"{self.max_num_seqs * (1 + spec)}"
            )
        if self.backend not in BACKEND_NAMES:
            raise InvalidConfigError(
                f"unknown backend {self.backend!r} (known: {', '.join(BACKEND_NAMES)})"
            )
        if self.backend == "external" and not self.impl:
            raise InvalidConfigError("backend 'external' needs impl='module:factory'")
        if isinstance(self.buffer_habits, str) or not isinstance(self.buffer_habits, Sequence):
            raise InvalidConfigError(
                f"SimConfig.buffer_habits must be a sequence of names, got {self.buffer_habits!r}"
            )
        try:
            habits_named(self.buffer_habits)
        except InvalidConfigError as error:
            raise InvalidConfigError(f"SimConfig.buffer_habits: {error}") from None
        object.__setattr__(self, "buffer_habits", tuple(self.buffer_habits))
        if self.buffer_habits and self.backend == "shadow":
            raise InvalidConfigError(
                "SimConfig.buffer_habits need a real-tensor backend ('reference', 'gpu' or "
                "'external'); 'shadow' has no tensors"
            )
        _check_int(owner, "seed", self.seed, 0, MAX_SEED)
        _check_float(owner, "sample_interval_s", self.sample_interval_s, 1e-9, MAX_SECONDS)
        for name in ("step_overhead_s", "copy_launch_s"):
            _check_float(owner, name, getattr(self, name), 0.0, MAX_SECONDS)
        if not isinstance(self.closed_loop, bool):
            raise InvalidConfigError(
                f"SimConfig.closed_loop must be a bool, got {self.closed_loop!r}"
            )
        if not isinstance(self.cache_generated, bool):
            raise InvalidConfigError(
                f"SimConfig.cache_generated must be a bool, got {self.cache_generated!r}"
            )
        for flag in (
            "decodes_share_budget",
            "generated_state",
            "kv_up_to_checkpoint",
            "capture_all",
            "keep_block_copies",
            "adopt_cached_blocks",
            "hold_latest_checkpoint",
            "captures_in_step",
            "drop_leaf_kv",
            "state_handover",
            "block_aligned_chunks",
            "release_recency",
            "interleaved_free",
            "required_captures",
            "states_in_place",
            "async_scheduling",
            "mixed_batches",
            "admit_after_preemption",
            "admit_full_prompt",
            "workload_hints",
        ):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidConfigError(
                    f"SimConfig.{flag} must be a bool, got {getattr(self, flag)!r}"
                )
        if self.generated_state_grid:
            self._check_generated_state_grid()
        _check_int(owner, "running_states", self.running_states, 0, MAX_RUNNING_STATES)
        if self.checkpoint_share_rule not in SHARE_RULES:
            raise InvalidConfigError(
                f"SimConfig.checkpoint_share_rule must be one of {', '.join(SHARE_RULES)}, "
                f"got {self.checkpoint_share_rule!r}"
            )
        if self.checkpoint_share is not None:
            self._check_share()
            self._check_sglang_running()
        if self.warmup_requests is not None:
            _check_int(owner, "warmup_requests", self.warmup_requests, 0, MAX_REQUESTS_WARMUP)
        if not isinstance(self.faults, Faults):
            raise InvalidConfigError("SimConfig.faults must be a Faults instance")
        if self.memory not in MEMORY_MODES:
            raise InvalidConfigError(
                f"SimConfig.memory must be one of {', '.join(MEMORY_MODES)}, got {self.memory!r}"
            )
        if self.cache_budget_bytes is not None:
            _check_int(owner, "cache_budget_bytes", self.cache_budget_bytes, 1, MAX_BUDGET_BYTES)
            if self.memory != "unified" and self.checkpoint_share is None:
                raise InvalidConfigError(
                    "SimConfig.cache_budget_bytes is one budget for KV and checkpoints: it "
                    "needs memory='unified', or memory='split' with checkpoint_share (split "
                    "pools are otherwise sized by kv_blocks and checkpoint_slots / "
                    "checkpoint_budget_bytes)"
                )
        _check_int(owner, "reserved_pages", self.reserved_pages, 0, MAX_KV_BLOCKS)
        if self.reserved_pages and self.memory != "unified":
            raise InvalidConfigError(
                f"SimConfig.reserved_pages={self.reserved_pages} takes pages out of the "
                "unified budget: it needs memory='unified' (a split KV pool is sized by "
                "kv_blocks)"
            )
        if self.memory == "unified":
            self._check_unified()
        if self.max_model_len is not None:
            _check_int(owner, "max_model_len", self.max_model_len, 2, MAX_MODEL_LEN)
        if self.length_limits not in LENGTH_LIMIT_RULES:
            raise InvalidConfigError(
                f"SimConfig.length_limits must be one of {', '.join(LENGTH_LIMIT_RULES)}, "
                f"got {self.length_limits!r}"
            )
        if self.client_max_tokens not in CLIENT_MAX_TOKENS:
            if isinstance(self.client_max_tokens, str):
                raise InvalidConfigError(
                    "SimConfig.client_max_tokens must be an int >= 1 or one of "
                    f"{', '.join(CLIENT_MAX_TOKENS)}, got {self.client_max_tokens!r}"
                )
            _check_int(owner, "client_max_tokens", self.client_max_tokens, 1, MAX_MODEL_LEN)
        if self.preemption not in PREEMPTION_MODES:
            raise InvalidConfigError(
                f"SimConfig.preemption must be one of {', '.join(PREEMPTION_MODES)}, "
                f"got {self.preemption!r}"
            )
        if self.preemption_policy not in PREEMPTION_POLICIES:
            raise InvalidConfigError(
                "SimConfig.preemption_policy must be one of "
                f"{', '.join(PREEMPTION_POLICIES)}, got {self.preemption_policy!r}"
            )
        if self.decode_reservation not in DECODE_RESERVATIONS:
            raise InvalidConfigError(
                "SimConfig.decode_reservation must be one of "
                f"{', '.join(DECODE_RESERVATIONS)}, got {self.decode_reservation!r}"
            )
        if self.mode not in MODES:
            raise InvalidConfigError(
                f"SimConfig.mode must be one of {', '.join(MODES)}, got {self.mode!r}"
            )
        if self.mode == "replay":
            timed = [name for name in TIMED_FAULTS if name in self.faults.active()]
            if timed:
                raise InvalidConfigError(
                    f"SimConfig.mode='replay' has no timing and no preemption, so the "
                    f"faults {', '.join(timed)} cannot happen in it; unset them or run "
                    "mode='engine'"
                )
        object.__setattr__(self, "placement_params", dict(self.placement_params))
        object.__setattr__(self, "eviction_params", dict(self.eviction_params))
        check_finite_params("SimConfig.placement_params", self.placement_params)
        check_finite_params("SimConfig.eviction_params", self.eviction_params)
        self.costs()  # validates the cost parameters
        if self.checkpoint_slots is None and self.memory == "split" and not self.checkpoint_share:
            self._budget_slots()  # at least one slot, at most MAX_CHECKPOINT_SLOTS
        if self.running_states:
            self._check_running_states()
        if self.state_handover and (self.memory != "unified" or not self.running_states):
            raise InvalidConfigError(
                "SimConfig.state_handover moves a running request's state between pages of "
                "the unified budget: it needs memory='unified' and running_states >= 1"
            )
        if self.interleaved_free and (self.memory != "unified" or not self.release_recency):
            raise InvalidConfigError(
                "SimConfig.interleaved_free orders the pages of the checkpoints a chunk lets "
                "go of in the unified budget: it needs memory='unified' and "
                "release_recency=True"
            )
        if self.required_captures and self.memory != "unified":
            raise InvalidConfigError(
                "SimConfig.required_captures counts a chunk's checkpoints in the pages it "
                "needs from the unified budget: it needs memory='unified'"
            )
        if self.adopt_cached_blocks and self.keep_block_copies:
            raise InvalidConfigError(
                "SimConfig.adopt_cached_blocks swaps a recomputed block for the one cached "
                "copy, and keep_block_copies caches it as another copy: set one of them"
            )
        if self.allocate_after_lookups and self.memory != "split":
            raise InvalidConfigError(
                "SimConfig.allocate_after_lookups follows SGLang's KV pool, a pool of its own "
                "beside the Mamba states: it needs memory='split'"
            )
        if self.drop_leaf_kv and (self.memory != "split" or self.keep_block_copies):
            raise InvalidConfigError(
                "SimConfig.drop_leaf_kv follows SGLang's radix tree, which holds one copy "
                "of a prefix in a pool of its own: it needs memory='split' and "
                "keep_block_copies=False"
            )
        self._check_fits()

    def _check_running_states(self) -> None:
        """One running request's states and one checkpoint must fit the cache."""
        states = self.running_states
        if self.memory == "unified":
            pages, per_state = self.unified_pages(), self.unified_slot_pages()
            if pages < (states + 1) * per_state:
                raise InvalidConfigError(
                    f"SimConfig.running_states={states}: a unified budget of {pages} pages "
                    f"cannot hold one running request's {states} states and one checkpoint "
                    f"({per_state} pages each); raise cache_budget_bytes or lower "
                    "running_states"
                )
            return
        capacity = self.checkpoint_capacity()
        if capacity <= states:
            raise InvalidConfigError(
                f"SimConfig.running_states={states}: a checkpoint pool of {capacity} slots "
                f"cannot hold one running request's {states} states and one checkpoint; "
                "give the pool more slots or lower running_states"
            )

    def _check_fits(self) -> None:
        """Refuse a plan whose weights, live state and pools exceed one GPU's memory."""
        plan = self.memory_plan()
        if not plan["overcommit_bytes"]:
            return
        fits = self._smallest_tensor_parallel()
        parts = ", ".join(
            f"{part.removesuffix('_bytes').replace('_', ' ')} {plan[part] / GIB:.2f} GiB"
            for part in MEMORY_PARTS
        )
        gpus = self.tensor_parallel * self.pipeline_parallel
        where = (
            f"one {self.gpu} GPU"
            if gpus == 1
            else f"each of {gpus} {self.gpu} GPUs (tensor_parallel={self.tensor_parallel}, "
            f"pipeline_parallel={self.pipeline_parallel})"
        )
        advice = (
            f"tensor_parallel = {fits} fits"
            if fits is not None
            else "no tensor_parallel up to 8 fits this configuration"
        )
        kv_note = (
            f" (kv_blocks={self.kv_blocks} set explicitly)"
            if self.kv_blocks is not None
            else f" (at least one token_budget of pages: {self.token_budget} tokens)"
        )
        raise PlanDoesNotFitError(
            f"{self.model} does not fit {where}: {parts}{kv_note} need "
            f"{(plan['usable_bytes'] + plan['overcommit_bytes']) / GIB:.2f} GiB of the "
            f"{plan['usable_bytes'] / GIB:.2f} GiB usable ({GPU_MEMORY_UTILIZATION:.0%} of "
            f"{plan['gpu_bytes'] / GIB:.0f} GiB); {advice} ([deployment], docs/SIMULATION.md), "
            "or shrink the pools (cache.kv_blocks, cache.checkpoint_budget_bytes, "
            "engine.max_num_seqs)",
            plan,
            fits,
        )

    def _smallest_tensor_parallel(self) -> int | None:
        """The smallest ``tensor_parallel`` (1, 2, 4, 8; pipeline stages kept) that fits."""
        for tp in (1, 2, 4, 8):
            if tp <= self.tensor_parallel:
                continue
            try:
                trial = dataclasses.replace(self, tensor_parallel=tp)
            except PlanDoesNotFitError:
                continue
            except InvalidConfigError:  # tp does not divide the heads
                continue
            if not trial.memory_plan()["overcommit_bytes"]:
                return tp
        return None

    def sizes(self) -> ModelSizes:
        """The model priced: ``model_sizes``, else the preset ``model`` names, with the
        engine's ``ssm_state_dtype`` when one is set."""
        model = self.model_sizes if self.model_sizes is not None else get_model(self.model)
        if self.ssm_state_dtype is None or self.ssm_state_dtype == model.ssm_state_dtype:
            return model
        return dataclasses.replace(model, ssm_state_dtype=self.ssm_state_dtype)

    def deployment(self) -> Deployment:
        """The GPUs serving the model (:mod:`sim.engine.deployment`)."""
        return Deployment(
            tensor_parallel=self.tensor_parallel,
            pipeline_parallel=self.pipeline_parallel,
            allreduce_latency_s=self.allreduce_latency_s,
            link_efficiency=self.link_efficiency,
        )

    def _pool_sizes_set(self) -> list[str]:
        """The split pools' own sizes this configuration sets (field names)."""
        sizes = [
            name
            for name, value in (
                ("kv_blocks", self.kv_blocks),
                ("checkpoint_slots", self.checkpoint_slots),
            )
            if value is not None
        ]
        if self.checkpoint_budget_bytes != DEFAULT_CHECKPOINT_BUDGET_BYTES:
            sizes.append("checkpoint_budget_bytes")
        return sizes

    def _check_generated_state_grid(self) -> None:
        grid = self.generated_state_grid
        _check_int("SimConfig", "generated_state_grid", grid, 0, MAX_TOKEN_BUDGET)
        if not (self.cache_generated and self.generated_state):
            raise InvalidConfigError(
                f"SimConfig.generated_state_grid={grid} places the answer's state, which "
                "needs cache_generated=True and generated_state=True (set "
                "generated_state_grid=0 to cache no state of the answer)"
            )
        if self.backend != "shadow":
            raise InvalidConfigError(
                f"SimConfig.generated_state_grid={grid} captures a state the request "
                f"passed before it finished, which backend={self.backend!r} no longer "
                "holds then; use backend='shadow' or generated_state_grid=0"
            )

    def _check_share(self) -> None:
        share = self.checkpoint_share
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise InvalidConfigError(f"SimConfig.checkpoint_share must be a number, got {share!r}")
        if not 0 < share < 1:
            raise InvalidConfigError(
                f"SimConfig.checkpoint_share must lie strictly between 0 and 1, got {share}"
            )
        if self.memory != "split":
            raise InvalidConfigError(
                "SimConfig.checkpoint_share divides a budget between two pools: it needs "
                "memory='split' (unified memory shares one pool)"
            )
        sized = self._pool_sizes_set()
        if sized:
            raise InvalidConfigError(
                f"SimConfig.checkpoint_share sizes both pools from one budget, so "
                f"{', '.join(sized)} cannot be set with it"
            )
        if self.shared_budget_slots() < 1:
            raise InvalidConfigError(
                f"SimConfig.checkpoint_share={share} of {self.unified_budget_bytes()} bytes "
                f"does not hold one checkpoint slot ({self.checkpoint_slot_bytes()} bytes)"
            )

    def shared_budget_slots(self) -> int:
        """Split memory with ``checkpoint_share``: checkpoint slots of the share (by
        ``checkpoint_share_rule``)."""
        assert self.checkpoint_share is not None
        if self.checkpoint_share_rule in SGLANG_STATES_PER_RUNNING_REQUEST:
            # Both strategies size one pool; what running requests hold of it (extra_buffer:
            # their live state and two ping-pong track slots) is running_states.
            return self._sglang_states()
        share_bytes = int(self.unified_budget_bytes() * self.checkpoint_share)
        return min(MAX_CHECKPOINT_SLOTS, share_bytes // self.checkpoint_slot_bytes())

    def sglang_running_cap(self) -> int | None:
        """With an SGLang share rule, the running requests SGLang allows with its Mamba
        pool (``states // ratio``, :data:`SGLANG_STATES_PER_RUNNING_REQUEST`), else
        ``None``."""
        ratio = SGLANG_STATES_PER_RUNNING_REQUEST.get(self.checkpoint_share_rule)
        if ratio is None or self.checkpoint_share is None:
            return None
        return self._sglang_states() // ratio

    def _check_sglang_running(self) -> None:
        cap = self.sglang_running_cap()
        if cap is None:
            return
        ratio = SGLANG_STATES_PER_RUNNING_REQUEST[self.checkpoint_share_rule]
        states = self._sglang_states()
        if cap < 1:
            raise InvalidConfigError(
                f"SimConfig.checkpoint_share_rule={self.checkpoint_share_rule!r}: SGLang's "
                f"Mamba pool of {states} states cannot serve one request ({ratio} states "
                "each; it refuses to start: 'Hybrid (mamba/linear-attention) state cache is "
                "too small'); raise cache_budget_bytes or store the state in bfloat16 "
                "(ssm_state_dtype)"
            )
        if self.mode == "engine" and self.max_num_seqs > cap:
            raise InvalidConfigError(
                f"SimConfig.max_num_seqs={self.max_num_seqs} exceeds the {cap} running "
                f"requests SGLang allows with {states} Mamba states ({ratio} each: "
                "kv_cache_configurator.resolve_max_num_reqs caps it); set max_num_seqs <= "
                f"{cap}, or raise cache_budget_bytes"
            )

    def _sglang_states(self) -> int:
        """SGLang's Mamba pool size for the share: ``int((budget * share - R) // R)``."""
        assert self.checkpoint_share is not None
        state = max(self.costs().recurrent_bytes, 1)
        share = self.unified_budget_bytes() * self.checkpoint_share
        return max(0, min(MAX_CHECKPOINT_SLOTS, int((share - state) // state)))

    def shared_budget_kv_pages(self) -> int:
        """Split memory with ``checkpoint_share``: KV pages of the rest of the budget."""
        assert self.checkpoint_share is not None
        if self.checkpoint_share_rule in SGLANG_STATES_PER_RUNNING_REQUEST:
            used = (self._sglang_states() + 1) * self.costs().recurrent_bytes
            rest = max(0, self.unified_budget_bytes() - used)
            return min(MAX_KV_BLOCKS, rest // self.unified_page_bytes())
        share_bytes = int(self.unified_budget_bytes() * self.checkpoint_share)
        rest = self.unified_budget_bytes() - share_bytes
        return min(MAX_KV_BLOCKS, rest // self.unified_page_bytes())

    def _check_unified(self) -> None:
        split = self._pool_sizes_set()
        if split:
            raise InvalidConfigError(
                f"SimConfig.memory='unified' draws KV blocks and checkpoint slots from one "
                f"budget (cache_budget_bytes), so the split pool sizes {', '.join(split)} "
                "cannot be set with it"
            )
        if not self.costs().has_full_attention:
            raise InvalidConfigError(
                f"SimConfig.memory='unified' shares pages between KV blocks and checkpoints, "
                f"but {self.model} has no full-attention layer (no KV pages); use 'split'"
            )
        if self.unified_pages() < self.unified_slot_pages():
            raise InvalidConfigError(
                f"SimConfig.memory='unified': a budget of {self.unified_pages()} pages does "
                f"not hold one checkpoint slot ({self.unified_slot_pages()} pages)"
            )

    # --- derived values ----------------------------------------------------------------

    def unified_budget_bytes(self) -> int:
        """The unified budget: ``cache_budget_bytes``, else ``0.9 * gpu memory - weights
        - max_num_seqs * recurrent bytes`` (what split mode divides between its pools)."""
        if self.cache_budget_bytes is not None:
            return self.cache_budget_bytes
        costs = self.costs()
        usable = int(get_gpu(self.gpu).memory_bytes * GPU_MEMORY_UTILIZATION)
        return max(0, usable - costs.weight_bytes - self.live_state_bytes())

    def unified_page_bytes(self) -> int:
        """Bytes of one page: ``B`` tokens of every full-attention layer's KV (and draft KV)."""
        return self.block_size * max(self.costs().page_bytes_per_token, 1)

    def unified_slot_pages(self) -> int:
        """Pages one checkpoint slot occupies in the unified budget (rounded up): its
        recurrent axis and partial page, or only the recurrent axis when every checkpoint
        sits on a block boundary (:meth:`block_aligned_checkpoints`), as a vLLM
        align-mode state takes one padded page per Mamba group and no KV."""
        slot = self.checkpoint_slot_bytes()
        if self.block_aligned_checkpoints():
            slot = self.costs().recurrent_bytes
        return max(1, -(-slot // self.unified_page_bytes()))

    def block_aligned_checkpoints(self) -> bool:
        """Every checkpoint sits on a KV block boundary, so none carries a partial page:
        ``vllm-retention`` snaps each target to the hash unit (here a multiple of ``B``)
        and no answer state is captured at ``prompt + output - 1``."""
        generated = self.cache_generated and self.generated_state
        return (
            self.placement == "vllm-retention"
            and self.unit % self.block_size == 0
            and not generated
        )

    def unified_pages(self) -> int:
        """Pages of the unified budget the cache and running requests draw from: the
        budget's pages less ``reserved_pages`` (at least 0, at most :data:`MAX_KV_BLOCKS`)."""
        pages = self.unified_budget_bytes() // self.unified_page_bytes() - self.reserved_pages
        return max(0, min(MAX_KV_BLOCKS, pages))

    @property
    def unit(self) -> int:
        """The index's hash unit ``h`` in tokens."""
        return self.block_size if self.hash_unit is None else self.hash_unit

    @property
    def key_namespace(self) -> str:
        """Namespace of every checkpoint key."""
        return self.model if self.namespace is None else self.namespace

    def costs(self) -> CostModel:
        """The cost model of this configuration."""
        model = self.sizes()
        return CostModel(
            model,
            get_gpu(self.gpu),
            block_size=self.block_size,
            # Speculative decoding needs a draft head, and its checkpoints then carry the
            # paired draft page and the boundary hidden row (DESIGN §3). A pure SSM has no
            # attention geometry to size a draft head from; it is priced without one.
            with_draft=self.spec_tokens > 0 and model.num_key_value_heads > 0,
            mfu=self.mfu,
            mbu=self.mbu,
            copy_efficiency=self.copy_efficiency,
            step_overhead_s=self.step_overhead_s,
            copy_launch_s=self.copy_launch_s,
            deployment=self.deployment(),
        )

    def placement_arguments(self) -> dict[str, Any]:
        """Parameters passed to ``make_placement``: defaults, then ``placement_params``."""
        return {
            **default_placement_params(self.placement, self.block_size, self.unit),
            **self.placement_params,
        }

    def checkpoint_capacity(self) -> int:
        """Snapshot slots of the checkpoint pool: ``checkpoint_slots``, else as many as
        ``checkpoint_budget_bytes`` holds (at least one: checked when built)."""
        if self.checkpoint_slots is not None:
            return self.checkpoint_slots
        if self.memory == "unified":  # as many as the whole budget would hold
            return min(MAX_CHECKPOINT_SLOTS, self.unified_pages() // self.unified_slot_pages())
        if self.checkpoint_share is not None:
            return self.shared_budget_slots()
        return self._budget_slots()

    def _budget_slots(self) -> int:
        per_slot = self.checkpoint_slot_bytes()
        slots = self.checkpoint_budget_bytes // per_slot
        if slots < 1:
            raise InvalidConfigError(
                f"SimConfig.checkpoint_budget_bytes={self.checkpoint_budget_bytes} must hold "
                f"at least one checkpoint slot ({per_slot} bytes)"
            )
        if slots > MAX_CHECKPOINT_SLOTS:
            raise InvalidConfigError(
                f"SimConfig.checkpoint_budget_bytes={self.checkpoint_budget_bytes} holds "
                f"{slots} checkpoint slots of {per_slot} bytes; at most "
                f"{MAX_CHECKPOINT_SLOTS} are allowed"
            )
        return slots

    def checkpoint_slot_bytes(self) -> int:
        """Bytes one snapshot slot preallocates: the recurrent axis and a full partial page."""
        costs = self.costs()
        return costs.recurrent_bytes + self.block_size * costs.partial_bytes_per_token

    def kv_capacity(self) -> int:
        """KV pages of the pool.

        Default: ``0.9 * gpu memory - resident weights - max_num_seqs * recurrent bytes -
        checkpoint pool``, divided by the bytes of one page (with its paired draft page
        when the run serves a draft head); at least one ``token_budget``
        worth of pages (:meth:`memory_plan` then reports the overcommit), at most
        :data:`MAX_KV_BLOCKS` (a model without full-attention layers needs no KV bytes).
        """
        if self.kv_blocks is not None:
            return self.kv_blocks
        if self.memory == "unified":
            return self.unified_pages()
        if self.checkpoint_share is not None:
            minimum = -(-self.token_budget // self.block_size) + 1
            return max(minimum, self.shared_budget_kv_pages())
        costs = self.costs()
        fixed = self._fixed_memory_bytes()
        free = int(get_gpu(self.gpu).memory_bytes * GPU_MEMORY_UTILIZATION) - sum(fixed.values())
        page = self.block_size * max(costs.page_bytes_per_token, 1)
        minimum = -(-self.token_budget // self.block_size) + 1
        return min(MAX_KV_BLOCKS, max(minimum, free // page))

    def live_state_bytes(self) -> int:
        """The running requests' own recurrent states outside the cache:
        ``max_num_seqs * recurrent bytes``, or 0 with ``running_states``, which draws them
        from the checkpoint budget instead."""
        if self.running_states:
            return 0
        return self.max_num_seqs * self.costs().recurrent_bytes

    def _fixed_memory_bytes(self) -> dict[str, int]:
        costs = self.costs()
        return {
            "weights_bytes": costs.weight_bytes,
            "live_state_bytes": self.live_state_bytes(),
            "checkpoint_pool_bytes": 0
            if self.memory == "unified"  # its slots are pages of the KV pool
            else self.checkpoint_capacity() * self.checkpoint_slot_bytes(),
        }

    def memory_plan(self) -> dict[str, int]:
        """What the run keeps in one GPU's memory against what that GPU offers, bytes
        (with ``tensor_parallel`` or ``pipeline_parallel``, every GPU holds its share).

        ``usable_bytes`` is ``0.9 * memory_bytes`` (vLLM's default
        ``gpu_memory_utilization``); ``overcommit_bytes`` is how far weights, live
        recurrent state, the checkpoint pool and the KV pool exceed it (0 when they fit).
        A configuration whose plan overcommits is refused when built
        (:class:`~sim.engine.deployment.PlanDoesNotFitError`, which names the smallest
        ``tensor_parallel`` that fits), so a run's plan always has ``overcommit_bytes`` 0;
        result files written before that rule may carry a positive one.
        """
        costs = self.costs()
        gpu = get_gpu(self.gpu)
        plan = {
            "gpus": self.tensor_parallel * self.pipeline_parallel,
            "gpu_bytes": gpu.memory_bytes,
            "usable_bytes": int(gpu.memory_bytes * GPU_MEMORY_UTILIZATION),
            **self._fixed_memory_bytes(),
            "kv_pool_bytes": self.kv_capacity() * self.block_size * costs.page_bytes_per_token,
        }
        used = sum(plan[part] for part in MEMORY_PARTS)
        plan["overcommit_bytes"] = max(0, used - plan["usable_bytes"])
        return plan

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (every field, faults nested), plus ``placement_arguments``: the
        placement policy's parameters with the run's defaults filled in, as it ran."""
        data = dataclasses.asdict(self)
        data["placement_params"] = dict(self.placement_params)
        data["placement_arguments"] = {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in self.placement_arguments().items()
        }
        data["eviction_params"] = dict(self.eviction_params)
        if self.model_sizes is not None:
            data["model_sizes"] = describe_model(self.model_sizes)
        return data


def default_placement_params(name: str, block_size: int, hash_unit: int) -> dict[str, Any]:
    """Defaults for each placement policy in a run with block size ``B`` and unit ``h``.

    ``block-floor(block_size=B)``; ``interval(hash_unit=h, every=max(h, 4096 snapped to
    h))``; ``turns(hash_unit=h)``; ``branch(hash_unit=h)``; ``vllm-align(block_size=B,
    hash_unit=h, alignment=h)``; ``vllm-retention(hash_unit=h)``; ``chunk-end(hash_unit=1)``
    (the exact end of each chunk, as SGLang's page size 1); ``chunk-grid(grid=B,
    hash_unit=h)``.
    """
    if name == "chunk-end":
        return {"hash_unit": 1}
    if name == "chunk-grid":
        return {"grid": block_size, "hash_unit": hash_unit}
    if name == "vllm-retention":
        return {"hash_unit": hash_unit}
    if name == "block-floor":
        return {"block_size": block_size}
    if name == "interval":
        return {"hash_unit": hash_unit, "every": max(hash_unit, 4096 // hash_unit * hash_unit)}
    if name in ("turns", "branch"):
        return {"hash_unit": hash_unit}
    if name == "vllm-align":
        return {"block_size": block_size, "hash_unit": hash_unit, "alignment": hash_unit}
    return {}
