"""Validation during training: loss, perplexity and greedy BLEU / chrF on the validation split,
decoded as ``nmt-eval`` decodes greedily.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from omegaconf import DictConfig

from nmt.data.batching import eval_batches, make_batch
from nmt.data.datasets import EvalSet, PreparedData
from nmt.decode.options import DecodeOptions
from nmt.decode.search import translate_dataset
from nmt.evaluate.metrics import bleu, chrf
from nmt.models.base import Seq2Seq
from nmt.runtime.device import autocast
from nmt.runtime.precision import (
    validation_decode_precision,
)
from nmt.train.step import loss_sum

# --------------------------------------------------------------------------- validation


@torch.inference_mode()
def evaluate_loss(model: Seq2Seq, ds: EvalSet, cfg: DictConfig, device: torch.device) -> float:
    """Per-token cross-entropy (no label smoothing) of an evaluation set."""
    model.eval()
    total, tokens = 0.0, 0
    for idx in eval_batches(ds.data.src_lens, cfg.data.eval_max_tokens, ds.data.tgt_lens):
        batch = make_batch(ds.data, idx).to(device)
        with autocast(str(cfg.trainer.precision), device):
            total += float(loss_sum(model, batch, 0.0))
        tokens += batch.n_tgt_tokens
    return total / max(tokens, 1)


def validation_options(cfg: DictConfig) -> DecodeOptions:
    """How validation decodes: greedy search with the run's output caps (``decode``), in
    batches of ``data.eval_max_tokens``, in :func:`validation_decode_precision`."""
    return DecodeOptions(
        beam=1,
        max_output_len_a=cfg.decode.max_output_len_a,
        max_output_len_b=cfg.decode.max_output_len_b,
        max_tokens=cfg.data.eval_max_tokens,
        precision=validation_decode_precision(str(cfg.trainer.precision)),
    )


def validation_scores(
    model: Seq2Seq,
    data: PreparedData,
    cfg: DictConfig,
    device: torch.device,
    translate: Callable[..., list[str]] = translate_dataset,
) -> dict[str, float]:
    """Validation loss, perplexity, and greedy BLEU / chrF on the validation split.

    ``translate`` decodes the split (:func:`nmt.decode.search.translate_dataset`; a test passes
    a spy).
    """
    start = time.perf_counter()
    val_loss = evaluate_loss(model, data.valid, cfg, device)
    opts = validation_options(cfg)
    hyps = translate(
        model, data.valid.data, data.tokenizers.tgt, opts, device, cfg.trainer.val_sentences
    )
    refs = data.valid.ref_text[: len(hyps)]
    return {
        "loss": val_loss,
        "ppl": math.exp(min(val_loss, 50.0)),
        "bleu": bleu(hyps, refs).score,
        "chrf": chrf(hyps, refs).score,
        "seconds": time.perf_counter() - start,
    }
