"""``trainer.freeze``: parts of the model that a run does not train (their parameters keep the
values they start with, typically a pretrained model's), so that adapting a large model needs
neither their gradients nor their optimizer state.

The parts are named by the model's top-level modules, the same for both architectures:
``embeddings`` (source and target embeddings and learned positions; with tied embeddings the
output projection's weight is that same matrix), ``encoder``, ``decoder`` (the GRU's attention,
bridge and output layer included) and ``output`` (the output projection: its weight, where it
is not tied, and its bias).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import nn

from nmt.config import ConfigError

log = logging.getLogger(__name__)

# each top-level module of our models and the part it belongs to
PART_OF = {
    "src_embed": "embeddings",
    "tgt_embed": "embeddings",
    "src_pos": "embeddings",
    "tgt_pos": "embeddings",
    "encoder_layers": "encoder",
    "enc_norm": "encoder",
    "encoder": "encoder",
    "decoder_layers": "decoder",
    "dec_norm": "decoder",
    "cells": "decoder",
    "attention": "decoder",
    "bridge": "decoder",
    "pre_output": "decoder",
    "out_proj": "output",
}


def part_of(name: str) -> str:
    """The part of a parameter named ``name`` (as ``named_parameters`` names it)."""
    top = name.split(".")[0]
    if top not in PART_OF:
        raise ConfigError(f"trainer.freeze: parameter {name} belongs to no part of the model")
    return PART_OF[top]


def freeze(model: nn.Module, parts: Sequence[str]) -> int:
    """Stop the training of ``parts``; returns how many parameters (numbers) they hold. A
    parameter shared by two parts (tied embeddings) is frozen with either."""
    wanted = {str(p) for p in parts}
    if not wanted:
        return 0
    frozen = 0
    for name, param in model.named_parameters(remove_duplicate=False):  # a tied one by each name
        if part_of(name) in wanted and param.requires_grad:
            param.requires_grad_(False)
            frozen += param.numel()
    total = sum(p.numel() for p in model.parameters())
    log.info("trainer.freeze=%s: %s of %s parameters are not trained", sorted(wanted),
             f"{frozen:,}", f"{total:,}")  # fmt: skip
    return frozen
