"""The canonical path, evaluated block by block: bitwise :meth:`TinyHybrid.prefill`, faster.

:meth:`~reference.model.TinyHybrid.prefill` folds single-token steps: token ``t`` goes
through every block before token ``t + 1`` does. Block ``i``'s step for token ``t``
reads only block ``i``'s state after token ``t - 1`` and block ``i - 1``'s output for
token ``t``, so the same per-token operations can run block by block instead: block
``i`` for every token of the call, then block ``i + 1``. This module does that, and
computes several tokens in one call wherever that gives each token the bits its own
call gives (``tests/reference/test_model_fast.py`` compares the two paths bitwise on
random patterns, sizes, chunkings, states and draft heads):

- **elementwise arithmetic** (``+ - * /``, negation, squares): IEEE-rounded per element
  in any layout;
- **reductions over a token's own elements** (the ``sum`` / ``mean`` of a norm, of the
  SSM read-out, of the conv taps, of the delta rule's read-out): ATen reduces each output
  from its own row, in an order set by the row's length and stride, which batching does
  not change;
- **transcendental functions** (``silu``, ``softplus``, ``sigmoid``, ``exp``): ATen runs
  a contiguous tensor through a vectorised loop and its last elements through a scalar
  one, and the two can round differently; so these run on a view whose rows (one per
  token, 64-byte aligned) TensorIterator cannot merge (:func:`_apart`): each row then
  takes exactly the loop the token's own tensor takes;
- **rotary cos/sin**: cached per position, each computed by the canonical expression;
- **sliding-window attention** of the tokens that see a whole window: one ``bmm`` per
  product for all of them, on views of the keys and values whose matrices have the
  strides the canonical ``einsum`` gives ``bmm`` (MKL rounds by layout, not by batch);
- **copies** (embedding rows, conv windows, rings, KV and draft KV rows).

What stays one call per token: every **matrix-vector product** (MKL's ``gemv`` rounds
unlike ``gemm``, its rows depend on the matrix's shape, and a vector 8 bytes off a
16-byte boundary rounds differently; so each linear layer stays one ``torch.mv`` with the
original weight per token, on a row 64-byte aligned as a fresh tensor is), the
**recurrences** (SSM state, delta rule) and **full attention** (each query has its own
number of keys: the canonical step's two ``bmm`` calls on prefixes of the call's keys,
which have the canonical tensors' strides and first byte).

Without the fold's per-token dispatch (``LayerView`` set-up, dictionaries, a Python call
per mixer per token, the rotary angles recomputed), a prefill of a few dozen tokens runs
several times faster; a call of one token is no faster. :func:`speculate`,
:func:`draft_row` and :func:`draft_logits` are the other entry points on the same
evaluation (a verification is a prefill that keeps the state after the accepted tokens),
and :class:`BlockwiseHybrid` is a ``TinyHybrid`` whose methods they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import torch
import torch.nn.functional as F

from reference.api import check_count
from reference.model.attention import AttentionProjections
from reference.model.checks import check_hidden, check_tokens
from reference.model.draft import DraftHead
from reference.model.full_attention import FullAttention
from reference.model.gdn import GatedDeltaNetMixer
from reference.model.hybrid import PrefillResult, SpeculateResult, TinyHybrid
from reference.model.init import DTYPE
from reference.model.layer import LayerView
from reference.model.mamba2 import Mamba2Mixer
from reference.model.norms import l2_normalize
from reference.model.rotary import rotary_angles
from reference.model.swa import SlidingWindowAttention, ring_positions
from reference.model.threads import single_threaded
from reference.state import LiveState

__all__ = ["BlockwiseHybrid", "draft_logits", "draft_row", "prefill", "speculate"]

#: float64 elements per 64 bytes: the alignment of a fresh CPU tensor.
_ALIGN = 8


def _rows(count: int, width: int) -> torch.Tensor:
    """An uninitialised ``[count, width]`` tensor whose rows start 64 bytes apart (like a
    fresh tensor each) with a gap after each, so TensorIterator cannot merge them."""
    stride = (width // _ALIGN + 1) * _ALIGN
    return torch.empty_strided((count, width), (stride, 1), dtype=DTYPE)


def _apart(x: torch.Tensor) -> torch.Tensor:
    """``x [T, *S]`` copied into :func:`_rows` rows (one per token): an elementwise op on
    the result runs each token's ``[*S]`` through the loop it would take alone."""
    count = x.shape[0]
    if count == 1 and x.is_contiguous():
        return x  # one token: the tensor is the token's own
    rows = _rows(count, x[0].numel() if count else 0)
    rows.copy_(x.reshape(count, -1))
    return rows.view(x.shape)


def _apart_empty(count: int, *shape: int) -> torch.Tensor:
    """An uninitialised ``[count, *shape]`` laid out as :func:`_apart` lays out its
    result: the ``out=`` of an elementwise operation whose result a transcendental
    function reads next (saves :func:`_apart`'s copy); for one token a fresh tensor, as
    :func:`_apart` leaves one token's."""
    if count == 1:
        return torch.empty(1, *shape, dtype=DTYPE)
    return _rows(count, math.prod(shape)).view(count, *shape)


def _aligned(x: torch.Tensor) -> bool:
    return (
        x.dim() == 2
        and x.stride(1) == 1
        and x.stride(0) % _ALIGN == 0
        and x.data_ptr() % (8 * _ALIGN) == 0
    )


def _linear_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[T, in] -> [T, out]``, row ``t`` bitwise ``linear(x[t], weight)``: one
    ``torch.mv`` per row, on a row aligned as a fresh tensor is (MKL's result depends on
    the alignment)."""
    (out,) = _linear_many(x, weight)
    return out


def _linear_many(x: torch.Tensor, *weights: torch.Tensor) -> list[torch.Tensor]:
    """:func:`_linear_rows` of ``x`` with each of ``weights``, the rows taken once."""
    if x.shape[0] == 1 and x.stride(1) == 1 and x.data_ptr() % (8 * _ALIGN) == 0:
        row = x[0]
        return [torch.mv(weight, row)[None] for weight in weights]
    rows = (x if _aligned(x) else _apart(x)).unbind(0)
    # ``map`` keeps the per-row loop in C; ``stack`` copies the fresh results (exact).
    return [torch.stack(list(map(torch.mv, repeat(weight), rows))) for weight in weights]


def _mean_last(x: torch.Tensor) -> torch.Tensor:
    """``x.mean(dim=-1, keepdim=True)`` as ATen computes it on the CPU (a sum, then a
    division by the count), without ``mean``'s copies (the count as a float is the
    same divisor; as an int it would be wrapped and converted on every call)."""
    return x.sum(dim=-1, keepdim=True).div_(float(x.shape[-1]))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`reference.model.norms.rms_norm`, bitwise (:func:`_mean_last`; the
    operations on the fresh mean run in place)."""
    return x * _mean_last(x.pow(2)).add_(eps).rsqrt_() * weight


def _rms_norm_pair(
    a: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor, weight_b: torch.Tensor, eps: float
) -> torch.Tensor:
    """``cat((rms_norm(a, weight_a), rms_norm(b, weight_b)), -1)`` for ``a, b [T, d]``,
    both normalised in one pass (each row is still reduced on its own)."""
    pair = torch.stack((a, b), dim=1)  # [T, 2, d]
    normed = pair * _mean_last(pair.pow(2)).add_(eps).rsqrt_() * torch.stack((weight_a, weight_b))
    return normed.reshape(a.shape[0], -1)


def gated_rms_norm_gate_first(
    y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
) -> torch.Tensor:
    """:func:`reference.model.norms.gated_rms_norm_gate_first`, bitwise."""
    gated = y * F.silu(z)
    lead = gated.shape[:-1]
    grouped = gated.reshape(*lead, -1, group_size)
    normed = grouped * torch.rsqrt(_mean_last(grouped.pow(2)) + eps)
    return normed.reshape(*lead, -1) * weight


def gated_rms_norm_norm_first(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """:func:`reference.model.norms.gated_rms_norm_norm_first`, bitwise."""
    return rms_norm(o, weight, eps) * F.silu(z)


_ROTARY: dict[tuple[int, float], tuple[torch.Tensor, torch.Tensor]] = {}


def _rotary(positions: Sequence[int], head_dim: int, theta: float) -> tuple[torch.Tensor, ...]:
    """``(cos2, sin2)`` ``[T, 1, head_dim]`` for ``positions``, for :func:`_rotate`:
    ``cos2 = [cos, cos]`` and ``sin2 = [-sin, sin]``, where row ``t``'s ``cos, sin`` are
    bitwise what :func:`~reference.model.rotary.apply_rotary` computes for
    ``positions[t]`` alone (cached per position)."""
    key = (head_dim, theta)
    if key not in _ROTARY:
        _ROTARY[key] = (torch.zeros(0, 1, head_dim, dtype=DTYPE),) * 2
    cos2, sin2 = _ROTARY[key]
    needed = max(positions) + 1
    if needed > cos2.shape[0]:
        known = cos2.shape[0]
        size = max(needed, 2 * known)
        angles = torch.stack(
            [
                rotary_angles(torch.tensor(p), head_dim, theta)[..., None, :]
                for p in range(known, size)
            ]
        )
        cos, sin = torch.cos(angles), torch.sin(angles)
        cos2 = torch.cat((cos2, torch.cat((cos, cos), dim=-1)))
        sin2 = torch.cat((sin2, torch.cat((-sin, sin), dim=-1)))
        _ROTARY[key] = (cos2, sin2)
    if isinstance(positions, range) and positions.step == 1:
        return cos2[positions.start : positions.stop], sin2[positions.start : positions.stop]
    index = torch.tensor(list(positions), dtype=torch.long)
    return cos2[index], sin2[index]


def _rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """``apply_rotary`` of ``x [T, heads, head_dim]`` with per-token ``cos2, sin2``
    (:func:`_rotary`): ``x * [cos, cos] + [x2, x1] * [-sin, sin]``, which is
    ``[x1 cos - x2 sin, x2 cos + x1 sin]`` bit for bit (``a - b`` is ``a + (-b)`` in
    IEEE arithmetic, and ``x2 (-sin) = -(x2 sin)`` exactly), in four operations."""
    return x * cos2 + x.roll(x.shape[-1] // 2, dims=-1) * sin2


def _qkv(
    proj: AttentionProjections, a: torch.Tensor, positions: Sequence[int], *, query: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``proj.qkv`` of ``a [T, d_model]`` at ``positions`` (``q`` is ``None`` unless
    ``query``): rotated ``q [T, H, hd]``, rotated ``k [T, KV, hd]``, ``v [T, KV, hd]``."""
    count = a.shape[0]
    cos, sin = _rotary(positions, proj.head_dim, proj.rope_theta)
    k, v, *rest = _linear_many(a, proj.wk, proj.wv, *([proj.wq] if query else []))
    k = k.reshape(count, proj.kv_heads, proj.head_dim)
    v = v.reshape(count, proj.kv_heads, proj.head_dim)
    q = None
    if query:
        q = _rotate(rest[0].reshape(count, proj.heads, proj.head_dim), cos, sin)
    return q, _rotate(k, cos, sin), v


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """:func:`~reference.model.attention.attend_one` of one query ``q [H, hd]`` on keys
    and values already expanded to the query heads (``[S, H, hd]``, laid out as the
    canonical step lays them out): the two ``bmm`` calls its ``einsum`` calls make."""
    scores = torch.bmm(q[:, None, :], keys.permute(1, 2, 0)) / math.sqrt(q.shape[1])
    return torch.bmm(torch.softmax(scores, dim=-1), values.permute(1, 0, 2))[:, 0]


def _attend_windows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """:func:`_attend` of ``n`` queries ``q [n, H, hd]``, query ``i`` on the ``W`` keys
    and values ``[i, i + W)`` of ``keys, values [n + W - 1, H, hd]``: ``[n, H, hd]``.

    The windows are views of ``keys`` and ``values`` whose matrices have the strides the
    canonical step's ``einsum`` hands to ``bmm`` (a copy in another layout makes MKL
    round differently), so each query's products are its own call's, bit for bit."""
    count, heads, head_dim = q.shape
    window = keys.shape[0] - count + 1
    k = keys.unfold(0, window, 1).view(count * heads, head_dim, window)  # views: no copy
    v = values.unfold(0, window, 1).permute(0, 1, 3, 2).view(count * heads, window, head_dim)
    scores = torch.bmm(q.reshape(count * heads, 1, head_dim), k) / math.sqrt(head_dim)
    out = torch.bmm(torch.softmax(scores, dim=-1), v)
    return out.reshape(count, heads, head_dim)


@dataclass
class _Out:
    """One block over the call's ``T`` tokens: ``out [T, d]``, raw conv inputs
    ``[T, C]`` (recurrent kinds), and per emit offset ``e`` the block's recurrent tensors
    after ``e`` tokens (part name → tensor)."""

    out: torch.Tensor
    raw: torch.Tensor | None
    emitted: dict[int, dict[str, torch.Tensor]]


def _conv(
    window: torch.Tensor, raw: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token's ``conv_step``: ``(out [T, C], padded [T + K - 1, C])``; token
    ``t``'s taps ``[C, K]`` are laid out as ``conv_step`` lays them out; ``out`` is laid
    out as :func:`_apart` lays it out (the activation reads it next)."""
    kernel = weight.shape[1]
    padded = torch.cat((window.transpose(0, 1), raw), dim=0)
    taps = padded.unfold(0, kernel, 1).contiguous()  # [T, C, K]
    out = _apart_empty(raw.shape[0], raw.shape[1])
    return torch.add((taps * weight).sum(dim=-1), bias, out=out), padded


def _windows(padded: torch.Tensor, offsets: Sequence[int], kernel: int) -> dict[int, torch.Tensor]:
    return {e: padded[e : e + kernel - 1].transpose(0, 1).clone() for e in offsets}


def _mamba2(
    m: Mamba2Mixer, u: torch.Tensor, view: LayerView, start: int, emit: Sequence[int]
) -> _Out:
    count, kernel = u.shape[0], m.conv_weight.shape[1]
    conv, ssm = view.recurrent["conv"], view.recurrent["ssm"]
    zxbcdt = _linear_rows(u, m.in_proj)
    z = zxbcdt[:, : m.inner]
    raw = zxbcdt[:, m.inner : m.inner + m.conv_dim]
    dt_raw = zxbcdt[:, m.inner + m.conv_dim :]
    heads = m.A_log.shape[0]
    conv_out, padded = _conv(conv, raw, m.conv_weight, m.conv_bias)
    x, b, c = m._split_xbc(F.silu(conv_out))
    dt = F.softplus(torch.add(dt_raw, m.dt_bias, out=_apart_empty(count, heads)))
    log_decay = torch.mul(dt, -torch.exp(m.A_log), out=_apart_empty(count, heads))
    decay = torch.exp(log_decay)[:, :, None, None]
    update = (dt[:, :, None] * x)[:, :, :, None] * b[:, :, None, :]
    states = torch.empty(count, *ssm.shape, dtype=DTYPE)
    previous = ssm.clone()
    for state, rate, term in zip(states.unbind(0), decay.unbind(0), update.unbind(0), strict=True):
        torch.mul(previous, rate, out=state)
        state.add_(term)
        previous = state
    y = (states * c[:, :, None, :]).sum(dim=-1) + m.D[:, None] * x
    gated = gated_rms_norm_gate_first(
        y.reshape(count, m.inner), z, m.norm_weight, m.eps, m.inner // m.groups
    )
    windows = _windows(padded, [*emit, count], kernel)
    conv.copy_(windows[count])
    ssm.copy_(states[count - 1])
    emitted = {e: {"conv": windows[e], "ssm": states[e - 1].clone()} for e in emit}
    return _Out(_linear_rows(gated, m.out_proj), raw.contiguous(), emitted)


def _gdn_heads(
    g: GatedDeltaNetMixer, qkv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``g._heads`` of activated ``qkv [T, conv_dim]``: ``q, k [T, HV, dk]``, ``v [T, HV,
    dv]``; ``q`` and ``k`` normalised in one pass (each row still reduced on its own)."""
    count, key_width = qkv.shape[0], g.qk_heads * g.key_dim
    qk = l2_normalize(qkv[:, : 2 * key_width].reshape(count, 2, g.qk_heads, g.key_dim), g.eps)
    qk = qk.repeat_interleave(g.v_heads // g.qk_heads, dim=-2)  # [T, 2, HV, dk]
    q = qk[:, 0] * (g.key_dim**-0.5)
    v = qkv[:, 2 * key_width :].reshape(count, g.v_heads, g.value_dim)
    return q, qk[:, 1], v


def _gdn(
    g: GatedDeltaNetMixer, u: torch.Tensor, view: LayerView, start: int, emit: Sequence[int]
) -> _Out:
    count, kernel = u.shape[0], g.conv_weight.shape[1]
    conv, delta = view.recurrent["conv"], view.recurrent["delta"]
    qkvz, ba = _linear_many(u, g.in_proj_qkvz, g.in_proj_ba)
    raw = qkvz[:, : g.conv_dim]
    z = qkvz[:, g.conv_dim :].reshape(count, g.v_heads, g.value_dim)
    beta = torch.sigmoid(ba[:, : g.v_heads])
    shifted = torch.add(ba[:, g.v_heads :], g.dt_bias, out=_apart_empty(count, g.v_heads))
    gate = torch.mul(-torch.exp(g.A_log), F.softplus(shifted), out=_apart_empty(count, g.v_heads))
    conv_out, padded = _conv(conv, raw, g.conv_weight, g._conv_bias())
    q, k, v = _gdn_heads(g, F.silu(conv_out))  # [T, HV, dk], [T, HV, dk], [T, HV, dv]
    growth = torch.exp(gate)[:, :, None, None]
    states = torch.empty(count, *delta.shape, dtype=DTYPE)
    previous = delta.clone()
    for state, grow, key, value, rate in zip(
        states.unbind(0),
        growth.unbind(0),
        k[:, :, :, None].unbind(0),  # [HV, dk, 1]
        v[:, :, None, :].unbind(0),  # [HV, 1, dv]
        beta[:, :, None, None].unbind(0),
        strict=True,
    ):
        decayed = previous * grow
        predicted = (decayed * key).sum(dim=1, keepdim=True)
        correction = (value - predicted) * rate
        torch.add(decayed, key * correction, out=state)
        previous = state
    o = (states * q[:, :, :, None]).sum(dim=2)
    gated = gated_rms_norm_norm_first(o, z, g.norm_weight, g.eps)
    windows = _windows(padded, [*emit, count], kernel)
    conv.copy_(windows[count])
    delta.copy_(states[count - 1])
    emitted = {e: {"conv": windows[e], "delta": states[e - 1].clone()} for e in emit}
    out = _linear_rows(gated.reshape(count, g.v_heads * g.value_dim), g.out_proj)
    return _Out(out, raw.contiguous(), emitted)


def _expand(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """``[S, KV, hd] -> [S, heads, hd]``, contiguous: ``repeat_interleave`` over the
    heads (each kv head serves a run of query heads), in one copy."""
    count, kv_heads, head_dim = kv.shape
    repeated = kv[:, :, None, :].expand(count, kv_heads, heads // kv_heads, head_dim)
    return repeated.reshape(count, heads, head_dim).contiguous()


def _read_expanded(pool: torch.Tensor, table: torch.Tensor, count: int, heads: int) -> torch.Tensor:
    """``_expand(read_rows(pool, table, count), heads)`` in one copy: rows ``[0, count)``
    of one sequence from ``pool [pages, B, KV, hd]``, ``[count, heads, hd]``."""
    block = pool.shape[1]
    pages = -(-count // block)
    gathered = pool.index_select(0, table[:pages])
    return _expand(gathered.view(pages * block, *pool.shape[2:])[:count], heads)


def _write_rows(pool: torch.Tensor, table: torch.Tensor, start: int, rows: torch.Tensor) -> None:
    """:func:`~reference.model.paging.write_rows` (positions ``start ..``), one slice
    copy per page the rows touch."""
    block = pool.shape[1]
    end = start + rows.shape[0]
    position = start
    while position < end:
        page, offset = divmod(position, block)
        stop = min(end, (page + 1) * block)
        pool[int(table[page]), offset : offset + stop - position].copy_(
            rows[position - start : stop - start]
        )
        position = stop


def _attention_out(proj: AttentionProjections, heads_out: list[torch.Tensor]) -> torch.Tensor:
    """``proj.out`` of every token's attention output (``H * hd`` values each)."""
    return _linear_rows(torch.stack(heads_out).reshape(len(heads_out), -1), proj.wo)


def _swa(
    s: SlidingWindowAttention, u: torch.Tensor, view: LayerView, start: int, emit: Sequence[int]
) -> _Out:
    count, proj, window = u.shape[0], s.proj, s.window
    ring_k, ring_v = view.recurrent["ring_k"], view.recurrent["ring_v"]
    positions = range(start, start + count)
    q, k, v = _qkv(proj, u, positions)
    assert q is not None
    previous = ring_positions(start, window)
    index = torch.tensor([p % s.ring_size for p in previous], dtype=torch.long)
    keys = _expand(torch.cat((ring_k.index_select(0, index), k), dim=0), proj.heads)
    values = _expand(torch.cat((ring_v.index_select(0, index), v), dim=0), proj.heads)
    first = start - len(previous)  # position of keys[0]
    # The first W - 1 positions see fewer than W keys: one call each; the others at once.
    alone = min(count, max(0, window - 1 - start))
    outs = [
        _attend(q[t], keys[lo:hi], values[lo:hi])
        for t, p in enumerate(positions[:alone])
        for lo, hi in [(max(0, p - window + 1) - first, p + 1 - first)]
    ]
    if alone < count:
        lo = start + alone - window + 1 - first
        outs.extend(_attend_windows(q[alone:], keys[lo:], values[lo:]).unbind(0))
    emitted = {  # from the rings as the call found them
        e: {"ring_k": s._ring_at(ring_k, k, start, e), "ring_v": s._ring_at(ring_v, v, start, e)}
        for e in emit
    }
    for position in range(max(start, start + count - s.ring_size), start + count):
        ring_k[position % s.ring_size] = k[position - start]  # in place: ``_ring_at``'s rows
        ring_v[position % s.ring_size] = v[position - start]
    return _Out(_attention_out(proj, outs), None, emitted)


def _attn(
    f: FullAttention, u: torch.Tensor, view: LayerView, start: int, emit: Sequence[int]
) -> _Out:
    count, proj = u.shape[0], f.proj
    positions = range(start, start + count)
    q, k, v = _qkv(proj, u, positions)
    assert q is not None
    _write_rows(view.pages["k"], view.block_table, start, k)
    _write_rows(view.pages["v"], view.block_table, start, v)
    end = start + count
    keys = _read_expanded(view.pages["k"], view.block_table, end, proj.heads)
    values = _read_expanded(view.pages["v"], view.block_table, end, proj.heads)
    # Token p's keys and values are the first p + 1 rows of the call's: a prefix has the
    # strides and the first byte the canonical step's fresh tensors have (:func:`_attend`).
    keys_t, values_t = keys.permute(1, 2, 0), values.permute(1, 0, 2)
    scale = math.sqrt(proj.head_dim)
    outs = []
    for query, p in zip(q[:, :, None, :].unbind(0), positions, strict=True):
        scores = torch.bmm(query, keys_t.narrow(2, 0, p + 1)).div_(scale)
        outs.append(torch.bmm(torch.softmax(scores, dim=-1), values_t.narrow(1, 0, p + 1)))
    return _Out(_attention_out(proj, outs), None, {e: {} for e in emit})


#: Each kind's block over a call: ``(mixer, u [T, d], view, start, emit offsets)``.
_BLOCKS: dict[str, Callable[[Any, torch.Tensor, LayerView, int, Sequence[int]], _Out]] = {
    "mamba2": _mamba2,
    "gdn": _gdn,
    "swa": _swa,
    "attn": _attn,
}


def _draft_rows(
    draft: DraftHead,
    pages: dict[str, torch.Tensor],
    table: torch.Tensor,
    start: int,
    hidden: torch.Tensor,
    successors: Sequence[int],
) -> None:
    """``draft.write_row`` for rows ``start .. start + len(successors) - 1``, row
    ``start + i`` from ``hidden[i]`` and ``successors[i]``."""
    count = len(successors)
    if not count:
        return
    embedded = draft.embedding.index_select(0, torch.tensor(list(successors), dtype=torch.long))
    joined = _rms_norm_pair(
        hidden[:count], embedded, draft.hidden_norm, draft.embed_norm, draft.eps
    )
    u = _linear_rows(joined, draft.proj)
    positions = range(start, start + count)
    _, k, v = _qkv(draft.attn, rms_norm(u, draft.attn_norm, draft.eps), positions, query=False)
    _write_rows(pages["k"], table, start, k)
    _write_rows(pages["v"], table, start, v)


def _draft_logits(
    draft: DraftHead,
    pages: dict[str, torch.Tensor],
    table: torch.Tensor,
    position: int,
    hidden: torch.Tensor,
    successor: int,
) -> torch.Tensor:
    """``draft.logits``: write draft row ``position``, attend over rows ``0 ..
    position``, ``[vocab]`` logits (the query from the same projections as the row)."""
    embedded = draft.embedding[successor : successor + 1]
    joined = _rms_norm_pair(hidden[None], embedded, draft.hidden_norm, draft.embed_norm, draft.eps)
    u = _linear_rows(joined, draft.proj)
    positions = range(position, position + 1)
    q, k, v = _qkv(draft.attn, rms_norm(u, draft.attn_norm, draft.eps), positions)
    assert q is not None
    _write_rows(pages["k"], table, position, k)
    _write_rows(pages["v"], table, position, v)
    heads = draft.attn.heads
    keys = _read_expanded(pages["k"], table, position + 1, heads)
    values = _read_expanded(pages["v"], table, position + 1, heads)
    out = u + _attention_out(draft.attn, [_attend(q[0], keys, values)])
    return _linear_rows(rms_norm(out, draft.final_norm, draft.eps), draft.lm_head)[0]


def _forward(
    model: TinyHybrid,
    state: LiveState,
    ids: list[int],
    start: int,
    table: torch.Tensor,
    views: list[LayerView],
    emit: Sequence[int],
    successors: Sequence[int],
) -> PrefillResult:
    """Every block over ``ids`` (positions ``start ..``), block by block; draft rows
    ``start ..`` from ``successors``; ``emit``: run offsets whose state is kept."""
    config = model.config
    eps = config.norm_eps
    x = model.embedding.index_select(0, torch.tensor(ids, dtype=torch.long))
    raws: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for index, (block, view) in enumerate(zip(model.blocks, views, strict=True)):
        result = _BLOCKS[block.mixer.kind](
            block.mixer,
            rms_norm(x, block.norm, eps),
            view,
            start,
            emit,
        )
        x = x + result.out
        if result.raw is not None:
            raws[str(index)] = result.raw
        parts[str(index)] = result.emitted
    hidden = rms_norm(x, model.final_norm, eps)
    logits = _linear_rows(hidden, model.lm_head)
    if model.draft is not None:
        _draft_rows(model.draft, model._draft_pages(state), table, start, hidden, successors)
    emitted: dict[int, dict[str, torch.Tensor]] = {}
    for offset in emit:
        found: dict[str, torch.Tensor] = {}
        for name in state.recurrent:
            layer, part = name.split(".", 1)
            found[name] = parts[layer][offset][part]
        emitted[start + offset] = found
    return PrefillResult(logits=logits, hidden=hidden, raw_conv_inputs=raws, emitted=emitted)


@single_threaded
def prefill(
    model: TinyHybrid,
    state: LiveState,
    batch_slot: int,
    block_table: Sequence[int],
    tokens: Sequence[int],
    start: int,
    *,
    emit_at: Sequence[int] = (),
    next_token: int | None = None,
) -> PrefillResult:
    """:meth:`TinyHybrid.prefill <reference.model.TinyHybrid.prefill>` (same arguments,
    checks, effects and result, bit for bit), evaluated block by block."""
    ids, emit, table, views = model._begin(
        state, batch_slot, block_table, tokens, start, emit_at, next_token
    )
    if not ids:
        return TinyHybrid.prefill(model, state, batch_slot, block_table, tokens, start)
    successors = [*ids[1:], *([] if next_token is None else [next_token])]
    offsets = sorted(position - start for position in emit)
    return _forward(model, state, ids, start, table, views, offsets, successors)


@single_threaded
def speculate(
    model: TinyHybrid,
    state: LiveState,
    batch_slot: int,
    block_table: Sequence[int],
    prefix_len: int,
    draft_tokens: Sequence[int],
    accepted: int,
    *,
    boundary_hidden: torch.Tensor | None = None,
    next_token: int | None = None,
) -> SpeculateResult:
    """:meth:`TinyHybrid.speculate <reference.model.TinyHybrid.speculate>` (same
    arguments, checks, effects and result, bit for bit), evaluated block by block: the
    verification keeps every token's state (``emit_at`` every position), then the batch
    slot is set to the state after ``accepted`` tokens. With ``next_token``, the boundary
    draft row ``prefix_len + accepted - 1`` is written once, from ``next_token``, where
    the fold writes it from the rejected draft token and then again."""
    ids, table, views = model._begin_speculate(
        state,
        batch_slot,
        block_table,
        draft_tokens,
        prefix_len,
        accepted,
        boundary_hidden,
        next_token,
    )
    if not ids:
        return TinyHybrid.speculate(model, state, batch_slot, block_table, prefix_len, [], 0)
    # Only the state kept after ``accepted`` tokens is read: emit that one (the state
    # before the call when none is accepted; the state after the call when all are).
    before = model._slot_copy(state, batch_slot) if accepted == 0 else None
    offsets = [accepted] if 0 < accepted < len(ids) else []
    successors = ids[1:]
    if next_token is not None:  # draft row p + accepted - 1 follows the accepted tokens
        successors = [*ids[1:accepted], next_token, *ids[accepted + 1 :]]
    result = _forward(model, state, ids, prefix_len, table, views, offsets, successors)
    kept = before if before is not None else result.emitted.get(prefix_len + accepted, {})
    for name, tensor in kept.items():
        state.recurrent[name][batch_slot].copy_(tensor)
    if model.draft is not None and boundary_hidden is not None:
        pages = model._draft_pages(state)
        model.draft.write_row(pages, table, prefix_len - 1, boundary_hidden, ids[0])
    return SpeculateResult(result.logits, result.hidden)


@single_threaded
def draft_row(
    model: TinyHybrid,
    state: LiveState,
    block_table: Sequence[int],
    position: int,
    hidden_row: torch.Tensor,
    successor_token: int,
) -> None:
    """:meth:`TinyHybrid.draft_row <reference.model.TinyHybrid.draft_row>` (same
    arguments, checks and effect, bit for bit)."""
    draft = model._require_draft()
    (successor,) = check_tokens([successor_token], model.config.vocab_size, "successor_token")
    check_count("position", position)
    check_hidden(hidden_row, None, model.config.d_model)
    table = model._table(state, block_table, position + 1)
    _draft_rows(draft, model._draft_pages(state), table, position, hidden_row[None], [successor])


@single_threaded
def draft_logits(
    model: TinyHybrid,
    state: LiveState,
    block_table: Sequence[int],
    position: int,
    hidden_row: torch.Tensor,
    successor_token: int,
) -> torch.Tensor:
    """:meth:`TinyHybrid.draft_logits <reference.model.TinyHybrid.draft_logits>` (same
    arguments, checks, effect and result, bit for bit)."""
    draft = model._require_draft()
    (successor,) = check_tokens([successor_token], model.config.vocab_size, "successor_token")
    check_count("position", position)
    check_hidden(hidden_row, None, model.config.d_model)
    table = model._table(state, block_table, position + 1)
    pages = model._draft_pages(state)
    return _draft_logits(draft, pages, table, position, hidden_row, successor)


class BlockwiseHybrid(TinyHybrid):
    """A :class:`~reference.model.TinyHybrid` (the same weights from the same
    configuration) whose :meth:`prefill`, :meth:`speculate`, :meth:`draft_row` and
    :meth:`draft_logits` run block by block (this module): the same checks, effects and
    results, bit for bit. What the real-tensor backend runs unless told to run the fold
    (:func:`sim.engine.backends.tensor.row_at_a_time`)."""

    prefill = prefill
    speculate = speculate
    draft_row = draft_row
    draft_logits = draft_logits
