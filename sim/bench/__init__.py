"""Benchmarks of hyckpt (``hyckpt bench ...``).

Modules: :mod:`sim.bench.index_bench` (``hyckpt bench index``: the reference index's
``lookup`` against the seed's scan) and :mod:`sim.bench.seed_scan` (the faithful port
of the Rust seed's ``PrefixCheckpoints`` it is compared with; not part of the library).
"""
