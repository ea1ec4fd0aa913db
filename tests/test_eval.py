"""Evaluation, translation and checkpoint averaging on a small run built from real Multi30k
sentences: checkpoints with random weights are written the way the trainer writes them."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU, CHRF

from nmt.config import ConfigError, to_container
from nmt.data.corpus import DataError
from nmt.data.datasets import load_valid_set, prepare_data
from nmt.decode.translate import translate
from nmt.evaluate.metrics import bleu, chrf
from nmt.evaluate.scoring import evaluate
from nmt.evaluate.tune_decode import (
    RUN_DECODE,
    Setting,
    apply_to_run,
    candidates,
    choose,
    default_setting,
    parse_numbers,
    tune,
)
from nmt.evaluate.tune_decode import main as tune_main
from nmt.store.average import average_checkpoints, last_checkpoints
from nmt.store.average import run as average_run
from nmt.store.checkpoint import load_checkpoint, save_checkpoint
from nmt.store.gate import CheckpointError
from nmt.store.loading import build_model, load_trained
from nmt.store.paths import checkpoint_path, chosen_checkpoint

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
def run_dir(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with checkpoints step 10 and 20 (best.pt = step 20)."""
    root = tmp_path_factory.mktemp("eval")
    corpus = write_subset(multi30k, root / "corpus", "train", N_PAIRS)
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
def pairs(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:
    """Two user file pairs with the same file names, the first with an empty source line."""
    root = tmp_path_factory.mktemp("pairs")
    a = write_subset(multi30k, root / "a", "val", 6)
    b = write_subset(multi30k, root / "b", "test_2016_flickr", 4)
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
    assert "95% confidence intervals: sacreBLEU bootstrap, 1000 resamples, seed 12345" in out
    for start, with_ci in (("BLEU =", "case:mixed"), ("chrF2 =", "chrF2"), ("TER =", "")):
        lines = [line for line in out.splitlines() if line.strip().startswith(start)]
        assert {"95% CI [" in line for line in lines if with_ci in line} == {bool(with_ci)}
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
        for metric in ("BLEU", "chrF2"):
            ci = entry["scores"][metric]["ci"]
            assert ci["resamples"] == 1000 and ci["seed"] == 12345
            assert ci["low"] <= ci["mean"] <= ci["high"]
        assert entry["scores"]["TER"]["ci"] is None
        assert entry["scores"]["BLEU-lc"]["score"] >= entry["scores"]["BLEU"]["score"]
    first = Path(report["sets"]["x.de"]["hypotheses"])
    assert first.parent == run_dir / "eval" and first.name == "x.de.best.beam3.lp0.6.hyp"
    assert first.read_text(encoding="utf-8").split("\n")[2] == ""  # the empty source line
    saved = json.loads((run_dir / "eval" / "scores.best.beam3.lp0.6.json").read_text())
    assert saved["sets"]["x.de.2"]["sentences"] == 4


def test_eval_scores_a_split_of_the_runs_corpus_by_its_name(
    run_dir: Path, pairs, tmp_path: Path
) -> None:
    """``test=[NAME]``: a split named as data.test names it (here a file prefix of the run's
    parallel corpus; for Multi30k a split such as test_2017_flickr), decoded as its files."""
    src, ref = pairs[1]
    reports = [
        evaluate(compose_config("eval", [f"run={run_dir}", f"test=[{spec}]", f"out={out}"]))
        for spec, out in ((src.with_suffix(""), tmp_path / "a"), (f"{src}:{ref}", tmp_path / "b"))
    ]
    (name, by_name), (_, by_files) = (next(iter(r["sets"].items())) for r in reports)
    assert name == "x"
    hyps = [Path(e["hypotheses"]).read_text(encoding="utf-8") for e in (by_name, by_files)]
    assert hyps[0] == hyps[1] and len(hyps[0].splitlines()) == 4


def test_eval_defaults_to_the_runs_test_split(run_dir: Path, capsys) -> None:
    report = evaluate(compose_config("eval", [f"run={run_dir}", "max_output_len_b=2"]))
    assert report["sets"][f"train0_{N_PAIRS}"]["sentences"] == N_PAIRS
    assert (run_dir / "eval" / "scores.best.beam1.json").is_file()


def test_split_valid_scores_the_runs_validation_split_apart_from_the_test_results(
    run_dir: Path, multi30k: Path, tmp_path: Path
) -> None:
    trained = load_trained(run_dir / "checkpoints" / "best.pt", torch.device("cpu"))
    cfg = OmegaConf.create(to_container(trained.cfg))
    cfg.data.valid = str(write_subset(multi30k, tmp_path / "corpus", "val", 7))
    run = tmp_path / "run"
    write_checkpoint(cfg, trained.tokenizers, 30, run / "checkpoints" / "best.pt", seed=0)
    overrides = [f"run={run}", "max_output_len_b=2"]
    report = evaluate(compose_config("eval", [*overrides, "split=valid"]))
    assert [entry["sentences"] for entry in report["sets"].values()] == [7]
    assert (run / "eval-valid" / "scores.best.beam1.json").is_file()
    assert not (run / "eval").exists()  # the test results' folder is not touched
    test = evaluate(compose_config("eval", overrides))
    assert [entry["sentences"] for entry in test["sets"].values()] == [N_PAIRS]
    with pytest.raises(ConfigError, match="split=valid .* give one of them"):
        evaluate(
            compose_config(
                "eval",
                [*overrides, "split=valid", f"test=[{cfg.data.valid}.de:{cfg.data.valid}.en]"],
            )
        )


def test_eval_rejects_a_pair_of_different_lengths(run_dir: Path, pairs) -> None:
    (src, _), (_, ref) = pairs
    with pytest.raises(DataError, match="6 lines but .* has 4"):
        evaluate(compose_config("eval", [f"run={run_dir}", f"test=[{src}:{ref}]"]))
    with pytest.raises(ConfigError, match="beam=0"):
        evaluate(compose_config("eval", [f"run={run_dir}", "beam=0"]))
    with pytest.raises(ConfigError, match="bootstrap=20: use 0"):
        evaluate(compose_config("eval", [f"run={run_dir}", "bootstrap=20"]))


def test_bootstrap_interval_holds_the_score_and_follows_its_seed() -> None:
    refs = reference_sentences()
    hyps = damaged(refs, 2, seed=3)
    score = bleu(hyps, refs, resamples=1000)
    assert score.ci is not None and score.ci.low < score.score < score.ci.high
    assert 1 < score.ci.high - score.ci.low < 20  # 150 sentences: a few BLEU either way
    assert score.ci.text() == f"95% CI [{score.ci.low:.2f}, {score.ci.high:.2f}]"
    assert bleu(hyps, refs, resamples=1000).ci == score.ci  # seeded: the same resamples
    assert bleu(hyps, refs, resamples=1000, seed=5).ci != score.ci
    assert "bs:" not in score.signature  # the score's own signature, as without resampling
    assert bleu(hyps, refs).ci is None and bleu(hyps, refs).score == score.score
    char = chrf(hyps, refs, resamples=200)
    assert char.ci.low < char.score < char.ci.high and char.ci.resamples == 200
    assert "95% CI [" in char.line()


def test_bootstrap_intervals_are_sacrebleus_and_hold_when_some_resamples_score_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refs = reference_sentences()
    hyps = damaged(refs, 2, seed=3)
    monkeypatch.setenv("SACREBLEU_SEED", "7")  # sacreBLEU's own estimate reads its seed here
    for ours, metric in ((bleu(hyps, refs, resamples=500, seed=7), BLEU()),
                         (chrf(hyps, refs, resamples=500, seed=7), CHRF())):  # fmt: skip
        theirs = metric.corpus_score(hyps, [refs], n_bootstrap=500)
        assert ours.ci.mean == pytest.approx(theirs._mean, abs=1e-4)
        assert ours.ci.half_width == pytest.approx(theirs._ci, abs=1e-4)
    # one sentence of seven shares characters with its reference: many resamples score 0
    hyps = ["Ein Mann", *["q"] * 6]
    score = chrf(hyps, refs[:7], resamples=200)
    assert score.ci is not None and score.ci.low <= score.score <= score.ci.high
    assert score.ci.low < score.ci.high


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


def run_config(payload: dict, seed: int, **decode: float) -> str:
    """The config.yaml of the checkpoint's run, with this seed and these decode settings."""
    config = {**payload["config"], "trainer": {**payload["config"]["trainer"], "seed": seed}}
    config["decode"] = {**config["decode"], **decode}
    return yaml.safe_dump(config)


def copy_run(run_dir: Path, tmp_path: Path, beam: int) -> tuple[Path, dict, str]:
    """A new run holding the best checkpoint of ``run_dir``, decoding with ``beam``, alpha 1;
    returns it, the checkpoint's payload and the text of its config.yaml."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    payload = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    save_checkpoint(payload, run / "checkpoints" / "best.pt")
    config_text = run_config(payload, seed=1, beam=beam, length_penalty=1.0)
    (run / "config.yaml").write_text(config_text)
    return run, payload, config_text


def test_tune_decode_scores_each_setting_on_validation(run_dir: Path, tmp_path: Path) -> None:
    """Real decoding of the validation split: greedy once, the run's beam search as the
    default, each row with its interval, p-value and length ratio; config.yaml is only
    rewritten for a significant winner."""
    run, payload, config_text = copy_run(run_dir, tmp_path, beam=2)
    report = tune(run, None, [1, 2, 2], [0.5, 1.0], "cpu", apply=True)
    settings = {(r["beam"], r["length_penalty"]) for r in report["rows"]}
    assert settings == {(1, None), (2, 0.5), (2, 1.0)}  # greedy once, duplicates dropped
    assert report["default"] == {"beam": 2, "length_penalty": 1.0, "source": RUN_DECODE}
    bleus = [r["BLEU"] for r in report["rows"]]
    assert bleus == sorted(bleus, reverse=True)
    for r in report["rows"]:
        assert r["ci"]["low"] <= r["ci"]["high"] and r["length_ratio"] >= 0
        assert (r["p_value"] is None) == r["default"]
    assert report["test"]["resamples"] == 1000 and report["test"]["seed"] == 12345
    assert report["test"]["threshold"] == pytest.approx(0.05 / 2)
    saved = json.loads(Path(report["written"]).read_text())
    assert saved["rows"] == report["rows"] and saved["reason"] == report["reason"]
    if report["changed"]:
        assert OmegaConf.load(run / "config.yaml").decode.beam == report["chosen"]["beam"]
    else:
        assert (run / "config.yaml").read_text() == config_text
    apply_to_run(run, 3, 0.7)  # nmt-eval and nmt-translate follow the applied decoding
    valid = payload["config"]["data"]["valid"]
    applied = evaluate(compose_config("eval", [f"run={run}", f"test=[{valid}.de:{valid}.en]"]))
    assert applied["options"]["beam"] == 3 and applied["options"]["length_penalty"] == 0.7
    assert OmegaConf.load(run / "config.yaml").trainer.seed == 1  # the rest is kept
    # the greedy row is the BLEU nmt-eval gives for the validation files with beam=1
    ref = evaluate(
        compose_config("eval", [f"run={run}", f"test=[{valid}.de:{valid}.en]", "beam=1"])
    )
    greedy = next(r for r in report["rows"] if r["beam"] == 1)
    assert greedy["BLEU"] == pytest.approx(ref["sets"]["train0_200.de"]["scores"]["BLEU"]["score"])
    outside = tmp_path / "elsewhere.pt"  # a checkpoint file kept outside the run
    save_checkpoint(payload, outside)
    report = tune(run, str(outside), [1], [1.0], "cpu")
    assert Path(report["written"]).parent == run / "eval"
    with pytest.raises(ConfigError, match="--alphas"):
        parse_numbers("0.6,x", float, "--alphas")


# ------------------------------------------------- tune-decode: the significance rule

WORDS = (
    "man woman dog child girl boy street red blue ball park water runs sits plays jumps "
    "holds looks near small big young old green yellow bike beach crowd shirt hat"
)


def reference_sentences(n: int = 150) -> list[str]:
    rng, words = random.Random(7), WORDS.split()
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(7, 12))).capitalize() + "."
        for _ in range(n)
    ]


def damaged(refs: list[str], words: int, seed: int) -> list[str]:
    """Each reference with ``words`` of its words replaced by a wrong one."""
    rng, out = random.Random(seed), []
    for sentence in refs:
        tokens = sentence[:-1].split()
        for i in rng.sample(range(len(tokens)), words):
            tokens[i] = "thing"
        out.append(" ".join(tokens) + ".")
    return out


def repaired(hyps: list[str], refs: list[str], n: int) -> list[str]:
    """``hyps`` with its first ``n`` sentences replaced by their references."""
    return refs[:n] + hyps[n:]


DEFAULT, WIDE, HAIR, LONG = (Setting.of(5, a) for a in (1.0, 0.6, 1.5, 2.0))


def test_a_wide_margin_wins_and_a_hair_does_not() -> None:
    refs = reference_sentences()
    default = damaged(refs, 3, seed=1)
    hyps = {
        DEFAULT: default,
        WIDE: damaged(refs, 1, seed=2),  # two words in three fixed: some 40 BLEU better
        HAIR: repaired(default, refs, 1),  # one sentence of 150 fixed
        LONG: [s[:-1] + " on a sunny day." for s in default],  # longer than the references
    }
    report = choose(hyps, refs, DEFAULT)
    rows = {Setting(r["beam"], r["length_penalty"]): r for r in report["rows"]}
    assert report["chosen"] == {"beam": 5, "length_penalty": 0.6} and report["changed"]
    assert report["reason"].startswith("changed to beam 5 alpha 0.6")
    assert report["test"]["comparisons"] == 3
    assert report["test"]["threshold"] == pytest.approx(0.05 / 3)
    assert rows[WIDE]["significant"] and rows[WIDE]["p_value"] < 0.05 / 3
    hair, base = rows[HAIR], rows[DEFAULT]
    assert hair["BLEU"] > base["BLEU"]  # better, by a hair ...
    assert not hair["significant"] and hair["p_value"] > 0.05  # ... which proves nothing
    assert rows[LONG]["length_ratio"] > 1.2 and base["length_ratio"] == pytest.approx(1.0)
    assert not rows[LONG]["significant"]  # significantly different, but worse
    for r in report["rows"]:
        assert r["ci"]["low"] < r["BLEU"] < r["ci"]["high"]
        assert r["ci"]["resamples"] == 1000 and r["ci"]["seed"] == 12345
    assert base["p_value"] is None and base["default"]
    # the hair alone against the default: kept, and the report says why
    kept = choose({DEFAULT: default, HAIR: hyps[HAIR]}, refs, DEFAULT)
    assert not kept["changed"] and kept["chosen"] == {"beam": 5, "length_penalty": 1.0}
    assert "kept the default (beam 5 alpha 1" in kept["reason"]
    assert "beam 5 alpha 1.5" in kept["reason"] and "not significantly better" in kept["reason"]


def test_more_settings_need_a_smaller_p_value() -> None:
    """Bonferroni: a margin that wins against the default alone does not win when four
    more settings were tried."""
    refs = reference_sentences()
    default = damaged(refs, 3, seed=1)
    better = repaired(default, refs, 4)  # four sentences of 150 fixed: about +2 BLEU
    alone = choose({DEFAULT: default, WIDE: better}, refs, DEFAULT)
    p = alone["rows"][1]["p_value"]
    assert 0.05 / 5 < p < 0.05 and alone["changed"]
    tried = {Setting.of(5, a): default for a in (0.2, 0.4, 0.8, 1.2)}
    many = choose({DEFAULT: default, WIDE: better, **tried}, refs, DEFAULT)
    assert many["rows"][1]["p_value"] == pytest.approx(p)  # the same resamples
    assert many["test"]["threshold"] == pytest.approx(0.01) and not many["changed"]
    assert all(r["p_value"] == 1.0 for r in many["rows"][2:])  # identical output: p = 1
    with pytest.raises(ConfigError, match="--bootstrap=100 cannot give a p-value below"):
        choose({DEFAULT: default, **tried}, refs, DEFAULT, resamples=100, level=0.01)
    with pytest.raises(ConfigError, match="--bootstrap-seed=0"):
        choose({DEFAULT: default}, refs, DEFAULT, seed=0)


def test_the_default_is_the_runs_beam_search_else_beam_5_alpha_1() -> None:
    assert default_setting(OmegaConf.create({"beam": 4, "length_penalty": 0.6}))[0] == (
        Setting(4, 0.6)
    )
    assert default_setting(OmegaConf.create({"beam": 1, "length_penalty": 1.5}))[0] == DEFAULT
    assert default_setting(None)[0] == DEFAULT
    assert candidates([1, 5], [1.0, 1.5], Setting(4, 0.6)) == [
        Setting(4, 0.6),
        Setting(1, None),
        DEFAULT,
        HAIR,
    ]


@pytest.fixture
def fake_decoding(monkeypatch: pytest.MonkeyPatch):
    """tune-decode with the validation split decoded into given hypotheses: ``outputs`` maps
    (beam, alpha) to a function of the references."""
    outputs: dict = {}
    seen: dict = {}

    def load(data, tokenizers, source):
        seen["valid"] = load_valid_set(data, tokenizers, source)
        return seen["valid"]

    def translate(model, data, tokenizer, opts, device):
        return outputs[(opts.beam, opts.length_penalty)](list(seen["valid"].ref_text))

    monkeypatch.setattr("nmt.evaluate.tune_decode.load_valid_set", load)
    monkeypatch.setattr("nmt.evaluate.tune_decode.translate_dataset", translate)
    return outputs


def test_apply_writes_only_a_significant_winner(
    run_dir: Path, tmp_path: Path, fake_decoding, capsys
) -> None:
    run, payload, config_text = copy_run(run_dir, tmp_path, beam=5)

    def worse(refs: list[str]) -> list[str]:
        return [" ".join(r.split()[:-3]) for r in refs]  # the last three words lost

    fake_decoding[(5, 1.0)] = worse
    fake_decoding[(5, 0.6)] = lambda refs: repaired(worse(refs), refs, 1)  # a hair better
    argv = [str(run), "--beams", "5", "--alphas", "1,0.6", "--device", "cpu", "--apply"]
    tune_main(argv)
    out = capsys.readouterr().out
    assert (run / "config.yaml").read_text() == config_text  # byte-identical
    assert "kept the default (beam 5 alpha 1" in out and "nothing applied" in out
    assert "95% CI" in out and "len ratio" in out and "1000 resamples, seed 12345" in out
    report = json.loads((run / "eval" / "tune_decode.best.json").read_text())
    assert not report["applied"] and not report["changed"] and report["apply"]
    hair = next(r for r in report["rows"] if not r["default"])
    assert hair["p_value"] > 0.05 and hair["BLEU"] > report["rows"][-1]["BLEU"]
    assert hair["length_ratio"] < 1 and "ci" in hair

    fake_decoding[(5, 0.6)] = lambda refs: refs  # the references themselves: far better
    tune_main(argv[:-1])  # without --apply: named, not written
    out = capsys.readouterr().out
    assert "changed to beam 5 alpha 0.6" in out and "(--apply to make beam 5 alpha 0.6" in out
    assert (run / "config.yaml").read_text() == config_text
    tune_main([*argv, "--bootstrap", "500", "--bootstrap-seed", "7"])
    out = capsys.readouterr().out
    assert "changed to beam 5 alpha 0.6" in out and "--apply: beam 5 alpha 0.6 written" in out
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.decode.length_penalty == 0.6 and saved.decode.beam == 5
    assert saved.trainer.seed == 1
    report = json.loads((run / "eval" / "tune_decode.best.json").read_text())
    assert report["applied"] and report["chosen"] == {"beam": 5, "length_penalty": 0.6}
    assert report["test"]["resamples"] == 500 and report["test"]["seed"] == 7
    assert report["rows"][0]["p_value"] < 0.05 and report["rows"][0]["significant"]
