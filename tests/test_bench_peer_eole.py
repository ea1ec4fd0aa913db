"""Eole as a peer of ``make bench-peers`` (benchmarks.peer_eole): its training config and the
reading of its logs, with recorded logs of real 30-update runs; no Eole install needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks import peer_eole
from benchmarks.peers_common import TrainJob, Workspace, window_stats

LOGS = Path(__file__).resolve().parent / "data" / "peers"

# one update per line: tokens = tgt bsz, seconds = tokens / tgt tok/s (hand-read from the logs)
HAND = {
    "fp32": (7, 2869.0, 233.0),
    "bf16": (7, 2869.0, 391.0),
}


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_recorded_log_has_one_window_per_update(name: str) -> None:
    windows = peer_eole.parse_train_log((LOGS / f"eole-transformer-{name}.log").read_text())
    assert [w.step for w in windows] == list(range(1, 31))
    assert all(w.steps == 1 for w in windows)
    assert all(w.tgt_tokens > 0 and w.seconds > 0 and w.tokens_per_s > 0 for w in windows)
    step, tokens, rate = HAND[name]
    window = windows[step - 1]
    assert window.tgt_tokens == tokens
    assert window.tokens_per_s == pytest.approx(rate)
    assert window.seconds == pytest.approx(tokens / rate)
    stats = window_stats(windows, skip_steps=5)
    assert stats["timed_windows"] == 25 and stats["first_timed_step"] == 6


def _line(step: int, bsz: str, rates: str) -> str:
    return (
        f"[2026-12-06 19:06:25,407 INFO] Step {step:2d}/   20; acc: 0.0; ppl: 8078.19; "
        "xent: 9.00; aux: 0.000; mtp: 0.000; attn_ent: 3.058; lr: 1.25e-06; sents:     770; "
        f"bsz: {bsz}; {rates} tok/s;     13 sec;"
    )


def test_windows_of_several_updates_start_from_step_zero() -> None:
    text = "\n".join(
        [
            "[2026-12-06 19:06:12,179 INFO] Start training loop without validation...",
            _line(5, "3696/3500/154", "1000/2000"),
            "[2026-12-06 19:06:30,000 WARNING] something else",
            _line(10, "3000/3200/150", "900/800"),
        ]
    )
    windows = peer_eole.parse_train_log(text)
    assert [(w.step, w.steps) for w in windows] == [(5, 5), (10, 5)]
    assert windows[0].tgt_tokens == 17500 and windows[0].seconds == pytest.approx(8.75)
    assert windows[1].tgt_tokens == 16000 and windows[1].seconds == pytest.approx(20.0)
    assert windows[1].tokens_per_s == pytest.approx(800)


def test_a_log_without_step_lines_is_refused() -> None:
    with pytest.raises(ValueError, match="no 'Step N/M"):
        peer_eole.parse_train_log("[2026-12-06 19:06:12,179 INFO] Building model...\n")
    backwards = "\n".join([_line(5, "1/2/3", "4/5"), _line(5, "1/2/3", "4/5")])
    with pytest.raises(ValueError, match="does not follow"):
        peer_eole.parse_train_log(backwards)


def _workspace(tmp_path: Path) -> Workspace:
    data = tmp_path / "ws" / "data"
    data.mkdir(parents=True)
    for lang in ("de", "en"):
        (data / f"train.{lang}").write_text("eins\nzwei\ndrei\n")
    return Workspace(tmp_path / "ws")


@pytest.mark.parametrize(("precision", "dtype"), [("32", "fp32"), ("bf16", "bf16")])
def test_train_command_writes_the_config(tmp_path: Path, precision: str, dtype: str) -> None:
    ws = _workspace(tmp_path)
    job = TrainJob("transformer", precision, 40, 3500, 2, tmp_path / "work", log_every=5, seed=7)
    python = tmp_path / "venv" / "bin" / "python"
    cmd = peer_eole.train_command(python, job, ws)
    config_path = job.work / "eole.yaml"
    assert cmd.argv == [str(python.parent / "eole"), "train", "-config", str(config_path)]
    assert cmd.cwd == job.work and cmd.log == job.work / "train.log"
    assert cmd.env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}

    cfg = yaml.safe_load(config_path.read_text())
    assert cfg["seed"] == 7 and cfg["report_every"] == 5
    assert cfg["src_vocab"] == str(ws.spm_vocab) and cfg["share_vocab"] is True
    assert [cfg[f"{k}_token"] for k in ("unk", "pad", "bos", "eos")] == [
        "<unk>",
        "<pad>",
        "<s>",
        "</s>",
    ]
    corpus = cfg["data"]["corpus_1"]
    assert corpus["path_src"] == str(ws.text("train", "de"))
    assert corpus["path_tgt"] == str(ws.text("train", "en"))
    assert corpus["transforms"] == ["sentencepiece"]
    assert set(cfg["data"]) == {"corpus_1"}  # no validation corpus
    spm_cfg = cfg["transforms_configs"]["sentencepiece"]
    assert spm_cfg["src_subword_model"] == spm_cfg["tgt_subword_model"] == str(ws.spm_model)

    model = cfg["model"]
    assert model["architecture"] == "transformer"
    assert (model["hidden_size"], model["layers"], model["heads"], model["transformer_ff"]) == (
        256,
        3,
        4,
        1024,
    )
    assert model["share_embeddings"] and model["share_decoder_embeddings"]
    assert model["embeddings"] == {
        "word_vec_size": 256,
        "position_encoding_type": "SinusoidalInterleaved",
    }

    train = cfg["training"]
    assert train["train_steps"] == 40 and train["valid_steps"] > 40
    assert train["save_checkpoint_steps"] == 0 and train["gpu_ranks"] == []
    assert train["batch_type"] == "tokens" and train["batch_size"] == round(3500 / 0.81)
    assert train["accum_count"] == [1] and train["num_workers"] == 0
    assert train["bucket_size"] == 3  # the training corpus' lines: one pass per bucket
    assert train["compute_dtype"] == dtype and train["use_amp"] is True
    assert train["dropout"] == [0.1] and train["label_smoothing"] == 0.1
    assert (train["adam_beta1"], train["adam_beta2"]) == (0.9, 0.98)
    peak = train["learning_rate"] * 256**-0.5 * train["warmup_steps"] ** -0.5
    assert peak == pytest.approx(1e-3)


def test_only_the_offered_models_and_precisions(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    assert peer_eole.PRECISIONS == {"transformer": ("32", "bf16")}
    assert peer_eole.REQUIREMENTS[0] == ("torch==2.13.0",)
    assert peer_eole.REQUIREMENTS[1][0] == "eole==0.6.4"
    for model, precision in [("gru", "32"), ("transformer", "16")]:
        job = TrainJob(model, precision, 10, 3500, 2, tmp_path / model)
        with pytest.raises(ValueError, match="eole offers no"):
            peer_eole.train_command(tmp_path / "python", job, ws)
