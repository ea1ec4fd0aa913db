"""Validation during training: loss, perplexity and greedy BLEU / chrF on the validation split,
decoded as ``nmt-eval`` decodes greedily.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

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
from nmt.train.step import LossTerms, loss_sum

# --------------------------------------------------------------------------- validation


@torch.inference_mode()
def loss_and_tokens(
    model: Seq2Seq, ds: EvalSet, cfg: DictConfig, device: torch.device
) -> tuple[float, int]:
    """Summed cross-entropy (no label smoothing) of an evaluation set, and its target tokens."""
    model.eval()
    total, tokens = 0.0, 0
    for idx in eval_batches(ds.data.src_lens, cfg.data.eval_max_tokens, ds.data.tgt_lens):
        batch = make_batch(ds.data, idx).to(device)
        with autocast(str(cfg.trainer.precision), device):
            total += float(loss_sum(model, batch, LossTerms()))
        tokens += batch.n_tgt_tokens
    return total, tokens


def evaluate_loss(model: Seq2Seq, ds: EvalSet, cfg: DictConfig, device: torch.device) -> float:
    """Per-token cross-entropy (no label smoothing) of an evaluation set."""
    total, tokens = loss_and_tokens(model, ds, cfg, device)
    return total / max(tokens, 1)


def direction_set(ds: EvalSet, part: tuple[str, int, int], limit: int = 0) -> EvalSet:
    """One direction's sentences of a multilingual set (its first ``limit``; 0: all)."""
    name, a, b = part
    b = min(b, a + limit) if limit > 0 else b
    data = ds.data.subset(range(a, b))
    return EvalSet(name, ds.src_text[a:b], ds.ref_text[a:b], data, [(name, 0, b - a)])


def drawing_due(history: list[dict[str, Any]], every: int) -> bool:
    """Whether the latest validation of ``history`` draws the attention views in TensorBoard:
    every one (``every`` 0), or the first and then the first at or past each multiple of
    ``every`` updates (``trainer.attention_every``). Read from the validation history, which a
    checkpoint keeps, so a resumed run draws where an unbroken one would."""
    if every <= 0 or len(history) < 2:
        return True
    return history[-1]["step"] // every > history[-2]["step"] // every


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
    """Validation loss, perplexity, and greedy BLEU / chrF on the validation split (of a
    multilingual run: per direction, with their means as ``bleu`` and ``chrf``).

    ``translate`` decodes the split (:func:`nmt.decode.search.translate_dataset`; a test passes
    a spy).
    """
    start = time.perf_counter()
    if data.valid.parts:
        return _per_direction(model, data, cfg, device, translate, start)
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


def _per_direction(
    model: Seq2Seq,
    data: PreparedData,
    cfg: DictConfig,
    device: torch.device,
    translate: Callable[..., list[str]],
    start: float,
) -> dict[str, Any]:
    """A multilingual validation: every direction scored on its own (``directions``), and
    ``bleu`` / ``chrf`` their unweighted means (the checkpoint criterion); ``loss`` per token
    over all directions."""
    opts = validation_options(cfg)
    per: dict[str, dict[str, Any]] = {}
    total, tokens = 0.0, 0
    for part in data.valid.parts:
        ds = direction_set(data.valid, part)
        loss, n = loss_and_tokens(model, ds, cfg, device)
        total, tokens = total + loss, tokens + n
        hyps = translate(
            model, ds.data, data.tokenizers.tgt, opts, device, cfg.trainer.val_sentences
        )
        refs = ds.ref_text[: len(hyps)]
        b, c = bleu(hyps, refs), chrf(hyps, refs)
        per[part[0]] = {
            "loss": loss / max(n, 1),
            "bleu": b.score,
            "chrf": c.score,
            "sentences": len(hyps),
            "bleu_signature": b.signature,
            "chrf_signature": c.signature,
        }
    val_loss = total / max(tokens, 1)
    return {
        "loss": val_loss,
        "ppl": math.exp(min(val_loss, 50.0)),
        "bleu": sum(p["bleu"] for p in per.values()) / len(per),
        "chrf": sum(p["chrf"] for p in per.values()) / len(per),
        "seconds": time.perf_counter() - start,
        "directions": per,
    }
