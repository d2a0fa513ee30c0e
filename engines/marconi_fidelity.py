"""Marconi's own simulator against hyckpt's ``marconi`` preset, on the same traffic.

hyckpt's ``[cache] engine = "marconi"`` (docs/SIMULATION.md, "Engine presets";
``sim/engine/presets.py``, ``reference/eviction.py`` ``MarconiPolicy``,
``sim/engine/alpha_tuning.py``) was written by reading the Marconi repository (Pan et al.,
MLSys'25). This command *runs* that repository's simulator and the preset's cache-only
replay over one trace, at one model and byte capacity, and prints both token hit rates per
budget with a per-request comparison. Nothing of Marconi is copied here: it is imported
from ``--marconi-repo`` (tested at commit 0801661)::

    git clone https://github.com/ruipeterpan/marconi /tmp/marconi
    .venv/bin/python -m engines.marconi_fidelity --marconi-repo /tmp/marconi \\
        --requests 600 --budget-gib 2 5 10 [--seeds 1 2 3] [--diagnose]

The project's venv runs both sides: what ``radix_cache_hybrid`` imports at module level
and never calls here (``scipy.stats.rankdata``, ``transformers.AutoTokenizer``,
``AutoModelForCausalLM``) is stubbed when not installed.

1. **Traffic.** The ``engine-presets`` scenario's workload (``multi_turn_chat``, its
   seed, ``--requests``) is written as a Marconi JSONL trace with the fields
   ``utils/generate_trace.py`` (``generate_lmsys_trace``) writes: integer ``session_id``,
   ``turn_id``, ``ts``, ``num_input_tokens``, ``num_output_tokens``, ``input_tokens``,
   ``output_tokens`` (needed: Marconi inserts ``input + output``). hyckpt replays *that
   file* (``[workload] trace``, ``trace_format = "marconi"``, the reader of ``hyckpt
   replay --trace FILE --trace-format marconi``), checked to give back the generator's
   prompts and answers token for token.
2. **Model.** By default Marconi's, NVIDIA's Attention-Mamba2 hybrid 7B as
   ``policy_exploration.py`` configures it (24 SSM, 4 attention, 28 MLP layers, ``d =
   4096``, ``n = 128``), given to hyckpt as a model file with ``utils.get_mamba_state_size``
   and ``utils.get_kvs_size``'s bytes and the prefill FLOPs of ``get_mamba1_flops`` +
   ``get_attn_flops`` + ``get_mlp_flops``, exactly (checked). ``--model nemotron-h-8b``:
   the scenario's model; Marconi gets its state and KV bytes by replacing those two size
   functions in ``radix_cache_hybrid`` and keeps its own FLOPs.
3. **Marconi.** ``policy_exploration.run_trace_with_config`` itself, compiled from the
   file's syntax tree (importing the module runs the paper's sweeps): per request
   ``RadixCache.match_prefix(input)`` then ``insert(input + output)``, with
   ``evict_policy_version = 2`` (``evict_v2``, alpha tuned once by
   ``config_tuner.ConfigTuner.tune_config`` after 5 × the requests seen at the first
   eviction) or, with ``--alpha``, 3 (the same eviction, alpha fixed). Hit rate: what
   ``RadixCache.get_cache_stats`` computes; per request: ``RadixCache.request_history``.
   ``--marconi-tuner serial`` (default) runs the tuner's grid in order in this process
   (``config_tuner.ProcessPoolExecutor`` and ``as_completed`` replaced), so ties go to the
   first alpha as in hyckpt; ``pool`` runs its process pool as shipped.
4. **hyckpt.** The scenario with ``engine = "marconi"`` and ``cache_budget_bytes``,
   replayed by :class:`sim.engine.replay.Replayer` (``hyckpt replay``); a request's hit
   is the tokens it restored.

``--diagnose`` adds per budget the runs that take the differences apart: alpha fixed to
0 on both sides (eviction alone, no tuning) and at Marconi's tuned alpha; hyckpt with
``block_size = 1`` (token-level, like Marconi's tree); hyckpt's policy scoring with
``evict_v2``'s efficiency (:func:`evict_v2_efficiency`), freeing an evicted leaf
checkpoint's KV past its parent as ``_delete_leaf`` frees a leaf's KV, and both (patches
of this run's objects, not hyckpt semantics); Marconi with exact byte accounting
(:func:`_exact_bytes_class`). Since this check the preset itself frees a leaf's KV
(``free_leaf_kv``) and prices entries with their prefix's KV
(``prefix_kv_bytes_per_token``), so the "leaf frees KV tail" variant now equals "as
shipped"; the ``evict_v2`` variant differs from it by Marconi's own MLP-FLOPs slip.
Results: docs/SIMULATION.md, "Checked against Marconi's simulator".
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import json
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from reference import eviction as eviction_module
from reference.sizes import get_model, kv_bytes_per_token, recurrent_bytes_per_sequence
from sim.engine.backends import make_backend
from sim.engine.hits import block_digests
from sim.engine.replay import Replayer
from sim.scenarios import SCENARIO_DIR, load_scenario

GIB = 1 << 30
#: The scenario whose traffic, engine mode and preset are compared.
SCENARIO = SCENARIO_DIR / "engine-presets.toml"
#: Marconi's model (``policy_exploration.py``, "NVIDIA's Attention-Mamba2 Hybrid 7B").
MARCONI_7B = {"num_ssm_layers": 24, "num_attn_layers": 4, "num_mlp_layers": 28, "d": 4096, "n": 128}
#: nemotron-h-8b's layer counts and widths in Marconi's terms (24 MLP-only layers).
NEMOTRON_H_8B = dict(MARCONI_7B, num_mlp_layers=24)

#: Marconi's model as a hyckpt model file. Mamba2 with ``d_inner = 8192``, ``N = 64``,
#: ``G = 2``, ``d_conv = 5`` has Marconi's ``2dn + 8(2d + 2n)`` = 1,116,160 bytes per layer
#: (state ``H·P·N·2`` = 1,048,576, conv ``(d_inner + 2GN)(d_conv - 1)·2`` = 67,584); 32 KV
#: heads of 128 give ``4d`` = 16,384 KV bytes per layer and token. 64 query heads make
#: hyckpt's causal attention FLOPs (``4·H·hd`` per key) equal Marconi's ``4·L²·d`` per
#: layer, and ``2N`` = 13,087,145,984 its linear FLOPs per token, less the ``4·H·hd·L``
#: per token the causal sum adds.
MARCONI_7B_TOML = """\
[model]
name = "marconi-7b"
hidden_size = 4096
vocab_size = 32000
hybrid_override_pattern = "M-M-M-M-M-M*-M-M-M-M-M-M*-M-M-M-M-M-M*-M-M-M-M-M-M*-----"
mamba_num_heads = 128
mamba_head_dim = 64
ssm_state_size = 64
n_groups = 2
conv_kernel = 5
num_attention_heads = 64
num_key_value_heads = 32
attention_head_dim = 128
intermediate_size = 16384
mlp_gated = false
total_params = 6543572992
active_params = 6543572992
"""


# --- 1. Marconi, imported from its repository ----------------------------------------------


#: Marconi's modules (``radix``, ``tuner``, ``utils``), ``run``
#: (``run_trace_with_config``), its globals ``namespace``, and ``stubbed``.
Marconi = types.SimpleNamespace


#: What ``radix_cache_hybrid`` and ``radix_cache_vllm`` import and this path never calls.
UNUSED_IMPORTS = {
    "scipy.stats": ("rankdata",),
    "transformers": ("AutoTokenizer", "AutoModelForCausalLM"),
}


def _stub_unused_imports() -> list[str]:
    """Stub :data:`UNUSED_IMPORTS` that are not installed; return their names."""
    stubbed = []
    for name, attributes in UNUSED_IMPORTS.items():
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            continue
        module = types.ModuleType(name)
        for attribute in attributes:
            setattr(module, attribute, None)
        sys.modules[name] = module
        if "." in name:
            parent, _, child = name.partition(".")
            sys.modules[parent] = types.ModuleType(parent)
            setattr(sys.modules[parent], child, module)
        stubbed.append(name)
    return stubbed


def load_marconi(repo: Path) -> Marconi:
    """Import Marconi from ``repo`` and lift ``load_request_trace`` and
    ``run_trace_with_config`` out of ``policy_exploration.py`` (whose module body runs the
    paper's sweeps, so it is not imported: the two functions are compiled from its syntax
    tree into a namespace holding what they use)."""
    if not (repo / "radix_cache_hybrid.py").is_file():
        raise SystemExit(f"marconi_fidelity: {repo} has no radix_cache_hybrid.py (clone it first)")
    stubbed = _stub_unused_imports()
    sys.path.insert(0, str(repo))
    radix = importlib.import_module("radix_cache_hybrid")
    vllm_radix = importlib.import_module("radix_cache_vllm")
    tuner = importlib.import_module("config_tuner")
    utils = importlib.import_module("utils")
    if Path(utils.__file__ or "").parent != repo:
        raise SystemExit(f"marconi_fidelity: `utils` is {utils.__file__}, not Marconi's")
    source = (repo / "policy_exploration.py").read_text()
    wanted = {"load_request_trace", "run_trace_with_config"}
    body = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name in wanted
    ]
    if {node.name for node in body} != wanted:
        raise SystemExit(f"marconi_fidelity: policy_exploration.py lacks one of {sorted(wanted)}")
    namespace: dict[str, Any] = {
        "__name__": "policy_exploration",
        "RadixCache": radix.RadixCache,
        "RadixCacheVLLM": vllm_radix.RadixCache,
        "TRACE_DIR": ".",
    }
    exec("import io, os, gc, json, statistics", namespace)
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, str(repo / "policy_exploration.py"), "exec"), namespace)
    run = namespace["run_trace_with_config"]
    return Marconi(
        radix=radix, tuner=tuner, utils=utils, run=run, namespace=namespace, stubbed=stubbed
    )


class _SerialExecutor(concurrent.futures.Executor):
    """``ProcessPoolExecutor(max_workers=...)`` running each call at ``submit``: the tuner's
    grid runs in order, in this process."""

    def __init__(self, max_workers: int | None = None) -> None:
        pass

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:
            future.set_exception(error)
        return future


@contextlib.contextmanager
def _patched(owner: object, **values: Any) -> Iterator[None]:
    """Set attributes of ``owner`` for the duration of the block."""
    saved = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


def _exact_bytes_class(radix_cache: type) -> type:
    """A ``RadixCache`` whose ``evict_v2`` frees exactly what ``evict`` asked for: it calls
    Marconi's ``evict_v2`` for one node at a time (``bytes_to_remove = 1``: the loop stops
    after one eviction, candidates rescored each time as in the loop) until
    ``get_tree_size`` is down by ``bytes_to_remove``. Marconi's own loop adds a deleted
    leaf's KV with ``len(node.value)`` of the last scored candidate, so the tree can end
    above its capacity (diagnostic only)."""

    def evict_v2(self: Any, bytes_to_remove: float) -> None:
        target = self.get_tree_size() - bytes_to_remove
        while self.get_tree_size() > target and self.num_nodes > 0:
            radix_cache.evict_v2(self, 1)

    cls = type("ExactBytesRadixCache", (radix_cache,), {"evict_v2": evict_v2})
    cls.__module__, cls.__qualname__ = __name__, "ExactBytesRadixCache"
    globals()["ExactBytesRadixCache"] = cls  # so the tuner's pickled copies resolve it
    return cls


@dataclasses.dataclass
class Side:
    """One simulator's answer on one trace: tokens each request skipped (trace order),
    input tokens, the alpha in force at the end (``None``: hyckpt never tuned), requests
    looked up at the first eviction, the tuning window, whether tuning ran, and the wall
    seconds of the run (the simulator's own work: reading the trace file left out; hyckpt
    hashes every prompt from scratch)."""

    hits: list[int]
    prompt_tokens: int
    alpha: float | None
    seen_before_eviction: int | None
    window: int | None
    tuned: bool
    wall_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        return sum(self.hits) / self.prompt_tokens


def run_marconi(
    marconi: Marconi,
    trace: TraceFile,
    budget_bytes: int,
    model: dict[str, int],
    *,
    alpha: float | None = None,
    exact_bytes: bool = False,
    tuner: str = "serial",
    sizes: tuple[int, int] | None = None,
) -> Side:
    """Marconi's ``run_trace_with_config`` on ``trace`` (``evict_policy_version`` 2, or 3
    with ``eff_weight = alpha``), stdout captured. ``sizes`` = (state bytes per SSM layer,
    KV bytes per attention layer and token) replaces ``get_mamba_state_size`` and
    ``get_kvs_size`` in ``radix_cache_hybrid``."""
    radix = marconi.radix
    patches: dict[str, Any] = {}
    if sizes is not None:
        state, kv = sizes
        patches = {
            "get_mamba_state_size": lambda d, n, *a: state,
            "get_kvs_size": lambda tokens, d: tokens * kv,
        }
    tree_class = _exact_bytes_class(radix.RadixCache) if exact_bytes else radix.RadixCache
    tuner_patches: dict[str, Any] = {}
    if tuner == "serial":
        tuner_patches = {"ProcessPoolExecutor": _SerialExecutor, "as_completed": list}
    marconi.namespace.update(TRACE_DIR=str(trace.path.parent), RadixCache=tree_class)
    load_trace = marconi.namespace["load_request_trace"]
    loading: list[float] = []

    def timed_load(path: str) -> Any:
        started = time.perf_counter()
        try:
            return load_trace(path)
        finally:
            loading.append(time.perf_counter() - started)

    with (
        mock.patch.dict(marconi.namespace, load_request_trace=timed_load),
        _patched(radix, **patches),
        _patched(marconi.tuner, **tuner_patches),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        started = time.perf_counter()
        result = marconi.run(
            trace_name=trace.name,
            num_sessions=trace.sessions,
            capacity_bytes=budget_bytes,
            evict_policy_version=2 if alpha is None else 3,
            eff_weight=0.0 if alpha is None else alpha,
            sessions_per_second=trace.sessions_per_second,
            avg_response_time=None,
            bootstrap_multiplier=5,
            **model,
        )
        wall = time.perf_counter() - started - sum(loading)  # its trace read left out
    tree = result[2]
    history = tree.request_history
    window = tree.bootstrap_window_size
    return Side(
        hits=[skipped for _, _, skipped in history],
        prompt_tokens=sum(total for _, total, _ in history),
        alpha=float(tree.eff_weight),
        seen_before_eviction=tree.num_reqs_before_eviction,
        window=window,
        tuned=alpha is None and window is not None and len(history) >= window,
        wall_s=wall,
    )


# --- 2. the traffic, as a Marconi trace -----------------------------------------------------


@dataclasses.dataclass
class TraceFile:
    """A Marconi JSONL trace named as ``run_trace_with_config`` looks it up:
    ``<TRACE_DIR>/<name>_sps=<sessions_per_second>_nums=<sessions>.jsonl``."""

    path: Path
    name: str
    sessions: int
    sessions_per_second: float
    requests: int


def write_trace(requests: list[Any], folder: Path, name: str, rate: float) -> TraceFile:
    """Write hyckpt requests as Marconi trace lines (``utils/generate_trace.py``'s fields;
    ``session_id`` an integer, in order of first arrival)."""
    sessions: dict[str, int] = {}
    for request in requests:
        sessions.setdefault(request.session_id, len(sessions))
    path = folder / f"{name}_sps={rate}_nums={len(sessions)}.jsonl"
    with path.open("w") as out:
        for request in requests:
            if request.answer is None:
                raise SystemExit("marconi_fidelity: a request without its answer tokens")
            inputs = list(request.prompt.tokens())
            answer = request.answer.tokens()
            outputs = list(answer[len(inputs) :])
            line = {
                "session_id": sessions[request.session_id],
                "turn_id": request.turn,
                "ts": request.arrival_s,
                "num_input_tokens": len(inputs),
                "num_output_tokens": len(outputs),
                "input_tokens": inputs,
                "output_tokens": outputs,
            }
            out.write(json.dumps(line) + "\n")
    return TraceFile(path, name, len(sessions), rate, len(requests))


def check_round_trip(generated: list[Any], replayed: list[Any]) -> None:
    """The trace must give hyckpt the generator's requests back, token for token: the
    reader draws ids of its own (a token trie of segments), so the check is that one
    bijection maps every generated id to the replayed one at every position of every
    prompt and answer; and the same arrival order, gaps and output lengths."""
    if len(generated) != len(replayed):
        raise SystemExit(f"trace round trip: {len(generated)} requests in, {len(replayed)} out")
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    start = generated[0].arrival_s if generated else 0.0
    for before, after in zip(generated, replayed, strict=True):
        ids = before.answer.tokens(), after.answer.tokens()
        same = (
            len(before.prompt) == len(after.prompt)
            and len(ids[0]) == len(ids[1])
            and abs(before.arrival_s - start - after.arrival_s) < 1e-6
            and before.output_tokens == after.output_tokens
        )
        for a, b in zip(*ids, strict=True):
            if forward.setdefault(a, b) != b or backward.setdefault(b, a) != a:
                same = False
                break
        if not same:
            raise SystemExit(f"trace round trip: {before.request_id} differs after the file")


# --- 3. hyckpt's side ---------------------------------------------------------------------


class _RecordingReplayer(Replayer):
    """The cache-only replay, recording each request's hit (restored tokens)."""

    hits: list[int]

    def _serve(self, seq: Any) -> None:
        before = self.metrics.hit_tokens
        super()._serve(seq)
        self.hits.append(self.metrics.hit_tokens - before)


def run_hyckpt(
    scenario: Any, requests: list[Any], seed: int, overrides: dict[str, Any], alpha: float | None
) -> Side:
    """The scenario's replay of ``requests`` with ``overrides`` (dotted keys); ``alpha``
    fixed (tuning off) or ``None`` (the preset tunes it)."""
    config = dataclasses.replace(
        scenario.with_overrides(overrides, check_sweep=False).sim_config, seed=seed
    )
    _drop_prompt_caches(requests)  # every run hashes from scratch, as the first did
    started = time.perf_counter()
    replayer = _RecordingReplayer(config, iter(requests), make_backend("shadow"))
    replayer.hits = []
    replayer.run()
    wall = time.perf_counter() - started
    tuner = replayer.alpha_tuner
    summary = tuner.summary() if tuner is not None else {}
    tuned: Any = summary.get("alpha")
    alpha = float(tuned) if alpha is None and tuned is not None else alpha
    seen: Any = summary.get("requests_before_first_eviction")
    window: Any = summary.get("window_requests")
    hits = replayer.hits
    return Side(hits, replayer.metrics.prompt_tokens, alpha, seen, window, tuned is not None, wall)


def _drop_prompt_caches(requests: list[Any]) -> None:
    """Forget the tokens and digests cached on every prompt and answer of ``requests`` and
    on their ancestors (a replay caches them on the prompt objects it is given)."""
    seen: set[int] = set()
    for request in requests:
        for prompt in (request.prompt, request.answer):
            while prompt is not None and id(prompt) not in seen:
                seen.add(id(prompt))
                prompt.drop_caches()
                prompt = prompt.parent


def _drop_cached_block(pool: Any, block: int) -> None:
    """Evict one free cached block of a ``SharedKVPool`` (as its ``_evict_cached_block``
    does for the head of the LRU queue)."""
    del pool._cached_free[block]
    pool._freed_at.pop(block, None)
    pool._unregister(block)
    pool._unregistered_free.append(block)
    pool.evictions["lru"] += 1


class _TailKvMarconiPolicy(eviction_module.MarconiPolicy):
    """Diagnostic: hyckpt's ``marconi`` policy, but evicting a checkpoint that is a leaf of
    the prefix forest also frees the free cached KV blocks of its prompt past its parent
    checkpoint, as Marconi's ``_delete_leaf`` frees a leaf's KV with its state."""

    engine: Any = None
    current: Any = None
    free_tail: bool = True
    #: ``(tokens, parent's tokens) -> efficiency`` replacing hyckpt's (``None``: keep it).
    node_efficiency: Callable[[int, int], float] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owner: dict[int, Any] = {}

    def insert(self, slot: int, cost: Any, now: int) -> None:
        super().insert(slot, cost, now)
        self._owner[slot] = self.current

    def _efficiency(self, slot: int) -> float:
        tree, efficiency = self._tree, self.node_efficiency
        if efficiency is None or tree is None or slot not in tree:
            return super()._efficiency(slot)
        parent = tree.parent(slot)
        return efficiency(
            self._cost[slot].tokens, 0 if parent is None else self._cost[parent].tokens
        )

    def victim(self, evictable: Callable[[int], bool]) -> int | None:
        slot = super().victim(evictable)
        tree, engine = self._tree, self.engine
        if not self.free_tail or slot is None or engine is None or tree is None or slot not in tree:
            return slot
        seq = self._owner.get(slot)
        if seq is None or tree.child_count(slot) != 0:
            return slot
        tokens, parent = self._cost[slot].tokens, tree.parent(slot)
        first = 0 if parent is None else self._cost[parent].tokens // engine._block
        last = tokens // engine._block
        request = seq.request
        prompt = request.answer if tokens > len(request.prompt) else request.prompt
        hashed = prompt.hashed(engine._namespace, engine.config.unit)
        pool = engine.pool
        for digest in list(block_digests(hashed, last, engine._units_per_block))[first:]:
            block = pool.block_for(digest)
            if block is not None and pool.refcount(block) == 0 and block in pool._cached_free:
                _drop_cached_block(pool, block)
        return slot


def evict_v2_efficiency(
    model: dict[str, int], utils: types.ModuleType, sizes: tuple[int, int]
) -> Callable[[int, int], float]:
    """The FLOP efficiency ``radix_cache_hybrid.evict_v2`` gives a node of ``total`` tokens
    whose parent has ``parent``: FLOPs saved relative to the parent (``get_mamba1_flops`` of
    the node's own tokens, ``get_attn_flops(total) - get_attn_flops(parent)``, and, as its
    code has it, ``get_mlp_flops(total) - get_attn_flops(parent)``) per byte of one state
    and the KV of all ``total`` tokens (``sizes``: state bytes per SSM layer, KV bytes per
    attention layer and token). docs/SEMANTICS.md E5 keeps hyckpt's own on purpose."""
    ssm, attn, mlp = model["num_ssm_layers"], model["num_attn_layers"], model["num_mlp_layers"]
    d, n, (state, kv) = model["d"], model["n"], sizes

    def efficiency(total: int, parent: int) -> float:
        saved = (
            ssm * utils.get_mamba1_flops(total - parent, d, n)
            + attn * (utils.get_attn_flops(total, d) - utils.get_attn_flops(parent, d))
            + mlp * (utils.get_mlp_flops(total, d) - utils.get_attn_flops(parent, d))
        )
        return saved / (ssm * state + attn * kv * total)

    return efficiency


@contextlib.contextmanager
def _diagnostic_policy(
    free_tail: bool, efficiency: Callable[[int, int], float] | None
) -> Iterator[None]:
    """Run every replay (the live one and the tuner's) with :class:`_TailKvMarconiPolicy`."""
    serve = Replayer._serve

    def hooked(self: Any, seq: Any) -> None:
        policy = self.index.inner.eviction
        policy.engine, policy.current = self, seq
        serve(self, seq)

    policies = dict(eviction_module.POLICIES, marconi=_TailKvMarconiPolicy)
    scored = None if efficiency is None else staticmethod(efficiency)
    with (
        _patched(eviction_module, POLICIES=policies),
        _patched(Replayer, _serve=hooked),
        _patched(_TailKvMarconiPolicy, free_tail=free_tail, node_efficiency=scored),
    ):
        yield


# --- 4. one comparison ----------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """Both sides at one budget (``label`` says which variant)."""

    label: str
    budget_bytes: int
    marconi: Side
    hyckpt: Side
    fixed_alpha: bool = False

    def per_request(self) -> dict[str, int]:
        """Requests with equal hits, hyckpt one token short (the leaf-state position), and
        otherwise different (hyckpt shorter / longer)."""
        counts = {"equal": 0, "one_short": 0, "shorter": 0, "longer": 0}
        for ours, theirs in zip(self.hyckpt.hits, self.marconi.hits, strict=True):
            if ours == theirs:
                counts["equal"] += 1
            elif ours == theirs - 1:
                counts["one_short"] += 1
            else:
                counts["shorter" if ours < theirs else "longer"] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: both sides (with per-request hits), the counts of :meth:`per_request`."""
        sides = {name: getattr(self, name) for name in ("marconi", "hyckpt")}
        fields = {name: {"token_hit_rate": side.hit_rate} for name, side in sides.items()}
        for name, side in sides.items():
            fields[name].update(dataclasses.asdict(side))
        return {**dataclasses.asdict(self), **fields, "per_request": self.per_request()}


@dataclasses.dataclass
class Setup:
    """Everything fixed for one seed: the scenario, the trace and its requests, the model."""

    scenario: Any
    requests: list[Any]
    trace: TraceFile
    model: dict[str, int]
    sizes: tuple[int, int] | None


def prepare(args: argparse.Namespace, seed: int, folder: Path) -> Setup:
    """Build the scenario for ``args.model``, write its traffic as a Marconi trace, read it
    back as hyckpt's workload and check the round trip."""
    overrides: dict[str, Any] = {"cache.engine": "marconi", "workload.requests": args.requests}
    if args.system_prompt_tokens:
        overrides["workload.params.system_prompt_tokens"] = args.system_prompt_tokens
    sizes, model_file = None, folder / "marconi-7b.toml"
    if args.model == "marconi-7b":
        model_file.write_text(MARCONI_7B_TOML)
        overrides["model"] = {"file": str(model_file), "gpu": "h200"}
        model = MARCONI_7B
    else:
        sized = get_model(args.model)
        model = NEMOTRON_H_8B
        state = recurrent_bytes_per_sequence(sized) // model["num_ssm_layers"]
        sizes = (state, kv_bytes_per_token(sized) // model["num_attn_layers"])
        overrides["model"] = {"name": args.model, "gpu": "h200"}
    scenario = load_scenario(SCENARIO, check_sweep=False).with_overrides(
        overrides, check_sweep=False
    )
    make, _ = scenario.workload.build(seed)
    generated = list(make())
    rate = float(scenario.workload.params.get("arrivals", {}).get("rate_per_s", 1.0))
    name = f"hyckpt-{scenario.name}-seed{seed}-req{args.requests}"
    trace = write_trace(generated, folder, name, rate)
    workload = {"trace": str(trace.path), "trace_format": "marconi", "requests": args.requests}
    from_trace = scenario.with_overrides({"workload": workload}, check_sweep=False)
    make, _ = from_trace.workload.build(seed)
    replayed = list(make())
    check_round_trip(generated, replayed)
    model_line = f'file = "{model_file.name}"' if sizes is None else f'name = "{args.model}"'
    trace.path.with_suffix(".toml").write_text(
        f'[scenario]\nname = "marconi-fidelity"\nseed = {seed}\n[model]\n{model_line}\n'
        f'gpu = "h200"\n[cache]\nengine = "marconi"\ncache_budget_bytes = {2 * GIB}\n'
        f'[engine]\nmode = "replay"\n[workload]\ntrace = "{trace.path.name}"\n'
        f'trace_format = "marconi"\nrequests = {args.requests}\n'
    )  # hyckpt's side of this seed: `hyckpt run FILE.toml` (budget: edit the file)
    return Setup(from_trace, replayed, trace, model, sizes)


def check_flops(marconi: Marconi, scenario: Any, model: dict[str, int]) -> None:
    """With Marconi's model, hyckpt's prefill FLOPs must equal Marconi's
    (``get_cache_stats``' sum of ``get_mamba1_flops``, ``get_attn_flops``,
    ``get_mlp_flops``), so both tuners score a hit alike."""
    costs, u = scenario.sim_config.costs(), marconi.utils
    d, n = model["d"], model["n"]
    for tokens in (1, 1000, 32768):
        theirs = (
            model["num_ssm_layers"] * u.get_mamba1_flops(l=tokens, d=d, n=n)
            + model["num_attn_layers"] * u.get_attn_flops(l=tokens, d=d)
            + model["num_mlp_layers"] * u.get_mlp_flops(l=tokens, d=d)
        )
        if costs.prefill_flops(tokens) != theirs:
            raise SystemExit(f"FLOPs of {tokens} tokens: {costs.prefill_flops(tokens)} != {theirs}")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of running both sides: ``alpha`` fixed on both with tuning off (``None``:
    both tune), dotted scenario keys for hyckpt, Marconi with exact bytes
    (:func:`_exact_bytes_class`), hyckpt's policy freeing leaf KV tails or scoring with
    :func:`evict_v2_efficiency` (:class:`_TailKvMarconiPolicy`)."""

    label: str
    alpha: float | None = None
    hyckpt: tuple[tuple[str, object], ...] = ()
    exact_bytes: bool = False
    free_tail: bool = False
    v2_efficiency: bool = False


def compare(
    marconi: Marconi,
    setup: Setup,
    seed: int,
    budget: int,
    variant: Variant,
    tuner: str,
    memo: dict[Any, Side],
) -> Row:
    """Run both sides at ``budget`` bytes (Marconi's runs are shared through ``memo``)."""
    alpha = variant.alpha
    key = (seed, budget, alpha, variant.exact_bytes)
    if key not in memo:
        memo[key] = run_marconi(
            marconi, setup.trace, budget, setup.model, alpha=alpha,
            exact_bytes=variant.exact_bytes, tuner=tuner, sizes=setup.sizes,
        )  # fmt: skip
    theirs = memo[key]
    overrides: dict[str, Any] = {"cache.cache_budget_bytes": budget, **dict(variant.hyckpt)}
    if alpha is not None:
        params = setup.scenario.sim_config.eviction_params  # the preset's, kept
        overrides["eviction.params"] = {**params, "tune": False, "alpha": alpha}
    context: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if variant.free_tail or variant.v2_efficiency:
        sizes = setup.sizes or (
            marconi.utils.get_mamba_state_size(setup.model["d"], setup.model["n"]),
            marconi.utils.get_kvs_size(1, setup.model["d"]),
        )
        efficiency = evict_v2_efficiency(setup.model, marconi.utils, sizes)
        context = _diagnostic_policy(
            variant.free_tail, efficiency if variant.v2_efficiency else None
        )
    with context:
        ours = run_hyckpt(setup.scenario, setup.requests, seed, overrides, alpha)
    if ours.prompt_tokens != theirs.prompt_tokens:
        raise SystemExit(
            f"input tokens: hyckpt {ours.prompt_tokens}, Marconi {theirs.prompt_tokens}"
        )
    return Row(variant.label, budget, theirs, ours, alpha is not None)


def rows_for_budget(
    marconi: Marconi, setup: Setup, seed: int, budget: int, args: argparse.Namespace
) -> list[Row]:
    """The comparison at ``budget``, then (``--diagnose``) the variants that isolate each
    difference."""
    memo: dict[Any, Side] = {}
    run = lambda variant: compare(marconi, setup, seed, budget, variant, args.marconi_tuner, memo)  # noqa: E731
    main = run(Variant("as shipped", args.alpha))
    rows = [main]
    if not args.diagnose:
        return rows
    if args.alpha is None:
        rows.append(run(Variant("alpha 0, no tuning", 0.0)))
        theirs = main.marconi.alpha
        if theirs:
            rows.append(run(Variant(f"alpha {theirs:g} (Marconi's), no tuning", theirs)))
    a = args.alpha
    rows += [
        run(Variant("hyckpt block 1", a, hyckpt=(("cache.block_size", 1),))),
        run(Variant("hyckpt evict_v2 efficiency", a, v2_efficiency=True)),
        run(Variant("hyckpt leaf frees KV tail", a, free_tail=True)),
        run(Variant("hyckpt tail + evict_v2 efficiency", a, free_tail=True, v2_efficiency=True)),
        run(Variant("Marconi exact bytes", a, exact_bytes=True)),
    ]
    return rows


# --- 5. the command -------------------------------------------------------------------------


def format_row(row: Row, seed: int) -> str:
    """One line of the table (:data:`HEADER`)."""
    counts, m, h = row.per_request(), row.marconi, row.hyckpt
    a = ["-" if s.alpha is None else f"{s.alpha:g}{'*' * row.fixed_alpha}" for s in (m, h)]
    alphas = f"{a[0]:>5}/{a[1]:<5}"
    seen = f"{m.seen_before_eviction or '-'!s:>4}/{h.seen_before_eviction or '-'!s:<4}"
    cells = [f"{counts[key]:>5}" for key in ("equal", "one_short", "shorter", "longer")]
    return (
        f"{seed:>4}  {row.budget_bytes / GIB:>6.2f}  {row.label:<36} {m.hit_rate:>8.2%}"
        f" {h.hit_rate:>8.2%} {(h.hit_rate - m.hit_rate) * 100:>+6.2f}  {alphas} {seen} "
        + " ".join(cells)
        + f"  {m.wall_s:>6.2f}/{h.wall_s:.2f}"
    )


HEADER = (
    "seed     GiB  variant                               Marconi   hyckpt   diff  alpha M/h"
    "   n M/h  equal  -1tok shorter longer  wall s M/h"
)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--marconi-repo", {"type": Path, "required": True, "help": "a clone of ruipeterpan/marconi"}),
    ("--requests", {"type": int, "default": 600, "help": "requests (default: the scenario's 600)"}),
    ("--seeds", {"type": int, "nargs": "+", "default": [1], "help": "workload seeds (default: 1)"}),
    ("--budget-gib", {"type": float, "nargs": "*", "help": "budgets in GiB (default: 2 5 10)"}),
    ("--budget-gb", {"type": float, "nargs": "*", "default": [], "help": "budgets in 1e9 bytes"}),
    ("--model", {"choices": ("marconi-7b", "nemotron-h-8b"), "default": "marconi-7b"}),
    ("--alpha", {"type": float, "help": "fix alpha on both sides, tuning off"}),
    ("--system-prompt-tokens", {"type": int, "default": 0, "help": "a shared system prompt"}),
    ("--marconi-tuner", {"choices": ("serial", "pool"), "default": "serial"}),
    ("--diagnose", {"action": "store_true", "help": "add the runs isolating each difference"}),
    ("--keep", {"type": Path, "help": "keep the traces, model and scenario files here"}),
    ("--json", {"type": Path, "help": "write every row as JSON"}),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m engines.marconi_fidelity",
        description="Marconi's simulator and hyckpt's marconi preset on the same trace, model "
        "and byte capacity: both token hit rates per budget (docs/SIMULATION.md).",
    )
    for flag, options in OPTIONS:
        parser.add_argument(flag, **options)
    args = parser.parse_args(argv)
    if args.budget_gib is None:
        args.budget_gib = [] if args.budget_gb else [2.0, 5.0, 10.0]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    marconi = load_marconi(args.marconi_repo.resolve())
    budgets = [round(g * GIB) for g in args.budget_gib] + [round(g * 1e9) for g in args.budget_gb]
    stubbed = ", ".join(marconi.stubbed) or "none"
    print(
        f"Marconi from {args.marconi_repo} (stubbed unused imports: {stubbed}); model {args.model}"
    )
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        folder.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            setup = prepare(args, seed, folder)
            if setup.sizes is None:
                check_flops(marconi, setup.scenario, setup.model)
            print(
                f"seed {seed}: {setup.trace.requests} requests, {setup.trace.sessions} sessions, "
                f"trace {setup.trace.path.name} (round trip checked)"
            )
            print(HEADER)
            for budget in budgets:
                for row in rows_for_budget(marconi, setup, seed, budget, args):
                    print(format_row(row, seed), flush=True)
                    results.append({"seed": seed, **row.to_dict()})
    print(
        "alpha M/h: Marconi/hyckpt at the end (* fixed); n: requests looked up at the first "
        "eviction; per request: hits equal, hyckpt one token short, shorter, longer; wall s: "
        "seconds of each simulator's run (reading the trace file left out)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
