"""vLLM 0.33's own scheduler, driven step by step on given arrivals (a fidelity oracle).

:mod:`engines.vllm_replay` serves one request at a time through vLLM's
``KVCacheManager``; under load what decides the hits is also who runs in each step, who
waits and who is preempted. This module builds vLLM's real
:class:`vllm.v1.core.sched.scheduler.Scheduler` over the same manager configuration (the
specs, block sizes and pool of :class:`~engines.vllm_replay.VllmCacheReplay`) and runs its
loop without a model:

1. before step ``k`` the requests arriving before it are added (``Scheduler.add_request``)
   in the given order;
2. ``Scheduler.schedule()`` plans the step (vLLM's own admission, chunking,
   ``_mamba_block_aligned_split``, preemption and ``allocate_slots``);
3. ``Scheduler.update_from_output()`` takes a ``ModelRunnerOutput`` that samples, for each
   scheduled request whose computed tokens reach its known tokens, the next token of its
   known answer (``check_stop`` ends it at ``max_tokens``), and nothing for a partial
   prefill chunk.

What stands in: the model config (a namespace with the fields the scheduler reads: no
multimodal inputs, no M-RoPE, a generating runner, no tokenizer), the structured-output
manager is vLLM's own with no grammar. Scheduling is synchronous (``vllm serve
--no-async-scheduling``) or, with ``async_scheduling``, vLLM's default: its
``AsyncScheduler`` with each step's output processed after the next step is scheduled,
as ``EngineCore.step_with_batch_queue`` does with two batches in flight.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.replay_common import ReplayRequest
from engines.vllm_replay import HybridModel, VllmCacheReplay


@dataclass
class ScheduledRun:
    """What vLLM's scheduler did.

    Attributes:
        steps: step number (1-based) -> request id -> tokens scheduled in it.
        hits: request id -> computed tokens when first scheduled (its prefix-cache hit).
        preemptions: request id -> times preempted.
        preempted_steps: the steps that preempted a request, in order.
    """

    steps: dict[int, dict[str, int]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    preempted_steps: list[int] = field(default_factory=list)


class VllmSchedulerReplay:
    """vLLM's ``Scheduler`` for ``model`` in ``budget_bytes`` (module docstring).

    Args:
        model: the hybrid model.
        budget_bytes: memory for the KV cache.
        token_budget: ``max_num_batched_tokens``.
        max_num_seqs: ``max_num_seqs``.
        max_model_len: longest request (prompt + output).
        async_scheduling: vLLM's ``AsyncScheduler`` driven as ``EngineCore``'s batch
            queue drives it (``vllm serve``'s default): step ``k + 1`` is scheduled before
            step ``k``'s output is processed; ``False``: synchronous.
    """

    def __init__(
        self,
        model: HybridModel,
        budget_bytes: int,
        token_budget: int,
        max_num_seqs: int,
        max_model_len: int,
        async_scheduling: bool = False,
    ) -> None:
        from vllm.config import DeviceConfig, VllmConfig
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        self._cache = VllmCacheReplay(model, budget_bytes, token_budget, max_model_len)
        self.plan = self._cache.plan
        cache_config = self._cache._split_self.cache_config
        cache_config.num_gpu_blocks = self._cache.kv_cache_config.num_blocks
        vllm_config = VllmConfig(cache_config=cache_config, device_config=DeviceConfig("cpu"))
        # The fields Scheduler.__init__ and StructuredOutputManager read of a text model.
        model_config = types.SimpleNamespace(
            uses_mrope=False,
            is_encoder_decoder=False,
            max_model_len=max_model_len,
            runner_type="generate",
            is_diffusion=False,
            supports_multimodal_inputs=False,
            return_sampling_mask=False,
            multimodal_config=None,
            skip_tokenizer_init=True,
        )
        object.__setattr__(vllm_config, "model_config", model_config)
        scheduler_config = vllm_config.scheduler_config
        scheduler_config.max_num_batched_tokens = token_budget
        scheduler_config.max_num_seqs = max_num_seqs
        # As on CUDA (VllmConfig turns it off on this CPU machine).
        scheduler_config.disable_hybrid_kv_cache_manager = False
        scheduler_config.async_scheduling = async_scheduling
        self.async_scheduling = async_scheduling
        self.scheduler = (AsyncScheduler if async_scheduling else Scheduler)(
            vllm_config,
            self._cache.kv_cache_config,
            StructuredOutputManager(vllm_config),
            block_size=self.plan.scheduler_block_size,
            hash_block_size=self.plan.hash_block_size,
        )

    def run(
        self, requests: Sequence[ReplayRequest], arrival_step: Mapping[str, int]
    ) -> ScheduledRun:
        """Serve ``requests`` (in arrival order), each added before step
        ``arrival_step[request_id]``; an idle scheduler skips to the next arrival."""
        from vllm.v1.outputs import ModelRunnerOutput

        scheduler, result = self.scheduler, ScheduledRun()
        answers = {}
        in_flight: tuple[Any, Any] | None = None
        pending = list(requests)
        step = next_arrival = 0
        while (
            next_arrival < len(pending)
            or scheduler.has_unfinished_requests()
            or in_flight is not None
        ):
            step += 1
            if not scheduler.has_unfinished_requests() and next_arrival < len(pending):
                step = max(step, arrival_step[pending[next_arrival].request_id])
            while (
                next_arrival < len(pending)
                and arrival_step[pending[next_arrival].request_id] <= step
            ):
                item = pending[next_arrival]
                answers[item.request_id] = iter(item.output_token_ids)
                scheduler.add_request(self._cache._make_request(item))
                next_arrival += 1
            output = scheduler.schedule()
            if output.preempted_req_ids:
                result.preempted_steps.append(step)
            for new in output.scheduled_new_reqs:
                result.hits.setdefault(new.req_id, new.num_computed_tokens)
            scheduled = dict(output.num_scheduled_tokens)
            result.steps[step] = scheduled
            ids = list(scheduled)
            sampled = []
            for request_id in ids:
                # A step that reaches the end of the known tokens samples the next one
                # (a finished request scheduled once more under async scheduling samples
                # a token vLLM discards).
                last = not scheduler.requests[request_id].is_prefill_chunk
                sampled.append([next(answers[request_id], 0)] if last else [])
            model_output = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={rid: i for i, rid in enumerate(ids)},
                sampled_token_ids=sampled,
            )
            # EngineCore.step_with_batch_queue: with async scheduling the previous step's
            # output is processed after this step was scheduled.
            if self.async_scheduling:
                if in_flight is not None:
                    self._update(*in_flight, result)
                in_flight = (output, model_output) if ids else None
            else:
                self._update(output, model_output, result)
        return result

    def _update(self, output: Any, model_output: Any, result: ScheduledRun) -> None:
        self.scheduler.update_from_output(output, model_output)
        for request_id in output.preempted_req_ids or ():
            result.preemptions[request_id] = result.preemptions.get(request_id, 0) + 1


__all__ = ["ScheduledRun", "VllmSchedulerReplay"]
