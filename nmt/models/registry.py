"""The closed set of models this package builds, by architecture name.

A model config names its architecture in ``arch``; :func:`create_model` looks the class up here
and calls it with the config's other fields. Configs read from checkpoints and run directories
are checked against the schemas first (:func:`nmt.store.gate.checked_train_config`), so no file
can name a class, a function or anything else to call: only the entries of :data:`MODELS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nmt.models.base import Seq2Seq
from nmt.models.gru import GRUBahdanau
from nmt.models.transformer import Transformer

MODELS: dict[str, type[Seq2Seq]] = {
    "transformer": Transformer,
    "gru_bahdanau": GRUBahdanau,
}


class UnknownModelError(ValueError):
    """A model config's ``arch`` that is not in :data:`MODELS`."""


def create_model(
    fields: Mapping[str, Any],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int = 0,
    shared_vocab: bool = False,
) -> Seq2Seq:
    """The model ``fields["arch"]`` names, built from the model config's other fields."""
    kwargs = dict(fields)
    arch = kwargs.pop("arch", None)
    if arch not in MODELS:
        raise UnknownModelError(f"model.arch={arch!r} is not one of: {', '.join(MODELS)}")
    return MODELS[arch](
        **kwargs,
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=pad_id,
        shared_vocab=shared_vocab,
    )
