"""The MTP / EAGLE-style draft head (DeepSeek-V3 multi-token prediction, Qwen3-Next MTP).

At position ``t`` the head combines the base model's last hidden state ``h_t`` (after the
final norm, before the LM head) with the embedding of the **successor** token
``x_{t+1}``::

    u_t = W_proj [rms_norm(h_t); rms_norm(emb(x_{t+1}))]          ([d_model])

then runs one pre-norm attention block over its own paged KV (``"draft.k"``,
``"draft.v"``, paired page-for-page with the base pages: the same block table) and the
base model's LM head (shared, as are the embeddings, as in DeepSeek-V3)::

    a_t = rms_norm(u_t);  k_t = rope(W_k a_t, t);  v_t = W_v a_t    (the draft KV row t)
    out_t = u_t + W_o attend(rope(W_q a_t, t), draft rows 0..t)
    logits_t = lm_head(rms_norm(out_t))            (a guess for token t + 2)

So draft KV row ``t`` depends on the prefix (through ``h_t``) **and** on token ``t + 1``:
it cannot be written until the successor is known. That is the boundary problem of
DESIGN §6.3: a checkpoint at ``p`` holds the rows ``< p - 1`` at most, and after a
restore row ``p - 1`` is recomputed from the saved ``h_{p-1}`` and token ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.model.attention import AttentionProjections, attend_one
from reference.model.config import HybridConfig
from reference.model.init import WeightDraw
from reference.model.layer import linear
from reference.model.norms import rms_norm
from reference.model.paging import read_rows, write_row, write_rows

__all__ = ["DraftHead"]


@dataclass(frozen=True)
class DraftHead:
    """Draft head weights.

    Attributes:
        hidden_norm, embed_norm: ``[d_model]`` gains for ``h_t`` and ``emb(x_{t+1})``.
        proj: ``W_proj [d_model, 2 * d_model]``.
        attn_norm: ``[d_model]``; ``attn``: the attention projections.
        final_norm: ``[d_model]``.
        embedding: ``[vocab, d_model]`` and ``lm_head: [vocab, d_model]``, shared with
            the base model (the same tensors).
    """

    hidden_norm: torch.Tensor
    embed_norm: torch.Tensor
    proj: torch.Tensor
    attn_norm: torch.Tensor
    attn: AttentionProjections
    final_norm: torch.Tensor
    embedding: torch.Tensor
    lm_head: torch.Tensor
    eps: float

    @classmethod
    def draw(
        cls,
        draw: WeightDraw,
        config: HybridConfig,
        embedding: torch.Tensor,
        lm_head: torch.Tensor,
    ) -> DraftHead:
        """Draw the head's own weights in attribute order."""
        d = config.d_model
        return cls(
            hidden_norm=draw.norm_weight(d),
            embed_norm=draw.norm_weight(d),
            proj=draw.linear(d, 2 * d),
            attn_norm=draw.norm_weight(d),
            attn=AttentionProjections.draw(draw, config),
            final_norm=draw.norm_weight(d),
            embedding=embedding,
            lm_head=lm_head,
            eps=config.norm_eps,
        )

    def page_shape(self) -> tuple[int, int]:
        """``(kv_heads, head_dim)`` of the draft pages."""
        return (self.attn.kv_heads, self.attn.head_dim)

    def combine(self, hidden: torch.Tensor, successors: torch.Tensor) -> torch.Tensor:
        """``u [..., d]`` from ``hidden [..., d]`` and successor token ids ``successors [...]``."""
        embedded = self.embedding[successors]
        joined = torch.cat(
            (
                rms_norm(hidden, self.hidden_norm, self.eps),
                rms_norm(embedded, self.embed_norm, self.eps),
            ),
            dim=-1,
        )
        return linear(joined, self.proj)

    def write_row(
        self,
        pages: dict[str, torch.Tensor],
        block_table: torch.Tensor,
        position: int,
        hidden: torch.Tensor,
        successor: int,
    ) -> torch.Tensor:
        """Write draft KV row ``position`` (canonical, one row); returns ``u [d_model]``."""
        u = self.combine(hidden, torch.tensor(successor))
        _, k, v = self.attn.qkv(rms_norm(u, self.attn_norm, self.eps), torch.tensor(position))
        write_row(pages["k"], block_table, position, k)
        write_row(pages["v"], block_table, position, v)
        return u

    def write_rows(
        self,
        pages: dict[str, torch.Tensor],
        block_table: torch.Tensor,
        start: int,
        hidden: torch.Tensor,
        successors: torch.Tensor,
    ) -> None:
        """Write rows ``start .. start + T - 1`` at once (the chunked path)."""
        u = self.combine(hidden, successors)
        positions = torch.arange(start, start + hidden.shape[0])
        _, k, v = self.attn.qkv(rms_norm(u, self.attn_norm, self.eps), positions)
        write_rows(pages["k"], block_table, start, k)
        write_rows(pages["v"], block_table, start, v)

    def logits(
        self,
        pages: dict[str, torch.Tensor],
        block_table: torch.Tensor,
        position: int,
        hidden: torch.Tensor,
        successor: int,
    ) -> torch.Tensor:
        """Write row ``position``, attend over rows ``0 .. position``: ``[vocab]`` logits."""
        u = self.write_row(pages, block_table, position, hidden, successor)
        q, _, _ = self.attn.qkv(rms_norm(u, self.attn_norm, self.eps), torch.tensor(position))
        keys = read_rows(pages["k"], block_table, position + 1)
        values = read_rows(pages["v"], block_table, position + 1)
        out = u + self.attn.out(attend_one(q, keys, values))
        return linear(rms_norm(out, self.final_norm, self.eps), self.lm_head)
