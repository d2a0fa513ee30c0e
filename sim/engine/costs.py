"""The cost model: how long a step, a capture and a restore take on a modeled GPU.

Everything is derived from a real model's published configuration
(:mod:`reference.sizes`: active parameters, KV bytes per token, recurrent bytes per
sequence) and a GPU's peak dense BF16 FLOP/s and HBM bandwidth (:data:`GPU_PRESETS`).
Units are in the names: ``*_s`` seconds, ``*_bytes`` bytes, ``*_flops`` floating-point
operations (a multiply-add counts 2), tokens are tokens.

**Compute stream.** One engine step runs the whole batch as one forward pass::

    step_s = max(flops / (peak_flops * mfu * tp), pp * bytes / (hbm_bytes_per_s * mbu))
             + step_overhead_s + sync_s(tokens)

On one GPU (``tp = pp = 1``, the default) ``sync_s`` is 0. A deployment of ``tp × pp``
GPUs (:mod:`sim.engine.deployment`, which states the all-reduce formula of ``sync_s``)
shares each stage's FLOPs among ``tp`` GPUs and runs its ``pp`` stages one after another;
``bytes`` are then one GPU's: its share of the weights, KV and recurrent state.

- ``flops``: prefill chunk ``[s, e)`` costs ``prefill_flops(e) - prefill_flops(s)`` (token
  ``t`` attends to ``t`` keys, :func:`reference.sizes.prefill_flops`); a decode step of a
  sequence holding ``c`` tokens that verifies ``q`` tokens (1 + speculative) costs
  ``q * flops_per_token(c + 1)``;
- ``bytes``: the weights the step's ``T`` tokens use are read once per step
  (:func:`reference.sizes.step_weight_bytes`: all of a dense model's weights; for a MoE
  model its shared weights and the experts at least one token picked, in expectation
  under uniform routing, so one token reads ``active_params`` and a large batch nearly
  every expert); each
  scheduled sequence reads and writes its recurrent state once (``2 * recurrent_bytes``);
  a prefill chunk ``[s, e)`` reads ``s`` and writes ``e - s`` tokens of paged KV
  (``e * kv_bytes_per_token``); a decode step reads ``c`` and writes ``q`` tokens of KV.

**Copy stream.** A device-to-device copy of ``b`` bytes reads and writes them once::

    copy_s = copy_launch_s + 2 * b / (hbm_bytes_per_s * copy_efficiency)

A capture at ``p`` copies the recurrent axis (``recurrent_bytes``, plus the boundary
hidden row with a draft head) and, when ``p mod B != 0``, the ``p mod B`` valid rows of
the partial page (``(p mod B) * kv_bytes_per_token``, draft page included). A restore
copies the same bytes back. The copies of one step form one job on the copy stream; a job
takes the sum of its copies' times.

The efficiencies (``mfu``, ``mbu``, ``copy_efficiency``) and the overheads are
assumptions, not measurements; they are parameters of :class:`CostModel`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from reference.errors import InvalidConfigError
from reference.sizes import (
    ModelSizes,
    boundary_hidden_bytes,
    draft_kv_bytes_per_token,
    get_model,
    kv_bytes_per_token,
    recurrent_bytes_per_sequence,
    resident_weight_bytes,
    step_weight_bytes,
)
from sim.engine.deployment import Deployment, activation_bytes, shard_model, sync_points

TERA = 10**12
"""FLOP/s or bytes/s in a tera (decimal, as datasheets count)."""
GIGA = 10**9
"""Bytes/s in a giga (decimal)."""
GIB = 2**30
"""Bytes in a GiB. Datasheets write HBM capacity as "GB", but HBM capacities are binary
(an H100's 80 GB are five 16 GiB stacks) and a device reports close to the datasheet
figure read as GiB (the 0.9 memory utilisation absorbs the rest); read as decimal GB
they would be ~7 % short."""


@dataclass(frozen=True)
class GpuSpec:
    """Peak numbers of one GPU (one device, no sparsity).

    Attributes:
        name: preset name (``h200``).
        peak_flops: dense BF16 tensor-core peak, FLOP/s.
        hbm_bytes_per_s: HBM bandwidth, bytes/s.
        memory_bytes: HBM capacity, bytes (the datasheet's "GB" read as GiB, see :data:`GIB`).
        link_bytes_per_s: NVLink bandwidth of one GPU in one direction, bytes/s (half the
            datasheet's bidirectional total), for tensor-parallel all-reduces.
        source: where the numbers come from.
    """

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    memory_bytes: int
    link_bytes_per_s: float
    source: str


GPU_PRESETS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec(
            name="h200",
            peak_flops=989.5 * TERA,
            hbm_bytes_per_s=4.8 * TERA,
            memory_bytes=141 * GIB,
            link_bytes_per_s=450 * GIGA,
            source=(
                "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with "
                "sparsity (989.5 dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s"
            ),
        ),
        GpuSpec(
            name="h100",
            peak_flops=989.5 * TERA,
            hbm_bytes_per_s=3.35 * TERA,
            memory_bytes=80 * GIB,
            link_bytes_per_s=450 * GIGA,
            source=(
                "NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with "
                "sparsity (989.5 dense), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s"
            ),
        ),
        GpuSpec(
            name="a100",
            peak_flops=312 * TERA,
            hbm_bytes_per_s=2.039 * TERA,
            memory_bytes=80 * GIB,
            link_bytes_per_s=300 * GIGA,
            source=(
                "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS dense, "
                "80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s"
            ),
        ),
        GpuSpec(
            name="b200",
            peak_flops=2250 * TERA,
            hbm_bytes_per_s=8.0 * TERA,
            memory_bytes=180 * GIB,
            link_bytes_per_s=900 * GIGA,
            source=(
                "NVIDIA HGX B200 specifications, per GPU: FP16/BF16 4.5 PFLOPS with "
                "sparsity (2.25 dense), 180 GB HBM3e at 8 TB/s, NVLink 1.8 TB/s"
            ),
        ),
    )
}
"""GPU presets by name; the default is ``h200``."""


def get_gpu(name: str) -> GpuSpec:
    """The preset called ``name``.

    Raises:
        InvalidConfigError: unknown name (the message lists the presets).
    """
    spec = GPU_PRESETS.get(name)
    if spec is None:
        close = difflib.get_close_matches(str(name), list(GPU_PRESETS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidConfigError(
            f"unknown GPU preset {name!r}{hint} (known: {', '.join(GPU_PRESETS)})"
        )
    return spec


@dataclass(frozen=True)
class CostModel:
    """Durations of steps and copies for ``model`` on ``gpu`` (see the module docstring).

    Attributes:
        model: the real model whose sizes and FLOPs are priced.
        gpu: the device.
        block_size: tokens per KV page ``B``.
        with_draft: a draft head is served (its page rides on the partial-KV axis and the
            boundary hidden row on the recurrent axis).
        mfu: fraction of ``peak_flops`` a step achieves (0 < mfu <= 1).
        mbu: fraction of the HBM bandwidth a step achieves (0 < mbu <= 1).
        copy_efficiency: fraction of the HBM bandwidth a copy achieves.
        step_overhead_s: fixed cost of a step (scheduling, launches), seconds.
        copy_launch_s: fixed cost of one copy, seconds.
        deployment: the GPUs serving the model (:mod:`sim.engine.deployment`). FLOPs are
            the whole model's; every byte figure (KV per token, recurrent bytes, weights,
            checkpoint bytes) is one GPU's share, as memory is planned per GPU.
    """

    model: ModelSizes
    gpu: GpuSpec
    block_size: int = 16
    with_draft: bool = False
    mfu: float = 0.5
    mbu: float = 0.8
    copy_efficiency: float = 0.8
    step_overhead_s: float = 0.0005
    copy_launch_s: float = 0.000005
    deployment: Deployment = field(default_factory=Deployment)

    def __post_init__(self) -> None:
        for name in ("mfu", "mbu", "copy_efficiency"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value <= 1:
                raise InvalidConfigError(f"cost model {name} must be in (0, 1], got {value!r}")
        for name in ("step_overhead_s", "copy_launch_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise InvalidConfigError(f"cost model {name} must be >= 0 s, got {value!r}")
        m = self.model
        plan = self.deployment
        tp, pp = plan.tensor_parallel, plan.pipeline_parallel
        share = shard_model(m, tp, pp)  # what one GPU holds: every byte figure below
        per_key = 4 * m.num_attention_heads * m.head_dim
        kv = kv_bytes_per_token(share)
        draft_kv = draft_kv_bytes_per_token(share) if self.with_draft else 0
        # The boundary row is the whole hidden row on every GPU (activations are
        # replicated across tensor-parallel ranks).
        hidden = boundary_hidden_bytes(share) if self.with_draft else 0
        link = self.gpu.link_bytes_per_s * plan.link_efficiency
        derived = {
            "gpu_share": share,
            "dense_flops": 2 * m.active_params,
            "full_key_flops": per_key * m.full_attention_layers,
            "swa_key_flops": per_key * m.sliding_window_layers,
            "window": m.sliding_window,
            "kv_bytes_per_token": kv,
            "partial_bytes_per_token": kv + draft_kv,
            "page_bytes_per_token": kv + draft_kv,
            "recurrent_bytes": recurrent_bytes_per_sequence(share) + hidden,
            "weight_bytes": resident_weight_bytes(share),
            # tp GPUs share each stage's FLOPs; the pp stages run one after another, each
            # moving one GPU's bytes (the stages are taken as equal: the largest).
            "flops_per_s": self.gpu.peak_flops * self.mfu * tp,
            "bytes_per_s": self.gpu.hbm_bytes_per_s * self.mbu / pp,
            "_copy_rate": self.gpu.hbm_bytes_per_s * self.copy_efficiency / 2,
            "_sync_points": sync_points(m) if tp > 1 else 0,
            "_activation_bytes_per_token": activation_bytes(m, 1),
            "_allreduce_s_per_byte": 2 * (tp - 1) / tp / link,
            "_transfer_s_per_byte": (pp - 1) / link,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    # Derived values, set in __post_init__.
    dense_flops: int = field(init=False, repr=False, compare=False, default=0)
    """FLOPs per token of the weights: ``2 * active_params``."""
    full_key_flops: int = field(init=False, repr=False, compare=False, default=0)
    """FLOPs per attended key over all full-attention layers (``4 * heads * head_dim`` each)."""
    swa_key_flops: int = field(init=False, repr=False, compare=False, default=0)
    """FLOPs per attended key over all sliding-window layers."""
    window: int = field(init=False, repr=False, compare=False, default=0)
    """Sliding window ``W`` in tokens (0 without sliding-window layers)."""
    kv_bytes_per_token: int = field(init=False, compare=False, default=0)
    """Paged KV bytes per token of the full-attention layers."""
    partial_bytes_per_token: int = field(init=False, compare=False, default=0)
    """Bytes per valid row of a partial-KV checkpoint (base page plus draft page)."""
    page_bytes_per_token: int = field(init=False, compare=False, default=0)
    """Bytes per token of the live KV pool: each base page and, with a draft head, the
    draft page paired with it (the draft head keeps KV for every cached token too)."""
    recurrent_bytes: int = field(init=False, compare=False, default=0)
    """Bytes of one recurrent-axis checkpoint (plus the boundary row with a draft head)."""
    weight_bytes: int = field(init=False, compare=False, default=0)
    """Bytes the weights occupy in GPU memory (:func:`reference.sizes.resident_weight_bytes`)."""
    gpu_share: ModelSizes | None = field(init=False, repr=False, compare=False, default=None)
    """What one GPU holds of the model (:func:`sim.engine.deployment.shard_model`)."""
    _weight_reads: dict[int, float] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _syncs: dict[int, float] = field(init=False, repr=False, compare=False, default_factory=dict)
    _sync_points: int = field(init=False, repr=False, compare=False, default=0)
    _activation_bytes_per_token: int = field(init=False, repr=False, compare=False, default=0)
    _allreduce_s_per_byte: float = field(init=False, repr=False, compare=False, default=0.0)
    _transfer_s_per_byte: float = field(init=False, repr=False, compare=False, default=0.0)
    flops_per_s: float = field(init=False, repr=False, compare=False, default=1.0)
    """Achieved FLOP/s of a step: ``peak_flops * mfu * tensor_parallel``."""
    bytes_per_s: float = field(init=False, repr=False, compare=False, default=1.0)
    """Achieved HBM bytes/s of a step's per-GPU bytes: ``hbm_bytes_per_s * mbu /
    pipeline_parallel`` (each stage moves its own bytes, one stage after another)."""
    _copy_rate: float = field(init=False, repr=False, compare=False, default=1.0)

    @classmethod
    def for_names(cls, model: str, gpu: str, **params: object) -> CostModel:
        """``CostModel(get_model(model), get_gpu(gpu), **params)``."""
        return cls(get_model(model), get_gpu(gpu), **params)  # type: ignore[arg-type]

    @property
    def has_full_attention(self) -> bool:
        """Whether the model pages KV (a hit then needs its full blocks present)."""
        return self.kv_bytes_per_token > 0

    # --- FLOPs -----------------------------------------------------------------------

    def prefill_flops(self, tokens: int) -> int:
        """FLOPs to prefill ``tokens`` tokens from scratch; equals
        :func:`reference.sizes.prefill_flops`."""
        full_keys = tokens * (tokens + 1) // 2
        w = self.window
        swa_keys = full_keys if tokens <= w else w * (w + 1) // 2 + (tokens - w) * w
        return (
            self.dense_flops * tokens
            + self.full_key_flops * full_keys
            + self.swa_key_flops * swa_keys
        )

    def chunk_flops(self, start: int, end: int) -> int:
        """FLOPs of prefill chunk ``[start, end)`` (tokens)."""
        return self.prefill_flops(end) - self.prefill_flops(start)

    def decode_flops(self, context: int, tokens: int) -> int:
        """FLOPs of verifying ``tokens`` tokens after ``context`` cached tokens:
        ``tokens * flops_per_token(context + 1)``."""
        keys = context + 1
        return tokens * (
            self.dense_flops
            + self.full_key_flops * keys
            + self.swa_key_flops * min(keys, self.window)
        )

    # --- bytes -----------------------------------------------------------------------

    def chunk_bytes(self, end: int) -> int:
        """HBM bytes of a prefill chunk ending at ``end`` beyond the weights: its KV and
        the recurrent state read and written once."""
        return end * self.kv_bytes_per_token + 2 * self.recurrent_bytes

    def decode_bytes(self, context: int, tokens: int) -> int:
        """HBM bytes of one sequence's decode step beyond the weights."""
        return (context + tokens) * self.kv_bytes_per_token + 2 * self.recurrent_bytes

    def checkpoint_bytes(self, position: int) -> int:
        """Bytes one capture (or restore) at ``position`` copies."""
        rows = position % self.block_size
        return self.recurrent_bytes + rows * self.partial_bytes_per_token

    # --- durations -------------------------------------------------------------------

    def weight_read_bytes(self, tokens: int) -> float:
        """Bytes of weights a step over ``tokens`` tokens reads (expected, for MoE)."""
        found = self._weight_reads.get(tokens)
        if found is None:
            share = self.gpu_share if self.gpu_share is not None else self.model
            found = self._weight_reads[tokens] = step_weight_bytes(share, max(tokens, 1))
        return found

    def sync_s(self, tokens: int) -> float:
        """Seconds a step over ``tokens`` tokens spends in communication between GPUs: the
        tensor-parallel all-reduce after each sublayer and the pipeline's stage-to-stage
        transfers (:mod:`sim.engine.deployment`); 0 on one GPU."""
        found = self._syncs.get(tokens)
        if found is None:
            plan = self.deployment
            payload = tokens * self._activation_bytes_per_token
            found = self._sync_points * (
                plan.allreduce_latency_s + payload * self._allreduce_s_per_byte
            )
            if plan.pipeline_parallel > 1:
                found += (plan.pipeline_parallel - 1) * plan.allreduce_latency_s
                found += payload * self._transfer_s_per_byte
            self._syncs[tokens] = found
        return found

    def step_s(self, flops: float, bytes_moved: float, *, tokens: int) -> float:
        """Duration of a step over ``tokens`` tokens with ``flops`` FLOPs and
        ``bytes_moved`` bytes besides the weights, seconds."""
        compute = flops / self.flops_per_s
        memory = (bytes_moved + self.weight_read_bytes(tokens)) / self.bytes_per_s
        busy = compute if compute > memory else memory
        return busy + self.step_overhead_s + self.sync_s(tokens)

    def copy_s(self, bytes_copied: int, copies: int = 1) -> float:
        """Duration of ``copies`` copies totalling ``bytes_copied`` bytes, seconds."""
        return copies * self.copy_launch_s + bytes_copied / self._copy_rate

    def describe(self) -> dict[str, object]:
        """The parameters and derived per-unit costs, JSON-ready."""
        return {
            "model": self.model.name,
            "gpu": self.gpu.name,
            "gpu_peak_flops": self.gpu.peak_flops,
            "gpu_hbm_bytes_per_s": self.gpu.hbm_bytes_per_s,
            "block_size": self.block_size,
            "with_draft": self.with_draft,
            "mfu": self.mfu,
            "mbu": self.mbu,
            "copy_efficiency": self.copy_efficiency,
            "step_overhead_s": self.step_overhead_s,
            "copy_launch_s": self.copy_launch_s,
            "weight_bytes": self.weight_bytes,
            "weight_read_bytes_one_token": self.weight_read_bytes(1),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "recurrent_bytes": self.recurrent_bytes,
            "partial_bytes_per_token": self.partial_bytes_per_token,
            "page_bytes_per_token": self.page_bytes_per_token,
            "tensor_parallel": self.deployment.tensor_parallel,
            "pipeline_parallel": self.deployment.pipeline_parallel,
            "allreduce_latency_s": self.deployment.allreduce_latency_s,
            "link_efficiency": self.deployment.link_efficiency,
            "gpu_link_bytes_per_s": self.gpu.link_bytes_per_s,
            "sync_s_one_token": self.sync_s(1),
        }
