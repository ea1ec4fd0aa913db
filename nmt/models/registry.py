"""The closed set of models this package builds, by architecture name.

A model config names its architecture in ``arch``; :func:`build_model` looks the class up here
and calls it with the config's typed fields. Configs read from checkpoints and run directories
are checked against the schemas first (``nmt.gate.checked_train_config``), so no file can
name a class, a function or anything else to call: only the entries of :data:`MODELS`.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from nmt.config import ConfigError
from nmt.models.base import Seq2Seq
from nmt.models.gru import GRUBahdanau
from nmt.models.transformer import Transformer

MODELS: dict[str, type[Seq2Seq]] = {
    "transformer": Transformer,
    "gru_bahdanau": GRUBahdanau,
}


def build_model(
    model_cfg: DictConfig,
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int = 0,
    shared_vocab: bool = False,
) -> Seq2Seq:
    """The model ``model_cfg.arch`` names, built from the config's fields."""
    fields = OmegaConf.to_container(model_cfg, resolve=True)
    assert isinstance(fields, dict)
    arch = fields.pop("arch", None)
    if arch not in MODELS:
        raise ConfigError(f"model.arch={arch!r} is not one of: {', '.join(MODELS)}")
    return MODELS[arch](
        **fields,
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=pad_id,
        shared_vocab=shared_vocab,
    )
