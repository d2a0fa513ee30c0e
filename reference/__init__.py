"""hyckpt reference: slow, exact, pure-torch CPU code that defines the semantics.

Modules: :mod:`reference.api` (types and Protocols), :mod:`reference.errors`,
:mod:`reference.hashing`, :mod:`reference.placement`, :mod:`reference.index`,
:mod:`reference.eviction`, :mod:`reference.loading`, :mod:`reference.impl`.
This package must import without NumPy or Triton.
"""
