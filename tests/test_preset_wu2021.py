"""experiment=tiny_wu2021: the published Transformer-tiny recipe for Multi30k en->de composes
with the values its header states, and trains, averages and evaluates end to end (a few
updates on a small slice; the full 8,000 updates take hours)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.config_checks import check_train_config
from nmt.evaluate.scoring import evaluate
from nmt.train.optim import schedule_fn

from .helpers import compose_config, corpus_overrides

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_preset_states_the_papers_values() -> None:
    cfg = compose_config("train", ["experiment=tiny_wu2021"])
    check_train_config(cfg)
    data, model, optim, t, dec = cfg.data, cfg.model, cfg.optim, cfg.trainer, cfg.decode
    assert (data.name, data.src_lang, data.tgt_lang) == ("multi30k_en_de", "en", "de")
    assert data.joint_vocab and data.spm_model_type == "bpe" and data.vocab_size == 10000
    assert data.max_tokens == 8192
    assert model.arch == "transformer" and model.tie_embeddings
    assert (model.d_model, model.d_ff, model.heads) == (128, 256, 4)
    assert (model.enc_layers, model.dec_layers) == (4, 4)
    assert (model.dropout, model.attn_dropout, model.act_dropout) == (0.3, 0.0, 0.0)
    assert model.norm_first is False
    assert optim.name == "adam" and optim.schedule == "inverse_sqrt"
    assert (optim.lr, optim.warmup_steps) == (0.005, 2000)
    lr = schedule_fn(optim, t.max_steps)  # fairseq's inverse_sqrt: peak at warmup, then decay
    assert lr(1999) == pytest.approx(1.0) and lr(7999) == pytest.approx(0.5)
    assert (t.max_steps, t.patience) == (8000, 0)
    assert t.average_last == 10 and t.keep_last >= 10
    assert t.max_steps // t.val_every >= t.average_last  # the last 10 checkpoints exist
    assert (dec.beam, dec.length_penalty, dec.checkpoint) == (5, 1.0, "averaged")
    header = (Path(__file__).parents[1] / "configs/experiment/tiny_wu2021.yaml").read_text()
    for difference in ("Subwords:", "Batches:", "Checkpoints:", "Schedule:", "Layers:"):
        assert f"# - {difference}" in header


@pytest.mark.slow(seconds=30)
def test_the_preset_trains_averages_and_evaluates(corpus: Path, tmp_path: Path) -> None:
    """Ten updates on 120 pairs (a validation and checkpoint after each, so that the last 10
    exist to average), then nmt-eval of the averaged weights with the run's beam 5."""
    from nmt.train.command import train

    overrides = [
        "experiment=tiny_wu2021",
        *corpus_overrides(corpus, tmp_path),  # de->en on the slice, vocabulary 600
        "data.max_tokens=600",
        f"outputs={tmp_path / 'outputs'}",
        "trainer.max_steps=10",
        "trainer.val_every=1",
        "trainer.val_sentences=4",
        "trainer.progress=false",
        "trainer.attention_sentences=0",
        "trainer.precision=32",
        "trainer.threads=1",
    ]
    run = tmp_path / "outputs" / "runs" / "wu2021"
    train(compose_config("train", overrides), run)
    assert (run / "checkpoints" / "averaged.pt").is_file()
    cfg = compose_config("eval", [f"run={run}", "bootstrap=0", "progress=false",
                                  "max_output_len_a=0", "max_output_len_b=3"])  # fmt: skip
    report = evaluate(cfg)
    assert report["checkpoint"].endswith("averaged.pt") and report["options"]["beam"] == 5
    (entry,) = report["sets"].values()
    assert entry["sentences"] == 120 and "bleu_paper" in entry
