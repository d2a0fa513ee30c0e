"""Marconi's bootstrap tuning of ``alpha``, for the ``marconi`` eviction policy.

Marconi (ruipeterpan/marconi: ``radix_cache_hybrid.py`` ``insert`` / ``evict``,
``config_tuner.py`` ``ConfigTuner.tune_config``) does not fix the weight of FLOP
efficiency: it picks it from the traffic, once.

1. **When.** The cache counts the requests it has looked up when it evicts for the first
   time, ``n``; the tuning window is the first ``W = bootstrap_multiplier × n`` requests
   (Marconi: 5). When the ``W``-th request finishes, tuning runs; it never runs again
   (Marconi's window check ``len(history) == W`` is true once).
2. **How.** Each ``alpha`` of the grid (Marconi: 0, 0.1, ..., 2.0) replays those ``W``
   requests, in arrival order, on an empty cache of the same size (Marconi's snapshot is
   taken before the first request, so it is empty), with ``alpha`` fixed.
3. **Which.** The ``alpha`` whose replay saves the most prefill FLOPs wins (ties: the
   first in grid order); the live policy takes it for the rest of the run.

The replays are :class:`~sim.engine.replay.Replayer` runs of the run's own configuration
(same index, placement, pools, generated-token caching, budget), on the shadow backend,
without faults: the same code as the run, not a model of it. Differences from Marconi, by
choice: the score is the whole window's FLOPs saved (Marconi's tuner scores the last 500
requests of it; its code notes the difference is negligible), and the grid runs one
replay after another (Marconi uses a process pool), so the result does not depend on
which replay finishes first (Marconi's ``max`` over an ``as_completed`` dictionary
breaks ties by completion order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from reference.errors import InvalidConfigError
from reference.eviction import MarconiPolicy
from sim.engine.config import Faults, SimConfig
from sim.engine.sequence import RequestLike


@dataclasses.dataclass
class AlphaTuner:
    """Watches a run with the ``marconi`` policy and tunes its ``alpha`` once.

    Args:
        config: the run's configuration.
        policy: the live policy, whose ``alpha`` the tuning sets.
        replay: runs a configuration over requests and returns the FLOPs its hits saved
            (:func:`replay_flops_saved`; tests may pass another).
    """

    config: SimConfig
    policy: MarconiPolicy
    replay: Callable[[SimConfig, list[RequestLike]], int]
    requests_before_first_eviction: int | None = None
    grid_flops_saved: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    _finished: list[tuple[int, RequestLike]] = dataclasses.field(default_factory=list)
    _done: bool = False

    @classmethod
    def for_run(cls, config: SimConfig, index: object) -> AlphaTuner | None:
        """A tuner when ``config`` runs ``marconi`` with ``tune`` on, else ``None``.

        Raises:
            InvalidConfigError: tuning is asked for but ``index`` has no reference
                :class:`MarconiPolicy` to tune (an external implementation's index).
        """
        if config.eviction != "marconi" or not config.eviction_params.get("tune", True):
            return None
        policy = getattr(index, "eviction", None)
        if not isinstance(policy, MarconiPolicy):
            raise InvalidConfigError(
                "eviction.policy 'marconi' tunes alpha by replaying requests with the "
                "reference's MarconiPolicy, and this index has none; set "
                "eviction.params.tune = false (and alpha) to run the implementation's own"
            )
        return cls(config, policy, replay_flops_saved)

    @property
    def window(self) -> int | None:
        """Requests the tuning replays (``None`` until the first eviction)."""
        seen = self.requests_before_first_eviction
        return None if seen is None else self.policy.bootstrap_multiplier * seen

    def before_lookup(self, looked_up: int, evictions: int) -> None:
        """A request is about to look up; ``looked_up`` requests did so before it, and the
        cache has evicted ``evictions`` entries so far."""
        if self.requests_before_first_eviction is None and evictions > 0:
            self.requests_before_first_eviction = looked_up

    def on_finish(self, arrival_index: int, request: RequestLike) -> None:
        """A request finished; tune once the window's requests have all finished."""
        if self._done:
            return
        self._finished.append((arrival_index, request))
        window = self.window
        if window is not None and len(self._finished) >= window:
            self._tune([request for _, request in sorted(self._finished, key=_arrival)])

    def _tune(self, requests: list[RequestLike]) -> None:
        self._done = True
        self._finished = []
        params = dict(self.config.eviction_params)
        best: tuple[int, float] | None = None
        for alpha in self.policy.alpha_grid:
            trial = dataclasses.replace(
                self.config,
                mode="replay",
                eviction_params={**params, "alpha": alpha, "tune": False},
                faults=Faults(),
                backend="shadow",
                impl=None,
            )
            saved = self.replay(trial, requests)
            self.grid_flops_saved.append((alpha, saved))
            if best is None or saved > best[0]:
                best = (saved, alpha)
        assert best is not None  # the grid is never empty
        self.policy.alpha = best[1]

    def summary(self) -> dict[str, object]:
        """JSON-ready: what the tuning saw, tried and chose (``alpha`` ``None``: not tuned)."""
        tuned = bool(self.grid_flops_saved)
        return {
            "initial_alpha": float(self.config.eviction_params.get("alpha", 0.0)),
            "requests_before_first_eviction": self.requests_before_first_eviction,
            "window_requests": self.window,
            "alpha": self.policy.alpha if tuned else None,
            "grid_flops_saved": [[alpha, saved] for alpha, saved in self.grid_flops_saved],
        }


def _arrival(item: tuple[int, RequestLike]) -> int:
    return item[0]


def replay_flops_saved(config: SimConfig, requests: list[RequestLike]) -> int:
    """Prefill FLOPs the hits of a cache-only replay of ``requests`` save (shadow backend)."""
    from sim.engine.backends import make_backend
    from sim.engine.replay import Replayer

    replayer = Replayer(config, requests, make_backend("shadow"))
    replayer.run()
    return replayer.metrics.flops_saved
