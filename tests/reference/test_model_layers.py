"""Each layer of the tiny hybrid model against an independently written formula.

The formulas here are written differently from ``reference/model/``: explicit loops over
heads and groups, the Mamba2 recurrence in its unrolled closed form, the delta rule as
``S = decay*S + beta*outer(k, v - decay*S^T k)``, rotary as a complex multiplication and
attention recomputed from all keys without ring or pages. They agree with the layers up
to rounding (``1e-12``). The chunked multi-token path (SSD chunk scan, chunked delta rule,
batched attention) must equal the canonical fold of single-token steps with
``rtol = atol = 1e-10`` for every chunking, including chunk sizes that do not divide ``T``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.model import HybridConfig, TinyHybrid
from reference.model.attention import AttentionProjections
from reference.model.conv import conv_sequence, conv_step, window_at
from reference.model.draft import DraftHead
from reference.model.full_attention import FullAttention
from reference.model.gdn import GatedDeltaNetMixer
from reference.model.layer import LayerView, Mixer
from reference.model.mamba2 import Mamba2Mixer, segment_sum
from reference.model.swa import SlidingWindowAttention
from reference.state import LiveState

F64 = torch.float64
TIGHT = 1e-12
CHUNKED = 1e-10
CONFIG = HybridConfig(layers=("mamba2", "gdn", "swa", "attn"), draft_head=True, window=5, seed=3)
BLOCK = 4
PAGES = 12
TABLE = [7, 2, 9, 0, 11, 5, 1, 3, 4, 6, 8, 10]  # shuffled on purpose
MAMBA, GDN, SWA, ATTN = 0, 1, 2, 3


def close(actual: torch.Tensor, expected: torch.Tensor, *, tol: float, msg: str = "") -> None:
    """``torch.testing.assert_close`` with ``rtol = atol = tol`` and a labelled message."""
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, msg=msg or None)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """The layer-level calls below bypass the model's single-thread wrapper."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def model() -> TinyHybrid:
    return TinyHybrid(CONFIG)


def view_of(model: TinyHybrid, state: LiveState, layer: int, slot: int = 1) -> LayerView:
    """Layer ``layer``'s view of batch slot ``slot`` (built here, not by the model)."""
    prefix = f"{layer}."
    return LayerView(
        recurrent={
            name[len(prefix) :]: tensor[slot]
            for name, tensor in state.recurrent.items()
            if name.startswith(prefix)
        },
        pages={
            name[len(prefix) :]: tensor
            for name, tensor in state.kv_pages.items()
            if name.startswith(prefix)
        },
        block_table=torch.tensor(TABLE, dtype=torch.long),
    )


def inputs(count: int, width: int, seed: int) -> torch.Tensor:
    """``[count, width]`` unit-scale layer inputs."""
    return torch.randn(count, width, generator=torch.Generator().manual_seed(seed), dtype=F64)


def run_steps(
    mixer: Mixer, view: LayerView, u: torch.Tensor, start: int
) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]], torch.Tensor | None]:
    """Step ``u [T, d]`` from ``start``: outputs, the recurrent state after each token,
    raw conv inputs."""
    outs, states, raws = [], [], []
    for offset in range(u.shape[0]):
        step = mixer.step(u[offset], view, start + offset)
        outs.append(step.out)
        states.append({part: t.clone() for part, t in view.recurrent.items()})
        if step.conv_input is not None:
            raws.append(step.conv_input)
    return torch.stack(outs), states, (torch.stack(raws) if raws else None)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum() / x.numel() + eps) * weight


def causal_conv(history: torch.Tensor, weight: torch.Tensor, t: int) -> torch.Tensor:
    """``sum_k weight[:, k] * history[t + k]``: ``history [K - 1 + T, C]`` starts with the
    initial window (oldest first)."""
    kernel = weight.shape[1]
    total = torch.zeros(weight.shape[0], dtype=F64)
    for k in range(kernel):
        total = total + weight[:, k] * history[t + k]
    return total


# --- conv window ------------------------------------------------------------------------


def test_conv_window_oldest_first_zero_padded() -> None:
    channels, kernel = 3, 4
    weight = inputs(channels, kernel, 1)
    bias = inputs(1, channels, 2)[0]
    raws = inputs(6, channels, 3)
    window = torch.zeros(channels, kernel - 1, dtype=F64)
    for t in range(6):
        out, window = conv_step(window, raws[t], weight, bias)
        expected_window = torch.zeros(channels, kernel - 1, dtype=F64)
        for column in range(kernel - 1):  # column 0 = oldest = position t - (K-2)
            position = t - (kernel - 2) + column
            if position >= 0:
                expected_window[:, column] = raws[position]
        close(window, expected_window, tol=0.0, msg=f"window t={t}")
        expected_out = bias.clone()
        for k in range(kernel):  # tap K-1 is the current token
            position = t - (kernel - 1) + k
            if position >= 0:
                expected_out += weight[:, k] * raws[position]
        close(out, expected_out, tol=TIGHT, msg=f"conv out t={t}")


def test_conv_sequence_windows_match_steps() -> None:
    channels, kernel = 5, 3
    weight, bias = inputs(channels, kernel, 4), inputs(1, channels, 5)[0]
    initial = inputs(channels, kernel - 1, 6)
    raws = inputs(7, channels, 7)
    out, padded = conv_sequence(initial, raws, weight, bias)
    window = initial
    for t in range(7):
        close(window_at(padded, t, kernel), window, tol=0.0)
        step_out, window = conv_step(window, raws[t], weight, bias)
        close(out[t], step_out, tol=TIGHT, msg=f"sequence conv t={t}")
    close(window_at(padded, 7, kernel), window, tol=0.0)


def test_model_conv_state_is_last_raw_inputs(model: TinyHybrid) -> None:
    """``"<i>.conv"`` after ``t`` tokens holds the last ``d_conv - 1`` raw inputs of the
    prefill (``raw_conv_inputs``), oldest first, zero before the first token."""
    state = model.new_state(2, PAGES, BLOCK)
    tokens = [3, 17, 5, 40, 11]
    kernel = CONFIG.d_conv
    collected: dict[str, list[torch.Tensor]] = {"0": [], "1": []}
    for t, token in enumerate(tokens):
        result = model.prefill(state, 1, TABLE, [token], t)
        for layer in ("0", "1"):
            collected[layer].append(result.raw_conv_inputs[layer][0])
            window = state.recurrent[f"{layer}.conv"][1]
            for column in range(kernel - 1):
                position = t - (kernel - 2) + column
                expected = (
                    collected[layer][position]
                    if position >= 0
                    else torch.zeros(window.shape[0], dtype=F64)
                )
                assert torch.equal(window[:, column], expected), (layer, t, column)


# --- Mamba2 -------------------------------------------------------------------------------


def mamba2_reference(
    m: Mamba2Mixer, u: torch.Tensor, conv0: torch.Tensor, ssm0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs ``[T, d]`` and final state, from the unrolled closed form
    ``S_t = (prod_{s<=t} a_s) S_0 + sum_{s<=t} (prod_{s<r<=t} a_r) dt_s x_s B_s^T``."""
    heads, p_dim, n_dim, groups = m.heads, m.head_dim, m.state_size, m.groups
    inner = heads * p_dim
    count = u.shape[0]
    proj = torch.stack([m.in_proj @ u[t] for t in range(count)])
    z = proj[:, :inner]
    xbc_raw = proj[:, inner : inner + m.conv_dim]
    dt_raw = proj[:, inner + m.conv_dim :]
    history = torch.cat((conv0.T, xbc_raw))
    xbc = torch.stack(
        [F.silu(causal_conv(history, m.conv_weight, t) + m.conv_bias) for t in range(count)]
    )
    x = xbc[:, :inner].reshape(count, heads, p_dim)
    b_all = xbc[:, inner : inner + groups * n_dim].reshape(count, groups, n_dim)
    c_all = xbc[:, inner + groups * n_dim :].reshape(count, groups, n_dim)
    outs = []
    final = torch.zeros_like(ssm0)
    for t in range(count):
        y = torch.zeros(heads, p_dim, dtype=F64)
        for h in range(heads):
            g = h // (heads // groups)
            dts = [F.softplus(dt_raw[s, h] + m.dt_bias[h]) for s in range(t + 1)]
            a = [torch.exp(-torch.exp(m.A_log[h]) * dts[s]) for s in range(t + 1)]
            state = math.prod(a) * ssm0[h]
            for s in range(t + 1):
                carry = math.prod(a[s + 1 :]) if s < t else 1.0
                state = state + carry * dts[s] * torch.outer(x[s, h], b_all[s, g])
            y[h] = state @ c_all[t, g] + m.D[h] * x[t, h]
            if t == count - 1:
                final[h] = state
        flat, gate = y.reshape(inner), F.silu(z[t])
        size = inner // groups
        normed = torch.cat(
            [
                rms(
                    (flat * gate)[i * size : (i + 1) * size],
                    m.norm_weight[i * size : (i + 1) * size],
                    m.eps,
                )
                for i in range(groups)
            ]
        )
        outs.append(m.out_proj @ normed)
    return torch.stack(outs), final


def test_mamba2_step_matches_closed_form(model: TinyHybrid) -> None:
    mixer = model.blocks[MAMBA].mixer
    assert isinstance(mixer, Mamba2Mixer)
    state = model.new_state(2, PAGES, BLOCK)
    view = view_of(model, state, MAMBA)
    view.recurrent["conv"].copy_(inputs(mixer.conv_dim, CONFIG.d_conv - 1, seed=8))
    view.recurrent["ssm"].copy_(
        inputs(mixer.heads, mixer.head_dim * mixer.state_size, 9).reshape(
            mixer.heads, mixer.head_dim, mixer.state_size
        )
    )
    conv0, ssm0 = view.recurrent["conv"].clone(), view.recurrent["ssm"].clone()
    u = inputs(7, CONFIG.d_model, 10)
    out, states, _ = run_steps(mixer, view, u, start=0)
    expected_out, expected_final = mamba2_reference(mixer, u, conv0, ssm0)
    close(out, expected_out, tol=TIGHT, msg="mamba2 outputs vs closed form")
    close(states[-1]["ssm"], expected_final, tol=TIGHT, msg="mamba2 ssm state")


def test_segment_sum_is_decay_exponent() -> None:
    a = inputs(1, 6, 11)[0]
    seg = segment_sum(a)
    for i in range(6):
        for j in range(6):
            if j <= i:
                assert math.isclose(float(seg[i, j]), float(a[j + 1 : i + 1].sum()), abs_tol=1e-14)
            else:
                assert seg[i, j] == float("-inf")


# --- gated DeltaNet -------------------------------------------------------------------------


def gdn_reference(
    m: GatedDeltaNetMixer, u: torch.Tensor, conv0: torch.Tensor, delta0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token and per value head: ``S = decay*S + beta*outer(k, v - decay*S^T k)``,
    ``o = S^T q``."""
    hk, hv, dk, dv = m.qk_heads, m.v_heads, m.key_dim, m.value_dim
    count = u.shape[0]
    history_rows = []
    for t in range(count):
        history_rows.append((m.in_proj_qkvz @ u[t])[: m.conv_dim])
    history = torch.cat((conv0.T, torch.stack(history_rows)))
    S = delta0.clone()
    outs = []
    for t in range(count):
        proj = m.in_proj_qkvz @ u[t]
        z = proj[m.conv_dim :].reshape(hv, dv)
        ba = m.in_proj_ba @ u[t]
        mixed = F.silu(causal_conv(history, m.conv_weight, t))
        o_heads = []
        for h in range(hv):
            src = h // (hv // hk)
            q = mixed[src * dk : (src + 1) * dk]
            k = mixed[hk * dk + src * dk : hk * dk + (src + 1) * dk]
            v = mixed[2 * hk * dk + h * dv : 2 * hk * dk + (h + 1) * dv]
            q = q / torch.sqrt((q * q).sum() + m.eps) / math.sqrt(dk)
            k = k / torch.sqrt((k * k).sum() + m.eps)
            beta = torch.sigmoid(ba[h])
            decay = torch.exp(-torch.exp(m.A_log[h]) * F.softplus(ba[hv + h] + m.dt_bias[h]))
            S[h] = decay * S[h] + beta * torch.outer(k, v - decay * S[h].T @ k)
            o = S[h].T @ q
            o_heads.append(rms(o, m.norm_weight, m.eps) * F.silu(z[h]))
        outs.append(m.out_proj @ torch.cat(o_heads))
    return torch.stack(outs), S


def test_gdn_step_matches_delta_rule(model: TinyHybrid) -> None:
    mixer = model.blocks[GDN].mixer
    assert isinstance(mixer, GatedDeltaNetMixer)
    assert mixer.v_heads > mixer.qk_heads, "the default config exercises GQA-style heads"
    state = model.new_state(2, PAGES, BLOCK)
    view = view_of(model, state, GDN)
    view.recurrent["conv"].copy_(inputs(mixer.conv_dim, CONFIG.d_conv - 1, seed=12))
    view.recurrent["delta"].copy_(
        0.3
        * inputs(mixer.v_heads, mixer.key_dim * mixer.value_dim, 13).reshape(
            mixer.v_heads, mixer.key_dim, mixer.value_dim
        )
    )
    conv0, delta0 = view.recurrent["conv"].clone(), view.recurrent["delta"].clone()
    u = inputs(9, CONFIG.d_model, 14)
    out, states, _ = run_steps(mixer, view, u, start=0)
    expected_out, expected_state = gdn_reference(mixer, u, conv0, delta0)
    close(out, expected_out, tol=TIGHT, msg="gdn outputs vs delta rule")
    close(states[-1]["delta"], expected_state, tol=TIGHT, msg="gdn state")


# --- attention ------------------------------------------------------------------------------


def rotate(x: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """Rotary as a complex product: ``(x1 + i x2) * exp(i * position * theta^(-2j/d))``."""
    half = x.shape[-1] // 2
    angle = position * theta ** (-torch.arange(half, dtype=F64) * 2 / x.shape[-1])
    rotated = torch.complex(x[..., :half], x[..., half:]) * torch.exp(1j * angle)
    return torch.cat((rotated.real, rotated.imag), dim=-1)


def attention_reference(
    proj: AttentionProjections, u: torch.Tensor, window: int | None
) -> torch.Tensor:
    """Causal (optionally windowed) attention of positions ``0 .. T-1`` recomputed from
    every key, head by head, with an explicit softmax."""
    heads, kv_heads, hd = proj.heads, proj.kv_heads, proj.head_dim
    count = u.shape[0]
    q = [rotate((proj.wq @ u[t]).reshape(heads, hd), t, proj.rope_theta) for t in range(count)]
    k = [rotate((proj.wk @ u[t]).reshape(kv_heads, hd), t, proj.rope_theta) for t in range(count)]
    v = [(proj.wv @ u[t]).reshape(kv_heads, hd) for t in range(count)]
    outs = []
    for t in range(count):
        lo = 0 if window is None else max(0, t - window + 1)
        o = torch.zeros(heads, hd, dtype=F64)
        for h in range(heads):
            kv = h // (heads // kv_heads)
            scores = torch.stack([q[t][h] @ k[s][kv] / math.sqrt(hd) for s in range(lo, t + 1)])
            weights = torch.exp(scores - scores.max())
            weights = weights / weights.sum()
            for i in range(t + 1 - lo):
                o[h] += weights[i] * v[lo + i][kv]
        outs.append(proj.wo @ o.reshape(-1))
    return torch.stack(outs)


@pytest.mark.parametrize("kind", ["swa", "attn"])
def test_attention_step_matches_recomputed_attention(model: TinyHybrid, kind: str) -> None:
    layer = SWA if kind == "swa" else ATTN
    mixer = model.blocks[layer].mixer
    state = model.new_state(2, PAGES, BLOCK)
    view = view_of(model, state, layer)
    u = inputs(3 * CONFIG.window + 2, CONFIG.d_model, 15)
    out, _, _ = run_steps(mixer, view, u, start=0)
    assert isinstance(mixer, SlidingWindowAttention | FullAttention)
    window = CONFIG.window if kind == "swa" else None
    expected = attention_reference(mixer.proj, u, window)
    close(out, expected, tol=TIGHT, msg=f"{kind} outputs vs recomputation")


def test_swa_ring_holds_last_window_positions(model: TinyHybrid) -> None:
    """After ``p`` tokens the ring holds the rotated keys and values of positions
    ``max(0, p-W+1) .. p-1`` at index ``position mod (W-1)``; other entries stay zero."""
    mixer = model.blocks[SWA].mixer
    assert isinstance(mixer, SlidingWindowAttention)
    proj, ring = mixer.proj, CONFIG.window - 1
    state = model.new_state(2, PAGES, BLOCK)
    view = view_of(model, state, SWA)
    u = inputs(2 * CONFIG.window + 1, CONFIG.d_model, 16)
    for p in range(1, u.shape[0] + 1):
        mixer.step(u[p - 1], view, p - 1)
        expected_k = torch.zeros(ring, proj.kv_heads, proj.head_dim, dtype=F64)
        expected_v = torch.zeros_like(expected_k)
        for position in range(max(0, p - CONFIG.window + 1), p):
            key = (proj.wk @ u[position]).reshape(proj.kv_heads, proj.head_dim)
            expected_k[position % ring] = rotate(key, position, proj.rope_theta)
            expected_v[position % ring] = (proj.wv @ u[position]).reshape(
                proj.kv_heads, proj.head_dim
            )
        close(view.recurrent["ring_k"], expected_k, tol=TIGHT, msg=f"ring_k {p}")
        close(view.recurrent["ring_v"], expected_v, tol=TIGHT, msg=f"ring_v {p}")


def test_full_attention_rows_land_in_block_table_pages(model: TinyHybrid) -> None:
    mixer = model.blocks[ATTN].mixer
    state = model.new_state(2, PAGES, BLOCK)
    view = view_of(model, state, ATTN)
    u = inputs(10, CONFIG.d_model, 17)
    run_steps(mixer, view, u, start=0)
    assert isinstance(mixer, FullAttention)
    proj = mixer.proj
    for t in range(10):
        page, row = TABLE[t // BLOCK], t % BLOCK
        key = rotate((proj.wk @ u[t]).reshape(proj.kv_heads, proj.head_dim), t, proj.rope_theta)
        close(state.kv_pages["3.k"][page, row], key, tol=TIGHT, msg=f"k {t}")
    untouched = [p for p in range(PAGES) if p not in TABLE[: -(-10 // BLOCK)]]
    assert all(torch.count_nonzero(state.kv_pages["3.k"][p]) == 0 for p in untouched)


# --- draft head ------------------------------------------------------------------------------


def test_draft_row_matches_formula(model: TinyHybrid) -> None:
    draft = model.draft
    assert isinstance(draft, DraftHead)
    state = model.new_state(1, PAGES, BLOCK)
    hidden = inputs(1, CONFIG.d_model, 18)[0]
    position, successor = 6, 21
    model.draft_row(state, TABLE, position, hidden, successor)
    joined = torch.cat(
        (
            rms(hidden, draft.hidden_norm, draft.eps),
            rms(model.embedding[successor], draft.embed_norm, draft.eps),
        )
    )
    u = draft.proj @ joined
    a = rms(u, draft.attn_norm, draft.eps)
    heads, hd = draft.attn.kv_heads, draft.attn.head_dim
    key = rotate((draft.attn.wk @ a).reshape(heads, hd), position, draft.attn.rope_theta)
    page, row = TABLE[position // BLOCK], position % BLOCK
    close(state.draft_kv_pages["draft.k"][page, row], key, tol=TIGHT)
    close(
        state.draft_kv_pages["draft.v"][page, row],
        (draft.attn.wv @ a).reshape(heads, hd),
        tol=TIGHT,
    )
    assert torch.count_nonzero(state.draft_kv_pages["draft.k"]) == heads * hd, "exactly one row"


def test_draft_logits_matches_formula(model: TinyHybrid) -> None:
    """``draft_logits`` at ``t`` recomputed by hand: combine ``h_t`` with the successor's
    embedding, project, attend with ``q_t`` over draft rows ``0 .. t`` (its own row
    included), add the residual, final norm, shared LM head. Position 0 attends over its
    own row alone."""
    draft = model.draft
    assert isinstance(draft, DraftHead)
    attn, eps = draft.attn, draft.eps
    heads, kv_heads, hd = attn.heads, attn.kv_heads, attn.head_dim
    count = 7
    state = model.new_state(1, PAGES, BLOCK)
    hidden = inputs(count, CONFIG.d_model, 19)
    successors = [(5 * t + 2) % CONFIG.vocab_size for t in range(count)]
    qs, ks, vs, us = [], [], [], []
    for t in range(count):
        joined = torch.cat(
            (
                rms(hidden[t], draft.hidden_norm, eps),
                rms(model.embedding[successors[t]], draft.embed_norm, eps),
            )
        )
        u = draft.proj @ joined
        a = rms(u, draft.attn_norm, eps)
        us.append(u)
        qs.append(rotate((attn.wq @ a).reshape(heads, hd), t, attn.rope_theta))
        ks.append(rotate((attn.wk @ a).reshape(kv_heads, hd), t, attn.rope_theta))
        vs.append((attn.wv @ a).reshape(kv_heads, hd))
    for t in range(count):
        got = model.draft_logits(state, TABLE, t, hidden[t], successors[t])
        o = torch.zeros(heads, hd, dtype=F64)
        for h in range(heads):
            kv = h // (heads // kv_heads)
            scores = torch.stack([qs[t][h] @ ks[s][kv] / math.sqrt(hd) for s in range(t + 1)])
            weights = torch.exp(scores - scores.max())
            weights = weights / weights.sum()
            for s in range(t + 1):
                o[h] += weights[s] * vs[s][kv]
        out = us[t] + attn.wo @ o.reshape(-1)
        expected = model.lm_head @ rms(out, draft.final_norm, eps)
        close(got, expected, tol=TIGHT, msg=f"draft logits at position {t} vs the formula")


# --- chunked path vs canonical ----------------------------------------------------------------


def compare_chunked(model: TinyHybrid, layer: int, count: int, size: int, warmup: int) -> None:
    """Step ``warmup`` tokens, then the same ``count`` tokens by steps and by ``forward``
    with chunks of ``size``; compare outputs, conv inputs, final and emitted states."""
    mixer = model.blocks[layer].mixer
    u = inputs(warmup + count, CONFIG.d_model, 19 + layer)
    canon_state = model.new_state(2, PAGES, BLOCK)
    canon_view = view_of(model, canon_state, layer)
    if warmup:
        run_steps(mixer, canon_view, u[:warmup], start=0)
    chunk_state = canon_state.clone()
    chunk_view = view_of(model, chunk_state, layer)
    out, states, raws = run_steps(mixer, canon_view, u[warmup:], start=warmup)
    bounds = sorted({*range(size, count, size), count})
    emit = frozenset(bounds)
    result = mixer.forward(u[warmup:], chunk_view, warmup, bounds, emit)
    label = f"{mixer.kind} T={count} chunk={size} warmup={warmup}"
    close(result.out, out, tol=CHUNKED, msg=f"{label}: outputs")
    if raws is not None:
        assert result.conv_inputs is not None
        close(result.conv_inputs, raws, tol=CHUNKED, msg=f"{label}: conv in")
    for part, tensor in chunk_view.recurrent.items():
        close(tensor, states[-1][part], tol=CHUNKED, msg=f"{label}: {part}")
    for name, tensor in chunk_state.kv_pages.items():
        close(tensor, canon_state.kv_pages[name], tol=CHUNKED, msg=f"{label}: pages {name}")
    for offset, parts in result.emitted.items():
        for part, tensor in parts.items():
            close(
                tensor,
                states[offset - 1][part],
                tol=CHUNKED,
                msg=f"{label}: emitted {part}@{offset}",
            )


@pytest.mark.parametrize("layer", [MAMBA, GDN, SWA, ATTN], ids=["mamba2", "gdn", "swa", "attn"])
@pytest.mark.parametrize("size", [1, 3, 4, 5, 13, 20])
@pytest.mark.parametrize("warmup", [0, 6])
def test_layer_chunked_equals_canonical(
    model: TinyHybrid, layer: int, size: int, warmup: int
) -> None:
    compare_chunked(model, layer, count=13, size=size, warmup=warmup)


@settings(max_examples=max(10, settings().max_examples // 5))
@given(
    layer=st.sampled_from([MAMBA, GDN, SWA, ATTN]),
    count=st.integers(1, 24),
    size=st.integers(1, 12),
    warmup=st.integers(0, 9),
)
def test_layer_chunked_equals_canonical_any(
    model: TinyHybrid, layer: int, count: int, size: int, warmup: int
) -> None:
    compare_chunked(model, layer, count, size, warmup)
