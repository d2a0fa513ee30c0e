"""hyckpt reference: slow, exact, pure-torch CPU code that defines the semantics.

The spec: :mod:`reference.api` (types and Protocols), :mod:`reference.errors`,
:mod:`reference.hashing` (and :mod:`reference.prefix_forest`), :mod:`reference.placement`,
:mod:`reference.index`, :mod:`reference.eviction`, :mod:`reference.state`,
:mod:`reference.storage`, :mod:`reference.export`, :mod:`reference.model` (the tiny hybrid
model), :mod:`reference.sizes` (with :mod:`reference.model_sizes`,
:mod:`reference.size_presets`, :mod:`reference.param_count`) and :mod:`reference.impl`
(the reference bundled as one :class:`~reference.api.Implementation`, the default of
``--impl``).

The tooling for testing other engines against it is the subpackage
:mod:`reference.conformance`: ``--impl`` loading, the restore-then-continue harness and
the buffer habits of real engines, the stdio protocol and the JSON vectors.
This package must import without NumPy or Triton.
"""
