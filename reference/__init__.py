"""hyckpt reference: slow, exact, pure-torch CPU code that defines the semantics.

Modules: :mod:`reference.api` (types and Protocols), :mod:`reference.errors`,
:mod:`reference.hashing`, :mod:`reference.placement`, :mod:`reference.index`,
:mod:`reference.eviction`, :mod:`reference.state`, :mod:`reference.storage`,
:mod:`reference.export`, :mod:`reference.model`, :mod:`reference.exactness`,
:mod:`reference.sizes`, :mod:`reference.loading`, :mod:`reference.impl`.
This package must import without NumPy or Triton.
"""
