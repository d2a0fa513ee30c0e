"""hyckpt reference: slow, exact, pure-torch CPU code that defines the semantics.

Modules: :mod:`reference.api` (types and Protocols), :mod:`reference.errors`,
:mod:`reference.hashing`, :mod:`reference.placement`, :mod:`reference.index`,
:mod:`reference.eviction`, :mod:`reference.state`, :mod:`reference.storage`,
:mod:`reference.export`, :mod:`reference.model`, :mod:`reference.exactness`,
:mod:`reference.sizes`, :mod:`reference.loading`, :mod:`reference.impl`; for engines
not written in Python, the stdio protocol (:mod:`reference.protocol`,
:mod:`reference.protocol_codec`, :mod:`reference.protocol_server`,
:mod:`reference.protocol_client`) and the JSON vectors (:mod:`reference.vectors` and
``vectors_*``), described in docs/PROTOCOL.md.
This package must import without NumPy or Triton.
"""
