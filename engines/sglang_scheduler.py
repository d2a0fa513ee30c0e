"""SGLang 0.5.23's own scheduler loop, driven step by step on given arrivals (an oracle).

:mod:`engines.sglang_replay` serves one request at a time through SGLang's
``UnifiedRadixCache``; under load what decides the hits is also who runs in each step, who
waits and who is retracted. This module runs SGLang's real scheduling methods over the
same pools (:class:`~engines.sglang_replay.SglangCacheReplay`: ``HybridReqToTokenPool``,
``TokenToKVPoolAllocator``, ``UnifiedRadixCache``, ``no_buffer``) as SGLang's
``Scheduler.event_loop_normal`` runs them (the loop SGLang runs with ``no_buffer``, which
turns the overlap scheduler off), without a model:

1. before step ``k`` the requests arriving before it are added, in the given order, by
   SGLang's ``Scheduler.init_req_max_new_tokens`` and ``_add_request_to_queue``; a
   prompt of ``max_req_input_len`` tokens or more (``min(context_len, KV tokens) - 6``,
   ``TpModelWorker``) is refused instead, as ``validate_input_length`` refuses it;
2. ``Scheduler.get_next_batch_to_run`` plans the step: merging the last prefill batch into
   the running batch, ``get_new_batch_prefill`` (``PrefillAdder``: admission, chunking, the
   reservation by the new-token ratio; ``ScheduleBatch.prepare_for_extend``) and, when it
   finds nothing, ``update_running_batch`` (``check_decode_mem``, ``retract_decode``, the
   ratio's decay; ``prepare_for_decode``);
3. the step's result is a ``GenerationBatchResult`` whose ``next_token_ids`` are, for each
   request of the batch, the next token of its known answer, processed by SGLang's
   ``SchedulerBatchResultProcessor.process_batch_result_prefill`` /
   ``process_batch_result_decode`` (``update_finish_state`` ends it at
   ``max_new_tokens`` = its answer's length; ``release_kv_cache`` / ``checkpoint_kv_cache``
   put it into the tree);
4. a step with no batch runs ``Scheduler.on_idle`` (which resets the new-token ratio when
   nothing is left, and runs SGLang's own pool and tree invariant checks); when nothing is
   unfinished the loop skips to the next arrival.

What stands in (a stand-in scheduler holds the fields those methods read, and any other
field read raises :class:`StandInError` naming it): the model config (a text model, no
reasoning tokens), the model worker (no forward pass: the batch's output is the answer),
data parallelism, LoRA, grammars, HiCache, speculative decoding, disaggregation,
priorities and beams (all off, as SGLang's defaults), metrics, load publishing and output
streaming (recorders that do nothing). ``max_running_requests`` and the request-row pool
are given (hyckpt's preset's ``engine.max_num_seqs``, which is SGLang's
``resolve_max_num_reqs`` cap by the Mamba pool on the checked traffic).
"""

from __future__ import annotations

import types
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines import sglang_replay
from engines.replay_common import ReplayRequest


class StandInError(AttributeError):
    """SGLang's scheduler read a field the stand-in does not hold."""


class Ignored:
    """Metrics, load publishing and output streaming: every attribute, call and sum is
    itself, falsy (so ``if reporter.enable_metrics`` skips), and nothing is recorded (a
    ``MagicMock`` would keep every call of a long run)."""

    def __getattr__(self, name: str) -> Ignored:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args: object, **kwargs: object) -> Ignored:
        return self

    def __bool__(self) -> bool:
        return False

    def __add__(self, other: object) -> Ignored:
        return self

    __radd__ = __sub__ = __mod__ = __mul__ = __add__

    def __iter__(self) -> Any:
        return iter(())

    def __enter__(self) -> Ignored:
        return self

    def __exit__(self, *args: object) -> None:
        return None


@dataclass
class ScheduledRun:
    """What SGLang's scheduler did.

    Attributes:
        steps: step number (1-based) -> request id -> tokens scheduled in it (a prefill
            chunk's length, or 1 for a decode).
        hits: request id -> its prefix-cache hit when first scheduled (tokens).
        retractions: request id -> times retracted.
        retracted_steps: the steps that retracted a request, in order.
        aborted: requests SGLang aborted (``retract_decode``'s ``reqs_to_abort``).
        refused: requests refused on arrival, their prompt at least ``max_req_input_len``
            (``validate_input_length``).
    """

    steps: dict[int, dict[str, int]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    retractions: dict[str, int] = field(default_factory=dict)
    retracted_steps: list[int] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def _stand_in_class() -> type:
    from sglang.srt.managers.scheduler import Scheduler

    class StandInScheduler(Scheduler):  # type: ignore[misc]
        """SGLang's ``Scheduler`` without ``__init__``: the fields are set one by one."""

        def __getattr__(self, name: str) -> Any:
            raise StandInError(
                f"SGLang's scheduler read {name!r}, which the stand-in scheduler of "
                "engines.sglang_scheduler does not hold: add it to _build_scheduler"
            )

    return StandInScheduler


class SglangSchedulerReplay:
    """SGLang's scheduler for ``model`` in ``budget_bytes`` (module docstring).

    Args:
        model: the hybrid model.
        budget_bytes: memory for the KV cache and the Mamba pool (SGLang's rest memory).
        chunk_size: ``chunked_prefill_size``.
        max_running_requests: the running-request cap (and request rows).
        max_context_len: the longest request (``context_len``; prompts shorter).
        tree_core: SGLang's tree core, ``"rust"`` (its default) or ``"python"``; ``None``:
            SGLang's default.
    """

    def __init__(
        self,
        model: sglang_replay.HybridModel,
        budget_bytes: int,
        chunk_size: int,
        max_running_requests: int,
        max_context_len: int,
        tree_core: str | None = None,
    ) -> None:
        self.plan = sglang_replay.plan_pools(model, budget_bytes)
        self._cache = sglang_replay.SglangCacheReplay(
            model,
            self.plan,
            chunk_size=chunk_size,
            max_context_len=max_context_len,
            rows=max_running_requests,
            tree_core=tree_core,
        )
        self.scheduler = _build_scheduler(
            self._cache, self.plan, max_running_requests, max_context_len
        )
        self._recording: ScheduledRun | None = None
        self._step = 0
        # TpModelWorker: max_req_len = min(context_len - 1, KV tokens - 1), prompts shorter
        # than max_req_len - 5 (managers/tp_worker.py).
        self.max_req_input_len = min(max_context_len, self.plan.max_total_num_tokens) - 1 - 5
        self.scheduler._add_request_to_queue = self._queued
        self.scheduler.send_abort_output = self._aborted

    def run(
        self,
        requests: Sequence[ReplayRequest],
        arrival_step: Mapping[str, int],
        max_steps: int = 1_000_000,
    ) -> ScheduledRun:
        """Serve ``requests`` (in arrival order), each added before step
        ``arrival_step[request_id]``; an idle scheduler skips to the next arrival.

        Raises:
            RuntimeError: more than ``max_steps`` steps (a stalled loop).
        """
        import torch
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.sampling.sampling_params import SamplingParams

        s, result = self.scheduler, ScheduledRun()
        self._recording = result
        answers: dict[str, list[int]] = {}
        pending = list(requests)
        step = next_arrival = 0
        while next_arrival < len(pending) or not self._finished():
            step += 1
            if step > max_steps:
                raise RuntimeError(
                    f"SGLang's scheduler has not finished {len(requests)} requests in "
                    f"{max_steps} steps: waiting {len(s.waiting_queue)}, running "
                    f"{s.running_batch.batch_size()}"
                )
            if self._finished():
                step = max(step, arrival_step[pending[next_arrival].request_id])
            self._step = step
            while (
                next_arrival < len(pending)
                and arrival_step[pending[next_arrival].request_id] <= step
            ):
                item = pending[next_arrival]
                next_arrival += 1
                if len(item.prompt_token_ids) >= self.max_req_input_len:
                    result.refused.append(item.request_id)  # validate_input_length
                    continue
                answers[item.request_id] = list(item.output_token_ids)
                sampling = SamplingParams(temperature=0, max_new_tokens=len(item.output_token_ids))
                sampling.normalize(None)
                req = Req(
                    rid=item.request_id,
                    origin_input_text="",
                    origin_input_ids=array("q", item.prompt_token_ids),
                    sampling_params=sampling,
                )
                s.init_req_max_new_tokens(req)
                s._add_request_to_queue(req)
            plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
            s.running_batch = plan.running_batch
            batch = plan.batch_to_run
            if batch is None:
                s.on_idle()
            else:
                self._record(batch, step, result)
                tokens = [
                    answers[req.rid][len(req.output_ids)]
                    if len(req.output_ids) < len(answers[req.rid])
                    else 0
                    for req in batch.reqs
                ]
                output = GenerationBatchResult(next_token_ids=torch.tensor(tokens))
                s.forward_ct += 1
                processor = s.batch_result_processor
                if batch.forward_mode.is_decode():
                    processor.process_batch_result_decode(batch, output)
                else:
                    processor.process_batch_result_prefill(batch, output)
                s.tree_cache.flush_pending_backups()
            s.last_batch = batch
        return result

    def _finished(self) -> bool:
        s = self.scheduler
        return (
            not s.waiting_queue
            and s.running_batch.is_empty()
            and s.chunked_req is None
            and (s.last_batch is None or s.last_batch.is_empty())
        )

    @staticmethod
    def _record(batch: Any, step: int, result: ScheduledRun) -> None:
        if batch.forward_mode.is_decode():
            result.steps[step] = {req.rid: 1 for req in batch.reqs}
            return
        result.steps[step] = {
            req.rid: int(n) for req, n in zip(batch.reqs, batch.extend_lens, strict=True)
        }
        for req, prefix in zip(batch.reqs, batch.prefix_lens, strict=True):
            result.hits.setdefault(req.rid, int(prefix))

    def _queued(self, req: Any, is_retracted: bool = False) -> None:
        """``Scheduler._add_request_to_queue``, counting retractions."""
        from sglang.srt.managers.scheduler import Scheduler

        if is_retracted and self._recording is not None:
            run = self._recording
            run.retractions[req.rid] = run.retractions.get(req.rid, 0) + 1
            if not run.retracted_steps or run.retracted_steps[-1] != self._step:
                run.retracted_steps.append(self._step)
        Scheduler._add_request_to_queue(self.scheduler, req, is_retracted=is_retracted)

    def _aborted(self, output: Any, req: Any) -> None:
        if self._recording is not None:
            self._recording.aborted.append(req.rid)


def _build_scheduler(
    cache: sglang_replay.SglangCacheReplay,
    plan: sglang_replay.PoolPlan,
    max_running_requests: int,
    max_context_len: int,
) -> Any:
    """A stand-in ``Scheduler`` over ``cache``'s pools (module docstring)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )
    from sglang.srt.managers.scheduler_components.logprob_result_processor import (
        SchedulerLogprobResultProcessor,
    )
    from sglang.srt.runtime_context import get_context, get_parallel, get_schedule
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    s = _stand_in_class().__new__(_stand_in_class())
    s.tree_cache = cache.tree_cache
    s.req_to_token_pool = cache.req_to_token_pool
    s.token_to_kv_pool_allocator = cache.allocator
    s.model_config = types.SimpleNamespace(
        is_encoder_decoder=False,
        is_multimodal=False,
        vocab_size=1 << 20,
        hf_config=None,
        context_len=max_context_len,
        self_opened_think_start_ids=None,
        think_end_ids=None,
    )
    s.page_size = 1
    s.device = "cpu"
    s.max_total_num_tokens = plan.max_total_num_tokens
    s.max_running_requests = max_running_requests
    s.max_req_len = min(max_context_len, plan.max_total_num_tokens) - 1
    s.max_new_tokens_limit = None
    s.kv_shard_widening = 1
    s.sliding_window_size = None
    s.max_queued_requests = None
    s.processed_tokens_counter = 0
    s.forward_ct = 0
    s.schedule_policy = get_schedule().schedule_policy
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.disaggregation_mode = DisaggregationMode.NULL
    s.init_running_status()
    # Scheduler.init_chunked_prefill, for a text model.
    s.chunked_prefill_size = get_schedule().chunked_prefill_size
    s.prefill_decode_interval = get_schedule().prefill_decode_interval or 0
    s._prefill_decode_interval_remaining = 0
    s.prefill_decode_interval_min_bs = get_schedule().prefill_decode_interval_min_bs
    s.chunked_req = None
    s._pending_chunked_abort_req = None
    s.is_mixed_chunk = bool(s.chunked_prefill_size) and get_schedule().enable_mixed_chunk
    s.max_prefill_tokens = get_schedule().max_prefill_tokens
    s.priority_scheduling_preemption_threshold = (
        get_schedule().priority_scheduling_preemption_threshold
    )
    for name in (
        "enable_hierarchical_cache",
        "enable_priority_scheduling",
        "schedule_low_priority_values_first",
        "abort_on_priority_when_disabled",
        "enable_hicache_storage",
        "enable_lmcache",
        "enable_overlap",
        "enable_hisparse",
        "enable_lora",
        "require_mlp_sync",
        "is_hybrid_swa",
        "enable_unified_cache_external_linker",
        "enable_fpm",
        "enable_unified_memory",
    ):
        setattr(s, name, False)
    s.init_schedule_policy()
    # Scheduler.init_model_worker sets this from max_running_requests (no pipeline).
    if not get_parallel().pp_max_micro_batch_size:
        get_context().override(
            "scheduler.pp_max_micro_batch_size_default",
            pp_max_micro_batch_size=max(max_running_requests, 1),
        )
    for name in (
        "decode_offload_manager",
        "dllm_config",
        "hisparse_coordinator",
        "lora_drainer",
        "min_free_slots_delayer",
        "dynamic_chunk_sizer",
        "future_map",
        "truncation_align_size",
        "rust_server",
    ):
        setattr(s, name, None)

    def unchanged(batch: Any, *args: Any, **kwargs: Any) -> Any:
        return batch

    s.dp_attn_adapter = types.SimpleNamespace(
        maybe_prepare_mlp_sync_batch=unchanged,
        maybe_convert_decode_to_extend=unchanged,
        drop_sync_wait_carry=lambda: None,
    )
    s.ngram_embedding_manager = types.SimpleNamespace(prepare_for_forward=unchanged)
    s.grammar_manager = types.SimpleNamespace(has_waiting_grammars=lambda: False, grammar_queue=[])
    s.dllm_manager = types.SimpleNamespace(any_staging_reqs=lambda: False)
    s.beam_coordinator = types.SimpleNamespace(
        pending_member_rows=lambda batch: 0, retire_group=lambda req: None
    )
    s.tp_worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(attn_backend=object(), prefill_aware_swa=False)
    )
    s.maybe_sleep_on_idle = lambda: None
    s._last_stall_publish_ts = 0.0
    for name in (
        "metrics_reporter",
        "load_publisher",
        "load_inquirer",
        "kv_events_publisher",
        "scheduler_stage_metrics",
        "ipc_channels",
        "load_snapshot_writer",
    ):
        setattr(s, name, Ignored())
    # SGLang's own pool and tree checks, run by on_idle.
    s.is_hybrid_ssm = True
    s.full_tokens_per_layer = plan.max_total_num_tokens
    s.swa_tokens_per_layer = None
    s.init_pool_stats_observer()
    s.init_invariant_checker()
    s.batch_result_processor = SchedulerBatchResultProcessor(
        is_generation=True,
        disaggregation_mode=s.disaggregation_mode,
        enable_overlap=False,
        enable_overlap_mlx=False,
        model_config=s.model_config,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        tree_cache=s.tree_cache,
        hisparse_coordinator=None,
        req_to_token_pool=s.req_to_token_pool,
        decode_offload_manager=None,
        metrics_collector=None,
        metrics_reporter=s.metrics_reporter,
        draft_worker=None,
        model_worker=None,
        logprob_result_processor=SchedulerLogprobResultProcessor(model_config=s.model_config),
        output_streamer=Ignored(),
        beam_coordinator=s.beam_coordinator,
        abort_request=None,
    )
    return s


__all__ = ["ScheduledRun", "SglangSchedulerReplay", "StandInError"]
