"""Evaluation, translation and checkpoint averaging on a small run built from real Multi30k
sentences: checkpoints with random weights are written the way the trainer writes them."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from nmt.average import average_checkpoints, last_checkpoints
from nmt.average import run as average_run
from nmt.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from nmt.config import ConfigError, to_container
from nmt.data.corpus import DataError
from nmt.data.prepare import prepare_data
from nmt.evaluate import evaluate
from nmt.inference import build_model, checkpoint_path, chosen_checkpoint, load_trained
from nmt.metrics import bleu
from nmt.translate import translate
from nmt.tune_decode import apply_to_run, parse_numbers, tune

from .helpers import compose_config, corpus_overrides, write_subset

N_PAIRS = 200
TINY = [
    "model=transformer",
    "model.d_model=32",
    "model.heads=2",
    "model.d_ff=64",
    "model.enc_layers=1",
    "model.dec_layers=1",
    "model.max_positions=256",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def write_checkpoint(cfg, tokenizers, step: int, path: Path, seed: int) -> None:
    """A checkpoint of a freshly initialised model, with the trainer's payload keys."""
    torch.manual_seed(seed)
    model = build_model(cfg, tokenizers)
    payload = {
        "model": model.state_dict(),
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "scaler": None,
        "state": {"step": step},
        "config": to_container(cfg),
        "tokenizers": tokenizers.state_dict(),
    }
    save_checkpoint(payload, path)


@pytest.fixture(scope="module")
def run_dir(mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with checkpoints step 10 and 20 (best.pt = step 20)."""
    root = tmp_path_factory.mktemp("eval")
    corpus = write_subset(mirror, root / "corpus", "train", N_PAIRS)
    cfg = compose_config(
        "train",
        [*corpus_overrides(corpus, root), *TINY],
    )
    tokenizers = prepare_data(cfg.data).tokenizers
    run = root / "run"
    for seed, step in enumerate((10, 20)):
        write_checkpoint(cfg, tokenizers, step, run / "checkpoints" / f"step_{step:08d}.pt", seed)
    os.link(run / "checkpoints" / "step_00000020.pt", run / "checkpoints" / "best.pt")
    return run


@pytest.fixture(scope="module")
def pairs(mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:
    """Two user file pairs with the same file names, the first with an empty source line."""
    root = tmp_path_factory.mktemp("pairs")
    a = write_subset(mirror, root / "a", "val", 6)
    b = write_subset(mirror, root / "b", "test_2016_flickr", 4)
    lines = Path(f"{a}.de").read_text(encoding="utf-8").split("\n")
    lines[2] = ""
    Path(f"{a}.de").write_text("\n".join(lines), encoding="utf-8")
    (root / "b" / "x.de").write_text(Path(f"{b}.de").read_text(encoding="utf-8"))
    (root / "b" / "x.en").write_text(Path(f"{b}.en").read_text(encoding="utf-8"))
    (root / "a" / "x.de").write_text(Path(f"{a}.de").read_text(encoding="utf-8"))
    (root / "a" / "x.en").write_text(Path(f"{a}.en").read_text(encoding="utf-8"))
    return [(root / d / "x.de", root / d / "x.en") for d in ("a", "b")]


# ------------------------------------------------------------------------------- eval


def test_eval_on_user_file_pairs(run_dir: Path, pairs, capsys) -> None:
    spec = ",".join(f"{s}:{r}" for s, r in pairs)
    cfg = compose_config(
        "eval", [f"run={run_dir}", f"test=[{spec}]", "beam=3", "length_penalty=0.6"]
    )
    report = evaluate(cfg)
    out = capsys.readouterr().out
    assert "beam=3" in out and "length_penalty=0.6" in out
    for metric in ("BLEU", "chrF2", "TER"):
        assert metric in out
    assert report["checkpoint"].endswith("best.pt") and report["step"] == 20
    assert report["options"]["beam"] == 3
    assert list(report["sets"]) == ["x.de", "x.de.2"]  # same file names, kept apart
    for name, n in (("x.de", 6), ("x.de.2", 4)):
        entry = report["sets"][name]
        hyps = Path(entry["hypotheses"]).read_text(encoding="utf-8").split("\n")
        assert len(hyps) == n + 1 and hyps[-1] == ""
        assert "nrefs:1|case:mixed|eff:no|tok:13a" in entry["scores"]["BLEU"]["signature"]
        assert set(entry["scores"]) == {"BLEU", "chrF2", "TER", "BLEU-lc"}
        assert "case:lc" in entry["scores"]["BLEU-lc"]["signature"]
        assert entry["scores"]["BLEU-lc"]["score"] >= entry["scores"]["BLEU"]["score"]
    first = Path(report["sets"]["x.de"]["hypotheses"])
    assert first.parent == run_dir / "eval" and first.name == "x.de.best.beam3.lp0.6.hyp"
    assert first.read_text(encoding="utf-8").split("\n")[2] == ""  # the empty source line
    saved = json.loads((run_dir / "eval" / "scores.best.beam3.lp0.6.json").read_text())
    assert saved["sets"]["x.de.2"]["sentences"] == 4


def test_eval_defaults_to_the_runs_test_split(run_dir: Path, capsys) -> None:
    report = evaluate(compose_config("eval", [f"run={run_dir}", "max_output_len_b=2"]))
    assert report["sets"][f"train0_{N_PAIRS}"]["sentences"] == N_PAIRS
    assert (run_dir / "eval" / "scores.best.beam1.json").is_file()


def test_eval_rejects_a_pair_of_different_lengths(run_dir: Path, pairs) -> None:
    (src, _), (_, ref) = pairs
    with pytest.raises(DataError, match="6 lines but .* has 4"):
        evaluate(compose_config("eval", [f"run={run_dir}", f"test=[{src}:{ref}]"]))
    with pytest.raises(ConfigError, match="beam=0"):
        evaluate(compose_config("eval", [f"run={run_dir}", "beam=0"]))


# -------------------------------------------------------------------------- averaging


def test_averaging_two_checkpoints_gives_the_mean(run_dir: Path) -> None:
    paths = last_checkpoints(run_dir, 2)
    assert [p.name for p in paths] == ["step_00000010.pt", "step_00000020.pt"]
    payload = average_checkpoints(paths)
    a, b = (load_checkpoint(p) for p in paths)
    assert payload["state"]["step"] == 20 and payload["config"] == b["config"]
    assert "optimizer" not in payload and "rng" not in payload
    for name, t in payload["model"].items():
        assert t.dtype == a["model"][name].dtype
        if t.is_floating_point():
            torch.testing.assert_close(t, (a["model"][name] + b["model"][name]) / 2)
        else:
            assert torch.equal(t, b["model"][name])
    with pytest.raises(CheckpointError, match="fewer than N=5"):
        last_checkpoints(run_dir, 5)


def test_averaged_checkpoint_evaluates(run_dir: Path, pairs) -> None:
    out = average_run([str(run_dir), "-n", "2"])
    assert out == run_dir / "checkpoints" / "averaged.pt"
    assert load_trained(out, torch.device("cpu")).step == 20
    src, ref = pairs[1]
    cfg = compose_config("eval", [f"run={run_dir}", f"ckpt={out}", f"test=[{src}:{ref}]"])
    report = evaluate(cfg)
    assert report["checkpoint"] == str(out)
    assert (run_dir / "eval" / "x.de.averaged.beam1.hyp").is_file()


# -------------------------------------------------------------------------- translate


def test_translate_a_file_with_an_empty_and_a_very_long_line(run_dir: Path, tmp_path) -> None:
    long_line = " ".join(["Ein Hund läuft über eine grüne Wiese."] * 60)  # ~ 500 tokens
    src = tmp_path / "in.de"
    src.write_text(f"Zwei Männer spielen Fußball.\n\n{long_line}\n   \nEin Hund.\n")
    out = tmp_path / "out.en"
    overrides = [f"run={run_dir}", f"input={src}", f"output={out}", "max_output_len_a=0.5"]
    translate(compose_config("translate", [*overrides, "beam=2"]))
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 6 and lines[-1] == ""
    assert lines[1] == "" and lines[3] == ""
    assert lines[0] and lines[2] and lines[4]


def test_translate_stdin_to_stdout_with_n_best(run_dir: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("Ein Mann.\n\nZwei Frauen.\n"))
    cfg = compose_config(
        "translate", [f"run={run_dir}", "beam=3", "n_best=2", "max_output_len_b=3"]
    )
    translate(cfg)
    rows = [line.split("\t") for line in capsys.readouterr().out.rstrip("\n").split("\n")]
    assert [int(r[0]) for r in rows] == [0, 0, 1, 2, 2]
    assert rows[2][1:] == ["0.0000", ""]
    assert float(rows[0][1]) >= float(rows[1][1])
    with pytest.raises(ConfigError, match="n_best=4"):
        translate(compose_config("translate", [f"run={run_dir}", "beam=3", "n_best=4"]))


# ------------------------------------------------------------------- the run's decoding


def test_eval_takes_beam_and_checkpoint_from_the_runs_decode_section(
    run_dir: Path, pairs, tmp_path: Path
) -> None:
    """A run trained with decode.beam=3 and decode.checkpoint=last is scored that way by
    default; explicit options still win."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    payload = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    payload["config"]["decode"] = {"beam": 3, "length_penalty": 0.6, "checkpoint": "last"}
    save_checkpoint(payload, run / "checkpoints" / "step_00000020.pt")
    os.link(run / "checkpoints" / "step_00000020.pt", run / "checkpoints" / "last.pt")
    save_checkpoint(payload, run / "checkpoints" / "best.pt")
    (run / "config.yaml").write_text(yaml.safe_dump(payload["config"]))
    src, ref = pairs[1]
    report = evaluate(compose_config("eval", [f"run={run}", f"test=[{src}:{ref}]"]))
    assert report["options"]["beam"] == 3 and report["options"]["length_penalty"] == 0.6
    assert Path(report["checkpoint"]).name == "last.pt"
    report = evaluate(
        compose_config("eval", [f"run={run}", f"test=[{src}:{ref}]", "beam=1", "ckpt=best"])
    )
    assert report["options"]["beam"] == 1 and Path(report["checkpoint"]).name == "best.pt"


def test_checkpoint_names_resolve_in_the_run_and_unknown_names_list_the_choices(
    run_dir: Path,
) -> None:
    assert checkpoint_path(run_dir, "step_00000010") == run_dir / "checkpoints" / "step_00000010.pt"
    assert checkpoint_path(run_dir, "best.pt") == run_dir / "checkpoints" / "best.pt"
    assert checkpoint_path(run_dir) == run_dir / "checkpoints" / "best.pt"  # runs without decode
    with pytest.raises(CheckpointError, match=r"'step_99'.*best, .*step_00000010"):
        checkpoint_path(run_dir, "step_99")


def test_lowercased_bleu_only_differs_in_case() -> None:
    hyps = ["The Dog runs on the grass .", "A man rides a bike ."]
    refs = ["the dog runs on the grass .", "A man rides a bike ."]
    cased, lowered = bleu(hyps, refs), bleu(hyps, refs, lowercase=True)
    assert lowered.name == "BLEU-lc" and "case:lc" in lowered.signature
    assert lowered.score == pytest.approx(100.0)
    assert cased.score < 100.0


def test_auto_checkpoint_follows_validation_bleu(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert chosen_checkpoint(run, "auto") == "best"  # no summary: the best checkpoint
    (run / "summary.json").write_text(json.dumps({"best_bleu": 40.3, "averaged_bleu": 39.9}))
    assert chosen_checkpoint(run, "auto") == "best"
    (run / "summary.json").write_text(json.dumps({"best_bleu": 40.3, "averaged_bleu": 40.5}))
    assert chosen_checkpoint(run, "auto") == "averaged"
    assert chosen_checkpoint(run, "last") == "last"


def test_tune_decode_scores_each_setting_on_validation_and_applies_the_best(
    run_dir: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    payload = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    save_checkpoint(payload, run / "checkpoints" / "best.pt")
    config = {**payload["config"], "trainer": {**payload["config"]["trainer"], "seed": 1}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    report = tune(run, None, [1, 2, 2], [0.5, 1.0], "cpu", apply=True)
    settings = {(r["beam"], r["length_penalty"]) for r in report["rows"]}
    assert settings == {(1, None), (2, 0.5), (2, 1.0)}  # greedy once, duplicates dropped
    bleus = [r["BLEU"] for r in report["rows"]]
    assert bleus == sorted(bleus, reverse=True)
    best = report["best"]
    assert any(
        r["beam"] == best["beam"] and round(r["BLEU"], 2) == round(bleus[0], 2)
        for r in report["rows"]
    )
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.decode.beam == best["beam"] and saved.decode.checkpoint == "best"
    assert saved.trainer.seed == 1  # the rest of the config is kept
    apply_to_run(run, 3, 0.7)  # nmt-eval and nmt-translate follow the applied decoding
    valid = payload["config"]["data"]["valid"]
    applied = evaluate(compose_config("eval", [f"run={run}", f"test=[{valid}.de:{valid}.en]"]))
    assert applied["options"]["beam"] == 3 and applied["options"]["length_penalty"] == 0.7
    assert Path(report["written"]).is_file()
    # the greedy row is the BLEU nmt-eval gives for the validation files with beam=1
    ref = evaluate(
        compose_config("eval", [f"run={run}", f"test=[{valid}.de:{valid}.en]", "beam=1"])
    )
    greedy = next(r for r in report["rows"] if r["beam"] == 1)
    assert greedy["BLEU"] == pytest.approx(ref["sets"]["train0_200.de"]["scores"]["BLEU"]["score"])
    no_penalty = tune(run, None, [2], [0.0], "cpu")  # alpha 0 (no penalty) is kept as 0
    outside = tmp_path / "elsewhere.pt"  # a checkpoint file kept outside the run
    save_checkpoint(payload, outside)
    report = tune(run, str(outside), [1], [1.0], "cpu")
    assert Path(report["written"]).parent == run / "eval"
    assert no_penalty["best"] == {"beam": 2, "length_penalty": 0.0}
    with pytest.raises(ConfigError, match="--alphas"):
        parse_numbers("0.6,x", float, "--alphas")
