"""A tiny hybrid LLM in pure torch (float64, CPU) that proves checkpoint exactness.

Layer kinds: Mamba2 (:mod:`.mamba2`), gated DeltaNet (:mod:`.gdn`), sliding-window
attention (:mod:`.swa`), full attention over paged KV (:mod:`.full_attention`), and an
optional MTP/EAGLE draft head (:mod:`.draft`). The model (:mod:`.hybrid`) keeps its
state in a :class:`~reference.state.LiveState` in serving-engine layout. See
``docs/MODEL.md``.
"""

from reference.model.config import LAYER_KINDS, HybridConfig
from reference.model.hybrid import PrefillResult, SpeculateResult, TinyHybrid

__all__ = ["LAYER_KINDS", "HybridConfig", "PrefillResult", "SpeculateResult", "TinyHybrid"]
