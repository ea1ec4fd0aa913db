"""Ensembles: each step's distribution is the mean of the members' (checked against their
teacher-forced forward passes, a GRU and a Transformer together), one member or copies of one
decode as that model does, the searches keep every member's state in step, and ``nmt-eval
ensemble=[...]`` loads, checks and names its members."""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError
from nmt.data.datasets import prepare_data
from nmt.decode.options import DecodeOptions
from nmt.decode.search import beam_search, greedy_search, search
from nmt.evaluate.scoring import evaluate
from nmt.models.base import Seq2Seq
from nmt.models.ensemble import Ensemble
from nmt.store.checkpoint import load_checkpoint, save_checkpoint

from .helpers import compose_config, corpus_overrides, write_subset
from .test_eval import N_PAIRS, TINY, write_checkpoint
from .test_search import BOS, EOS, TGT_V, random_sources, real_model

pytestmark = pytest.mark.usefixtures("one_thread")


def mixed_pair() -> list[Seq2Seq]:
    """A GRU and a Transformer over the same vocabularies, with random weights."""
    return [real_model("gru", seed=5), real_model("transformer", seed=6)]


def teacher_forced_logp(model: Seq2Seq, src, src_lens, tgt_in) -> torch.Tensor:
    """(B, T, V) log-probabilities of every next token under teacher forcing."""
    with torch.no_grad():
        return torch.log_softmax(model(src, src_lens, tgt_in).float(), dim=-1)


def test_each_step_is_the_mean_of_the_members_distributions() -> None:
    members = mixed_pair()
    ensemble = Ensemble(members).eval()
    src, src_lens = random_sources([5, 2, 7], seed=7)
    gen = torch.Generator().manual_seed(8)
    tgt_in = torch.randint(4, TGT_V, (3, 6), generator=gen)  # (B, T)
    tgt_in[:, 0] = BOS
    probs = torch.stack([teacher_forced_logp(m, src, src_lens, tgt_in).exp() for m in members])
    expected = probs.mean(dim=0).log()  # (B, T, V)
    with torch.no_grad():
        state = ensemble.encode(src, src_lens)
        for t in range(tgt_in.size(1)):
            logp, state, attn = ensemble.decode_step(tgt_in[:, t], state)  # (B, V)
            torch.testing.assert_close(logp, expected[:, t], atol=1e-5, rtol=1e-5)
            assert torch.allclose(logp.exp().sum(-1), torch.ones(3), atol=1e-5)
            # the mean of two attention distributions is one: rows sum to 1, padding gets 0
            torch.testing.assert_close(attn.sum(-1), torch.ones(3), atol=1e-5, rtol=0)
            assert float(attn[1, 2:].abs().max()) == 0.0


def test_the_greedy_score_is_the_mixtures_log_probability_of_its_output() -> None:
    members = mixed_pair()
    ensemble = Ensemble(members).eval()
    src, src_lens = random_sources([4, 6], seed=9)
    caps = torch.tensor([7, 7])
    hyps = greedy_search(ensemble, src, src_lens, caps, BOS, EOS)
    for i, hyp in enumerate(hyps):
        out = torch.tensor([[BOS, *hyp.tokens]])  # (1, T)
        target = torch.tensor([*hyp.tokens, EOS])  # (T,)
        row = slice(i, i + 1)
        probs = [teacher_forced_logp(m, src[row], src_lens[row], out)[0].exp() for m in members]
        mixture = torch.stack(probs).mean(0).log()  # (T, V)
        assert hyp.score == pytest.approx(float(mixture.gather(1, target[:, None]).sum()), abs=1e-4)


@pytest.mark.parametrize("name", ["gru", "transformer"])
@pytest.mark.parametrize("copies", [1, 2])
def test_one_model_or_copies_of_it_decode_as_the_model(name: str, copies: int) -> None:
    model = real_model(name, seed=10)
    ensemble = Ensemble([model] + [copy.deepcopy(model) for _ in range(copies - 1)]).eval()
    src, src_lens = random_sources([3, 8, 5, 1], seed=11)
    for beam in (1, 4):
        opts = DecodeOptions(beam=beam, length_penalty=1.0, max_output_len_a=1.0,
                             max_output_len_b=4)  # fmt: skip
        alone = search(model, src, src_lens, opts, keep_attention=True)
        together = search(ensemble, src, src_lens, opts, keep_attention=True)
        for a, e in zip(alone, together, strict=True):
            assert e.tokens == a.tokens
            assert e.score == pytest.approx(a.score, abs=1e-4)
            torch.testing.assert_close(e.attention, a.attention, atol=1e-5, rtol=0)


def test_the_searches_keep_the_members_in_step() -> None:
    """Beam 1 is greedy, and a sentence decodes the same alone and in a batch whose sentences
    finish and leave at other steps: every member's rows are reordered and dropped together."""
    ensemble = Ensemble(mixed_pair()).eval()
    lens = [6, 2, 9, 4]
    src, src_lens = random_sources(lens, seed=12)
    caps = torch.tensor([8, 3, 11, 6])
    greedy = greedy_search(ensemble, src, src_lens, caps, BOS, EOS)
    beam1 = beam_search(ensemble, src, src_lens, caps, BOS, EOS, 1, 1.0)
    assert [h.tokens for h in beam1] == [h.tokens for h in greedy]
    assert len({len(h.tokens) for h in greedy}) > 1
    opts = DecodeOptions(beam=4, length_penalty=1.0, max_output_len_a=1.0, max_output_len_b=2)
    together = search(ensemble, src, src_lens, opts)
    for i, n in enumerate(lens):
        alone = search(ensemble, src[i : i + 1, :n], src_lens[i : i + 1], opts)[0]
        assert together[i].tokens == alone.tokens
        assert together[i].score == pytest.approx(alone.score, abs=1e-4)


def test_an_ensemble_decodes_only() -> None:
    ensemble = Ensemble(mixed_pair())
    src, src_lens = random_sources([3], seed=13)
    with pytest.raises(NotImplementedError, match="decodes"):
        ensemble(src, src_lens, torch.tensor([[BOS]]))
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])


# ------------------------------------------------------------------------------ nmt-eval


@pytest.fixture(scope="module")
def runs(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two runs of one vocabulary (``a``, ``b``: different weights), one of another
    vocabulary (``other_vocab``) and the test pair to score."""
    root = tmp_path_factory.mktemp("ensemble")
    corpus = write_subset(multi30k, root / "corpus", "train", N_PAIRS)
    test = write_subset(multi30k, root / "test", "test_2016_flickr", 5)
    cfg = compose_config("train", [*corpus_overrides(corpus, root), *TINY])
    tokenizers = prepare_data(cfg.data).tokenizers
    out = {"src": Path(f"{test}.de"), "ref": Path(f"{test}.en")}
    for seed, name in enumerate(("a", "b")):
        ckpt = root / name / "checkpoints" / "step_00000010.pt"
        write_checkpoint(cfg, tokenizers, 10, ckpt, seed)
        os.link(ckpt, ckpt.parent / "best.pt")
        out[name] = root / name
    other = compose_config("train", [*corpus_overrides(corpus, root), *TINY, "data.vocab_size=900"])
    ckpt = root / "other" / "checkpoints" / "best.pt"
    write_checkpoint(other, prepare_data(other.data).tokenizers, 10, ckpt, 0)
    out["other_vocab"] = root / "other"
    return out


def eval_cfg(runs: dict[str, Path], run: str, *extra: str):
    test = f"test=[{runs['src']}:{runs['ref']}]"
    return compose_config("eval", [f"run={runs[run]}", test, "bootstrap=0", "beam=3", *extra])


def hypotheses(report: dict) -> list[str]:
    (entry,) = report["sets"].values()
    return Path(entry["hypotheses"]).read_text(encoding="utf-8").splitlines()


def test_eval_of_an_ensemble_names_its_members_and_files(runs: dict[str, Path]) -> None:
    single = evaluate(eval_cfg(runs, "a"))
    with_itself = evaluate(eval_cfg(runs, "a", f"ensemble=[{runs['a']}]"))
    assert hypotheses(with_itself) == hypotheses(single)
    pair = evaluate(eval_cfg(runs, "a", f"ensemble=[{runs['b'] / 'checkpoints' / 'best.pt'}]"))
    members = [str(runs[r] / "checkpoints" / "best.pt") for r in ("a", "b")]
    assert pair["ensemble"] == members and "ensemble" not in single
    (entry,) = pair["sets"].values()
    assert Path(entry["hypotheses"]).name.endswith(".de.best.beam3.lp1.ensemble2.hyp")
    assert (runs["a"] / "eval" / "scores.best.beam3.lp1.ensemble2.json").is_file()
    assert (runs["a"] / "eval" / "scores.best.beam3.lp1.json").is_file()  # kept apart


def test_members_must_share_vocabulary_direction_and_engine(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"other.*other tokenizers"):
        evaluate(eval_cfg(runs, "a", f"ensemble=[{runs['other_vocab']}]"))
    payload = load_checkpoint(runs["b"] / "checkpoints" / "best.pt")
    data = payload["config"]["data"]
    data["src_lang"], data["tgt_lang"] = data["tgt_lang"], data["src_lang"]
    save_checkpoint(payload, tmp_path / "reversed.pt")
    with pytest.raises(ConfigError, match=r"reversed.pt translates en-de"):
        evaluate(eval_cfg(runs, "a", f"ensemble=[{tmp_path / 'reversed.pt'}]"))
    with pytest.raises(ConfigError, match="engine=ctranslate2: an ensemble"):
        evaluate(eval_cfg(runs, "a", f"ensemble=[{runs['b']}]", "engine=ctranslate2"))


def test_translate_decodes_with_an_ensemble(runs: dict[str, Path], tmp_path: Path) -> None:
    from nmt.decode.translate import translate

    outputs = []
    for extra in ([], [f"ensemble=[{runs['a']}]"], [f"ensemble=[{runs['b']}]"]):
        out = tmp_path / f"out{len(outputs)}.en"
        args = [f"run={runs['a']}", f"input={runs['src']}", f"output={out}", "beam=3", *extra]
        translate(compose_config("translate", args))
        outputs.append(out.read_text(encoding="utf-8"))
    assert outputs[1] == outputs[0]  # a model with itself is the model
    assert outputs[2] != outputs[0]  # with another, the mixture decides


def test_a_checkpoint_file_cannot_choose_the_members_checkpoints(runs: dict[str, Path]) -> None:
    """ckpt=FILE names the first model's checkpoint only: a run given as a member would
    otherwise be read from that same file."""
    first = runs["a"] / "checkpoints" / "best.pt"
    with pytest.raises(ConfigError, match=r"ckpt=.*best.pt is one file.*of .*b"):
        evaluate(eval_cfg(runs, "a", f"ckpt={first}", f"ensemble=[{runs['b']}]"))
    member = runs["b"] / "checkpoints" / "best.pt"  # a member named by its file is fine
    report = evaluate(eval_cfg(runs, "a", f"ckpt={first}", f"ensemble=[{member}]"))
    assert report["ensemble"] == [str(first), str(member)]


def test_a_ctranslate2_only_package_cannot_lead_an_ensemble(runs: dict[str, Path]) -> None:
    from nmt.store.loading import load_ensemble, load_trained

    trained = load_trained(runs["a"] / "checkpoints" / "best.pt", torch.device("cpu"))
    ct2_only = replace(trained, model=None, path=Path("package"))
    with pytest.raises(ConfigError, match="package holds only a CTranslate2 model"):
        load_ensemble(ct2_only, [str(runs["b"])], None, torch.device("cpu"))
