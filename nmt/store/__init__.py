"""Store: what training leaves on disk and how every command reads it back.

Checkpoint files (:mod:`~nmt.store.checkpoint`), the gate every stored config passes
(:mod:`~nmt.store.gate`), run directories and their checkpoints (:mod:`~nmt.store.paths`),
model packages (:mod:`~nmt.store.package`), rebuilding a trained model from either
(:mod:`~nmt.store.loading`) and averaging checkpoints (``nmt-average``,
:mod:`~nmt.store.average`). May import the ground floor, :mod:`nmt.data`, :mod:`nmt.models`
and :mod:`nmt.runtime`.
"""
