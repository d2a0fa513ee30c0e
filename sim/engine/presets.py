"""Engine presets: the settings that make a run mirror what one serving engine does.

``[cache] engine = "vllm" | "sglang" | "marconi"`` in a scenario sets, for each key the
file does not set itself, the value below; a key the file sets wins (an explicit
override). docs/SIMULATION.md ("Engine presets") cites the engine source each choice
follows and lists what still differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EnginePreset:
    """One engine's settings.

    Attributes:
        name: the scenario-file name.
        settings: dotted scenario keys (``"placement.policy"``) and their values.
        needs_shadow: the preset caches generated tokens, which only the shadow backend
            can (``cache.cache_generated``).
    """

    name: str
    settings: Mapping[str, object] = field(default_factory=dict)

    @property
    def needs_shadow(self) -> bool:
        return bool(self.settings.get("cache.cache_generated"))


PRESETS: dict[str, EnginePreset] = {
    preset.name: preset
    for preset in (
        # vLLM 0.33: MambaManager with mamba_cache_mode="align" (state cached at the last
        # hash-aligned position of a chunk), one block pool for every KV-cache group (the
        # hybrid allocator), LRU free queue, full blocks of decoded tokens cached.
        EnginePreset(
            "vllm",
            {
                "placement.policy": "vllm-align",
                "eviction.policy": "lru",
                "cache.cache_generated": True,
                "cache.memory": "unified",
            },
        ),
        # SGLang 0.5.23: the mamba radix cache keeps a state at the end of what each
        # prefill chunk and each finished request computed, in a mamba pool of its own
        # beside the KV pool, evicted least recently used.
        EnginePreset(
            "sglang",
            {
                "placement.policy": "block-floor",
                "eviction.policy": "lru",
                "cache.cache_generated": True,
                "cache.memory": "split",
            },
        ),
        # Marconi (MLSys'25): states admitted at branch points seen at lookup and at the
        # end of each sequence, one byte capacity, FLOP-aware eviction with tuned alpha.
        EnginePreset(
            "marconi",
            {
                "placement.policy": "branch",
                "eviction.policy": "marconi",
                "cache.cache_generated": True,
                "cache.memory": "unified",
            },
        ),
    )
}

#: The names a scenario's ``cache.engine`` may take ("none": no preset).
PRESET_NAMES = ("none", *PRESETS)
