"""Random sampling (``sampling_topk``, ``sampling_topp``, ``sampling_temperature``,
``sampling_seed``): the cuts equal transformers' warpers, whole samples follow the exact
distribution of outputs, a sentence's sample depends on the seed and its line only, a
nucleus too small to hold two tokens is greedy search, the score is the model's
log-probability of the sample, and the commands take and refuse the options as documented."""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import ConfigError, DecodeConfig, ServeConfig
from nmt.data.corpus import read_lines
from nmt.data.datasets import load_valid_set
from nmt.decode.options import DecodeOptions
from nmt.decode.sampling import Sampling, uniforms
from nmt.decode.search import decode_dataset, greedy_search
from nmt.store.loading import load_trained
from nmt.store.paths import checkpoint_path

from .helpers import REPO, compose_config, tiny_run_overrides, write_subset
from .test_search import BOS, EOS, TableModel, table_batch

pytestmark = pytest.mark.usefixtures("one_thread")

CUTS = [  # (topk, topp, temperature)
    (0, 1.0, 1.0),
    (0, 1.0, 0.7),
    (5, 1.0, 1.0),
    (0, 0.9, 1.0),
    (0, 0.5, 1.5),
    (10, 0.8, 0.6),
    (3, 0.3, 2.0),
]


@pytest.mark.parametrize(("topk", "topp", "temperature"), CUTS)
def test_the_cuts_are_transformers_warpers(topk: int, topp: float, temperature: float) -> None:
    """The distribution drawn from equals what transformers' temperature, top-k and top-p
    warpers leave of the same log-probabilities, in the order ``generate`` applies them."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(topk * 100 + int(topp * 10))
    logp = torch.log_softmax(3.0 * torch.randn(16, 200, generator=gen), dim=-1)  # (A, V)
    ours = Sampling(topk, topp, temperature).log_probs(logp).exp()
    scores, ids = logp.clone(), torch.zeros(16, 1, dtype=torch.long)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if topk > 0:
        scores = TopKLogitsWarper(topk)(ids, scores)
    if topp < 1.0:
        scores = TopPLogitsWarper(topp)(ids, scores)
    theirs = torch.softmax(scores, dim=-1)
    assert torch.equal(ours > 0, theirs > 0)  # the same tokens kept
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    if topk > 0:
        assert int((ours[0] > 0).sum()) <= topk


def test_the_uniform_numbers_depend_on_seed_sentence_and_step_alone() -> None:
    lines = np.arange(10_000)
    u = uniforms(7, lines, 3)
    assert u.dtype == np.float64 and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert np.array_equal(uniforms(7, lines[[42, 9, 4_000]], 3), u[[42, 9, 4_000]])
    assert not np.array_equal(uniforms(8, lines, 3), u)
    assert not np.array_equal(uniforms(7, lines, 4), u)
    # neighbouring counters are not correlated
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.05
    assert abs(np.corrcoef(u, uniforms(7, lines, 4))[0, 1]) < 0.05


def exact_outputs(model: TableModel, sid: int, cap: int, sampling: Sampling) -> dict:
    """Every output of at most ``cap`` tokens with its probability under ``sampling``'s cuts
    (EOS forced at the cap, as the search forces it)."""
    words = [t for t in range(model.vocab) if t != EOS]
    out = {}
    for n in range(cap + 1):
        for seq in itertools.product(words, repeat=n):
            q = 1.0
            for i, tok in enumerate(seq):
                q *= float(sampling.log_probs(model.logp(sid, seq[:i])[None])[0, tok].exp())
            if n < cap:
                q *= float(sampling.log_probs(model.logp(sid, seq)[None])[0, EOS].exp())
            if q > 0:
                out[seq] = q
    return out


@pytest.mark.parametrize(("topk", "topp", "temperature"), [(0, 1.0, 1.0), (3, 0.8, 1.3)])
def test_samples_follow_the_distribution_of_whole_outputs(
    topk: int, topp: float, temperature: float
) -> None:
    """6,000 sentences of the same source sampled in one batch: the outputs' frequencies
    agree with their exact probabilities (chi-square), and none is outside the cuts."""
    model, cap, n = TableModel(vocab=5, seed=3), 3, 6_000
    sampling = Sampling(topk, topp, temperature, seed=11)
    src, src_lens = table_batch([1] * n)
    hyps = greedy_search(
        model, src, src_lens, torch.full((n,), cap), BOS, EOS, sampling=sampling,
        sentences=torch.arange(n),
    )  # fmt: skip
    seen = Counter(tuple(h.tokens) for h in hyps)
    exact = exact_outputs(model, 1, cap, sampling)
    assert math.isclose(sum(exact.values()), 1.0, abs_tol=1e-5)
    assert set(seen) <= set(exact)  # nothing the cuts remove is ever drawn
    big = [s for s in exact if exact[s] * n >= 5]  # the chi-square's bins, the rest pooled
    observed = [seen[s] for s in big] + [n - sum(seen[s] for s in big)]
    expected = [exact[s] * n for s in big] + [n * (1 - sum(exact[s] for s in big))]
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    dof = len(observed) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(chi2 / 2.0)))
    assert dof >= 3 and p > 1e-3, (chi2, dof, p)


def test_the_score_is_the_models_log_probability_of_the_sample() -> None:
    model = TableModel(vocab=5, seed=5)
    src, src_lens = table_batch([0, 1, 2, 3])
    caps = torch.tensor([4, 4, 2, 3])
    hyps = greedy_search(model, src, src_lens, caps, BOS, EOS, sampling=Sampling(seed=1))
    for sid, cap, hyp in zip(range(4), caps.tolist(), hyps, strict=True):
        seq = tuple(hyp.tokens)
        want = sum(float(model.logp(sid, seq[:i])[t]) for i, t in enumerate(seq))
        want += float(model.logp(sid, seq)[EOS])
        assert len(seq) <= cap and hyp.score == pytest.approx(want, abs=1e-5)


# ------------------------------------------------------------------ the trained models


def options(**kw) -> DecodeOptions:
    return DecodeOptions.from_config(OmegaConf.structured(DecodeConfig(**kw)))


@pytest.mark.parametrize("arch", ["transformer", "gru_bahdanau"])
def test_a_sample_depends_on_the_seed_and_its_line_only(trained_runs, arch: str) -> None:
    """Samples of the validation set decoded in batches of every size are the same, line for
    line; another seed draws others; a nucleus that holds one token is greedy search."""
    trained = load_trained(checkpoint_path(trained_runs[arch]), torch.device("cpu"))
    data = load_valid_set(trained.cfg.data, trained.tokenizers).data
    cpu = torch.device("cpu")

    def tokens(opts: DecodeOptions) -> list[list[int]]:
        return [h.tokens for h in decode_dataset(trained.model, data, opts, cpu)]

    wide = tokens(options(sampling_topk=0, sampling_seed=5, max_tokens=100_000))
    assert tokens(options(sampling_topk=0, sampling_seed=5, max_tokens=60)) == wide
    assert tokens(options(sampling_topk=0, sampling_seed=6)) != wide
    greedy = tokens(options(beam=1))
    assert wide != greedy
    assert tokens(options(sampling_topk=0, sampling_topp=1e-6, sampling_seed=5)) == greedy


def test_sampling_leaves_a_runs_beam_aside_and_refuses_one_asked_for() -> None:
    run = OmegaConf.create({"beam": 5, "length_penalty": 1.0})
    cfg = OmegaConf.structured(DecodeConfig(sampling_topk=0))
    assert DecodeOptions.from_config(cfg, run).beam == 1
    with pytest.raises(ConfigError, match=r"sampling_topk=0 .* needs beam=1 .*beam=5"):
        DecodeOptions.from_config(OmegaConf.structured(DecodeConfig(sampling_topk=0, beam=5)))
    with pytest.raises(ConfigError, match=r"sampling_topp=0.9 applies to sampling"):
        options(sampling_topp=0.9)
    with pytest.raises(ConfigError, match=r"sampling_temperature=0.5 applies to sampling"):
        options(sampling_temperature=0.5)
    for bad, match in [
        ({"sampling_topk": -1}, r"sampling_topk=-1 must be >= 0"),
        ({"sampling_topk": 0, "sampling_topp": 0.0}, r"sampling_topp=0.0 must be > 0"),
        ({"sampling_topk": 0, "sampling_topp": 1.5}, r"sampling_topp=1.5 must be > 0"),
        ({"sampling_topk": 0, "sampling_temperature": 0.0}, r"sampling_temperature=0.0"),
    ]:
        with pytest.raises(ConfigError, match=match):
            options(**bad)


def run_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


def test_translate_samples_each_line_reproducibly(trained_runs, corpus: Path, tmp_path) -> None:
    """``nmt-translate`` with sampling: the same seed gives the same file, in batches of any
    size; a line's sample does not change with the other lines' text; engine=ctranslate2 and
    a beam are refused by name."""
    run = trained_runs["transformer"]
    lines = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:24]
    src = tmp_path / "src.de"
    src.write_text("\n".join(lines[:12]) + "\n", encoding="utf-8")
    other = tmp_path / "other.de"  # other sentences before the same twelfth line
    other.write_text("\n".join(lines[12:23] + lines[11:12]) + "\n", encoding="utf-8")
    common = ["sampling_topk=0", "sampling_topp=0.95", "sampling_seed=3", "progress=false"]

    def translate(source: Path, out: Path, *extra: str) -> list[str]:
        done = run_command(
            "nmt.decode.translate", f"run={run}", f"input={source}", f"output={out}",
            *common, *extra,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return out.read_text(encoding="utf-8").splitlines()

    first = translate(src, tmp_path / "a.en")
    assert len(first) == 12 and translate(src, tmp_path / "b.en", "max_tokens=50") == first
    greedy = translate(src, tmp_path / "g.en", "sampling_topk=1", "sampling_topp=1")
    assert first != greedy
    assert translate(other, tmp_path / "c.en")[-1] == first[-1]
    refused = run_command(
        "nmt.decode.translate", f"run={run}", f"input={src}", "engine=ctranslate2", *common
    )
    assert refused.returncode != 0
    assert "sampling_topk=0 samples with our search (engine=torch" in refused.stderr
    both = run_command("nmt.decode.translate", f"run={run}", f"input={src}", "beam=4", *common)
    assert both.returncode != 0 and "needs beam=1" in both.stderr


def test_the_server_refuses_sampling_by_name() -> None:
    from nmt.serve.main import check_config

    check_config(OmegaConf.structured(ServeConfig()))
    with pytest.raises(ConfigError, match=r"sampling_topk=0: nmt-serve answers with searched"):
        check_config(OmegaConf.structured(ServeConfig(sampling_topk=0)))


def test_back_translation_trains_on_sampled_sources(
    trained_runs, multi30k: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The workflow of the docs: a de→en model samples English sources for German text it
    was not trained on, and an en→de model trains on the real pairs and the sampled ones,
    each corpus with its share of the epoch."""
    from nmt.train.command import train

    real = write_subset(multi30k, tmp_path / "real", "train", 120)
    mono = write_subset(multi30k, tmp_path / "mono", "train", 60, start=500)
    bt = tmp_path / "bt" / "mono"
    bt.parent.mkdir()
    shutil.copy(f"{mono}.de", f"{bt}.de")
    done = run_command(
        "nmt.decode.translate", f"run={trained_runs['transformer']}", f"input={mono}.de",
        f"output={bt}.en", "sampling_topk=0", "sampling_seed=1", "progress=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sampled = read_lines(f"{bt}.en")  # lines end at "\n" only, as a corpus's do
    assert len(sampled) == 60 and sum(bool(line.strip()) for line in sampled) >= 55
    caplog.set_level(logging.INFO)
    overrides = tiny_run_overrides(
        real, tmp_path, "trainer.max_steps=3", "trainer.val_every=100", "trainer.threads=1",
        "data.src_lang=en", "data.tgt_lang=de", f"data.train=[{real},{bt}:0.5]",
    )  # fmt: skip
    result = train(compose_config("train", overrides), tmp_path / "run")
    assert result["state"]["step"] == 3
    # a few sampled sources fail the length filter, as noisy pairs of any corpus do
    kept = re.search(r"corpus mono: (\d+) pairs x weight 0\.5 = \d+ per epoch", caplog.text)
    assert kept is not None and 40 <= int(kept.group(1)) <= 60


def test_eval_scores_a_sampled_decode_under_its_own_name(trained_runs, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    done = run_command(
        "nmt.evaluate", f"run={trained_runs['gru_bahdanau']}", f"out={out}",
        "sampling_topk=0", "sampling_topp=0.9", "progress=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "scores.best.sample.k0.p0.9.t1.seed0.json").read_text())
    assert report["options"]["sampling_topk"] == 0 and report["options"]["beam"] == 1
    assert not list(out.glob("scores.best.beam*"))


def test_sampling_decodes_with_our_search_and_ctranslate2_refuses_it(
    trained_runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine=auto samples with torch without probing the engines; engine=ctranslate2, on a
    package with both models or with CTranslate2's only, refuses by name."""
    from nmt.decode.engines import TorchEngine, make_engine
    from nmt.ship.export import export_package
    from nmt.store.loading import load_model, load_package

    ckpt = checkpoint_path(trained_runs["transformer"])
    both = export_package(ckpt, tmp_path / "both", fmt="ctranslate2", quantize="int8")
    only = export_package(
        ckpt, tmp_path / "only", fmt="ctranslate2", quantize="int8", ctranslate2_only=True
    )
    monkeypatch.setattr("nmt.decode.engines.auto_choice", None)  # a probe would fail
    cpu, opts = torch.device("cpu"), DecodeOptions(sampling_topk=0)
    package = load_package(both, cpu)
    assert type(make_engine("auto", package, opts, cpu)) is TorchEngine
    with pytest.raises(ConfigError, match=r"sampling_topk=0 samples with our search"):
        make_engine("ctranslate2", package, opts, cpu)
    args = [f"model_dir={only}", "engine=ctranslate2"]
    bare = load_model(compose_config("translate", args), cpu)
    assert bare.model is None
    for name in ("ctranslate2", "auto"):
        with pytest.raises(ConfigError, match=r"holds only a CTranslate2 model"):
            make_engine(name, bare, opts, cpu)
