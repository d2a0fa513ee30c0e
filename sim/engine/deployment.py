"""Multi-GPU deployments: what one GPU of a tensor- and pipeline-parallel engine holds.

A deployment of ``tp × pp`` GPUs splits the model two ways (as vLLM and SGLang do):

- **tensor parallelism** (``tp``) splits every layer by heads: each GPU holds ``1/tp`` of
  the attention query heads, of the KV heads (a GPU keeps one whole KV head when there are
  fewer KV heads than GPUs: vLLM replicates them), of the Mamba heads and channels (B/C
  groups split when ``tp`` divides them, else each GPU keeps ``ceil(G / tp)``), of the
  gated-DeltaNet heads, and of every weight matrix;
- **pipeline parallelism** (``pp``) splits the layers into ``pp`` stages; each GPU holds one
  stage. Stages are taken as equal: a GPU holds ``ceil(n / pp)`` layers of each kind
  ``n`` (the largest stage, so what fits it fits every stage).

:func:`shard_model` returns one GPU's share as a :class:`~reference.sizes.ModelSizes`, so
every size (KV bytes per token, recurrent bytes, snapshot slots) is the per-GPU figure by
the same functions that size a whole model. Memory budgets are per GPU, as
``gpu_memory_utilization`` is.

**Time of a step** (see :mod:`sim.engine.costs`)::

    step_s = pp * stage_s + tp_sync_s + pp_transfer_s + step_overhead_s

``stage_s`` is the roofline time of one stage on one GPU (its FLOPs and bytes are the
shard's); the stages of one step run one after another (no micro-batch overlap is modelled,
which understates a pipeline's throughput under load, never its latency). Each sublayer
(a mixer or an FFN, :func:`sync_points`) ends with an all-reduce of the step's activations
``a = tokens * hidden_size * activation bytes`` over ``tp`` GPUs (ring all-reduce)::

    tp_sync_s = sync_points * (allreduce_latency_s + 2 * (tp - 1) / tp * a / link)

and each of the ``pp - 1`` stage boundaries sends ``a`` once: ``pp_transfer_s = (pp - 1) *
(allreduce_latency_s + a / link)``, ``link = link_bytes_per_s * link_efficiency`` (NVLink,
one direction). A copy (capture or restore) moves the shard's bytes on every GPU at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from reference.errors import InvalidConfigError
from reference.sizes import ModelSizes, element_bytes

#: Largest tensor- or pipeline-parallel size.
MAX_PARALLEL = 64


class PlanDoesNotFitError(InvalidConfigError):
    """The weights, live state and pools of a configuration exceed one GPU's memory.

    Attributes:
        plan: the memory plan (:meth:`sim.engine.config.SimConfig.memory_plan`), bytes.
        fits: the smallest tensor-parallel size that would fit, or ``None``.
    """

    def __init__(self, message: str, plan: dict[str, int], fits: int | None) -> None:
        super().__init__(message)
        self.plan, self.fits = plan, fits


@dataclass(frozen=True)
class Deployment:
    """How many GPUs serve one engine, and how fast they talk.

    Attributes:
        tensor_parallel: GPUs each layer is split over by heads (``tp``).
        pipeline_parallel: stages the layers are split into (``pp``).
        allreduce_latency_s: fixed seconds of one all-reduce or stage transfer.
        link_efficiency: achieved fraction of the GPU's NVLink bandwidth.
    """

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    allreduce_latency_s: float = 10e-6
    link_efficiency: float = 0.8

    def __post_init__(self) -> None:
        for name in ("tensor_parallel", "pipeline_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidConfigError(f"{name} must be an integer, got {value!r}")
            if not 1 <= value <= MAX_PARALLEL:
                raise InvalidConfigError(f"{name} must be in [1, {MAX_PARALLEL}], got {value}")
        if not isinstance(self.allreduce_latency_s, int | float) or not (
            0 <= self.allreduce_latency_s <= 1
        ):
            raise InvalidConfigError(
                f"allreduce_latency_s must be in [0, 1] s, got {self.allreduce_latency_s!r}"
            )
        if not isinstance(self.link_efficiency, int | float) or not 0 < self.link_efficiency <= 1:
            raise InvalidConfigError(
                f"link_efficiency must be in (0, 1], got {self.link_efficiency!r}"
            )

    @property
    def gpus(self) -> int:
        """GPUs of the deployment: ``tp * pp``."""
        return self.tensor_parallel * self.pipeline_parallel


def _split(m: ModelSizes, field: str, tp: int) -> int:
    value: int = getattr(m, field)
    if value % tp:
        raise InvalidConfigError(
            f"tensor_parallel={tp} must divide {m.name}'s {field} ({value}): tensor "
            "parallelism splits every layer by heads"
        )
    return value // tp


def _kv_heads(m: ModelSizes, tp: int) -> int:
    heads = m.num_key_value_heads
    if heads >= tp:
        return _split(m, "num_key_value_heads", tp)
    if tp % heads:
        raise InvalidConfigError(
            f"tensor_parallel={tp} must be a multiple of {m.name}'s num_key_value_heads "
            f"({heads}) to replicate them (vLLM keeps one KV head per GPU then)"
        )
    return 1


def shard_model(m: ModelSizes, tensor_parallel: int, pipeline_parallel: int = 1) -> ModelSizes:
    """What one GPU of a ``tp × pp`` deployment holds of ``m`` (see the module docstring).

    Raises:
        InvalidConfigError: ``tp`` does not divide a head count it must split (the message
            names the field).
    """
    tp, pp = tensor_parallel, pipeline_parallel
    if tp == 1 and pp == 1:
        return m
    changes: dict[str, object] = {"name": f"{m.name} (one GPU of tp={tp}, pp={pp})"}
    if tp > 1:
        if m.mamba1_layers or m.mamba2_layers:
            changes["mamba_d_inner"] = _split(m, "mamba_d_inner", tp)
        if m.mamba2_layers:
            changes["mamba_num_heads"] = _split(m, "mamba_num_heads", tp)
            groups = m.mamba_n_groups
            changes["mamba_n_groups"] = groups // tp if groups % tp == 0 else -(-groups // tp)
        if m.gdn_layers:
            changes["linear_num_key_heads"] = _split(m, "linear_num_key_heads", tp)
            changes["linear_num_value_heads"] = _split(m, "linear_num_value_heads", tp)
        if m.num_attention_heads:
            changes["num_attention_heads"] = _split(m, "num_attention_heads", tp)
        if m.num_key_value_heads:
            changes["num_key_value_heads"] = _kv_heads(m, tp)
    if pp > 1:
        if pp > m.num_hidden_layers:
            raise InvalidConfigError(
                f"pipeline_parallel={pp} exceeds {m.name}'s {m.num_hidden_layers} layers"
            )
        kinds = (
            "mamba1_layers",
            "mamba2_layers",
            "gdn_layers",
            "full_attention_layers",
            "sliding_window_layers",
            "mlp_only_layers",
        )
        stage = {kind: -(-getattr(m, kind) // pp) for kind in kinds}
        changes.update(stage)
        if m.parallel_hybrid:
            changes["num_hidden_layers"] = -(-m.num_hidden_layers // pp)
        else:
            changes["num_hidden_layers"] = sum(stage.values())
        changes["ffn_layers"] = min(-(-m.ffn_layers // pp), changes["num_hidden_layers"])  # type: ignore[call-overload]
        changes["moe_layers"] = min(-(-m.moe_layers // pp), changes["ffn_layers"])  # type: ignore[call-overload]
    gpus = tp * pp
    changes["total_params"] = -(-m.total_params // gpus)
    changes["active_params"] = min(-(-m.active_params // gpus), changes["total_params"])  # type: ignore[call-overload]
    changes["weight_bytes"] = -(-m.weight_bytes // gpus)
    return dataclasses.replace(m, **changes)  # type: ignore[arg-type]


def sync_points(m: ModelSizes) -> int:
    """Sublayers of one forward pass that end in a tensor-parallel all-reduce: each mixer
    (a parallel hybrid's two mixers of a layer are summed first: one) and each FFN."""
    attention = m.full_attention_layers + m.sliding_window_layers
    mixers = m.num_hidden_layers if m.parallel_hybrid else m.recurrent_total + attention
    return mixers + m.ffn_layers


def activation_bytes(m: ModelSizes, tokens: int) -> int:
    """Bytes of one step's activations between sublayers: ``tokens * hidden_size`` rows."""
    return tokens * m.hidden_size * element_bytes(m.dtype)
