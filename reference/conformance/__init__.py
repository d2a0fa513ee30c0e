"""The tooling for testing an implementation other than the reference against the spec.

The spec is the rest of :mod:`reference`; nothing in it imports from here. This
subpackage holds what the conformance suite (``tests/conformance/``) and the command line
use to reach and exercise an implementation under test:

- :mod:`reference.conformance.loading`: ``--impl module:factory`` (and ``$HYCKPT_IMPL``)
  loading, with one clear error for a factory that cannot be loaded;
- :mod:`reference.conformance.exactness`: the restore-then-continue harness on the tiny
  hybrid model (DESIGN §6), and :mod:`reference.conformance.buffer_habits`, the buffer
  habits of real engines it (and the simulation's real-tensor backends) can play;
- for engines not written in Python (docs/PROTOCOL.md): the stdio protocol
  (:mod:`~reference.conformance.protocol`: version, operations, framing, errors;
  :mod:`~reference.conformance.protocol_codec`: the encodings of the value types;
  :mod:`~reference.conformance.protocol_server`: any Python implementation served on
  stdin/stdout; :mod:`~reference.conformance.protocol_client`: such a server as an
  ``Implementation``) and the language-neutral JSON vectors
  (:mod:`~reference.conformance.vectors`: the generator, with
  :mod:`~reference.conformance.vectors_record`, :mod:`~reference.conformance.vectors_placement`
  and :mod:`~reference.conformance.vectors_index`;
  :mod:`~reference.conformance.vectors_replay`: their replay against an implementation).

Module names are those the modules had directly under :mod:`reference`, so
``reference.X`` became ``reference.conformance.X``. Pure torch, like the rest of the
package: imports without NumPy or Triton.
"""
