"""The Hugging Face export (``nmt-export --format hf``): every Transformer variant converts to a
transformers model with our log-probabilities and our greedy output, its tokenizer gives our
ids and our detokenized text, what cannot convert is refused with the reason, and the folder
is written whole or not at all."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from nmt.config import ConfigError
from nmt.data.batching import make_batch
from nmt.data.datasets import encode_texts, prepare_data
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair
from nmt.decode.search import beam_search, greedy_search
from nmt.models.transformer import sinusoidal_positions
from nmt.ship import hf
from nmt.ship.export import HF_RERANK, export_hf
from nmt.ship.export import main as export_main
from nmt.ship.hf_check import USER_STEPS, check_run, gnmt_best, hf_generate, hf_nbest, reranked
from nmt.store.loading import build_model, load_trained
from nmt.train.command import train

from .helpers import REPO, TINY_TRANSFORMER, compose_config, corpus_overrides, tiny_run_overrides

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # MarianTokenizer's constructor asks for sacremoses, which only its unused normalize() needs
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses:UserWarning"),
]

SMALL = ["model.d_model=16", "model.heads=2", "model.d_ff=32"]
LAYERS = ["model.enc_layers=2", "model.dec_layers=1"]
NORM = {"pre-norm": [], "post-norm": ["model.norm_first=false"]}
EMBEDDINGS = {
    "tied, joint": [],
    "untied, joint": ["model.tie_embeddings=false"],
    "tied, two vocabularies": ["data.joint_vocab=false"],
    "untied, two vocabularies": ["model.tie_embeddings=false", "data.joint_vocab=false"],
}
VARIANTS = [(n, e) for n in NORM for e in EMBEDDINGS]
# the feed-forward activations transformers names as we do, and an output bias, with each norm
FEATURES = {
    "gelu, output bias": ["model.activation=gelu", "model.output_bias=true"],
    "swish, output bias, untied": ["model.activation=swish", "model.output_bias=true",
                                   "model.tie_embeddings=false"],
}  # fmt: skip
VARIANTS += [(n, f) for n in NORM for f in FEATURES]
# characters the sentencepiece models of 120 sentences never saw: byte fallback
RARE = ["Ein Hund — 3½ Äpfel, ŝ ǅ 😀 !", "Zwei  Männer\tim Schnee… «ja»", "ẞ Ω ∑ 中文 a"]


def variant_model(
    corpus: Path, root: Path, overrides: list[str]
) -> tuple[torch.nn.Module, TokenizerPair, object]:
    """A tiny model of a variant, random weights, layer norms that are not the identity."""
    cfg = compose_config(
        "train",
        [*corpus_overrides(corpus, root), *SMALL, *LAYERS, *overrides, "model.dropout=0"],
    )
    tokenizers = prepare_data(cfg.data).tokenizers
    torch.manual_seed(0)
    model = build_model(cfg, tokenizers).eval()
    for p in (p for name, p in model.named_parameters() if "norm" in name):
        torch.nn.init.uniform_(p, 0.5, 1.5)
    if model.out_proj.bias is not None:  # a bias that matters
        torch.nn.init.normal_(model.out_proj.bias, 0.0, 1.0)
    return model, tokenizers, cfg


def real_batch(corpus: Path, tokenizers: TokenizerPair, n: int = 6):
    lines = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:n]
    refs = Path(f"{corpus}.en").read_text(encoding="utf-8").splitlines()[:n]
    return make_batch(encode_texts(tokenizers, lines, refs), list(range(n)))


def hf_log_probs(model, batch) -> torch.Tensor:
    """transformers' teacher-forced log-probabilities of one of our batches (B, T, V)."""
    mask = torch.arange(batch.src.size(1))[None] < batch.src_lens[:, None]
    with torch.inference_mode():
        out = model(input_ids=batch.src, attention_mask=mask.long(), decoder_input_ids=batch.tgt_in)
    return out.logits.log_softmax(-1)


@pytest.mark.parametrize("norm,embeddings", VARIANTS)
def test_every_variant_gives_our_log_probabilities_and_greedy_output(
    norm: str, embeddings: str, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("variant")
    options = {**EMBEDDINGS, **FEATURES}[embeddings]
    model, tokenizers, _ = variant_model(corpus, root, [*NORM[norm], *options])
    converted = hf.convert_model(model)
    assert type(converted).__name__ == ("MarianMTModel" if norm == "post-norm" else
                                        "PegasusForConditionalGeneration")  # fmt: skip
    batch = real_batch(corpus, tokenizers)
    with torch.inference_mode():
        ours = model(batch.src, batch.src_lens, batch.tgt_in).log_softmax(-1)
    theirs = hf_log_probs(converted, batch)
    real = batch.tgt_out != PAD_ID
    assert (ours - theirs).abs()[real].max() < 1e-4

    cap = 12  # the same cap for every sentence: random weights decode up to it, then EOS
    caps = torch.full((batch.src.size(0),), cap)
    hyps = greedy_search(model, batch.src, batch.src_lens, caps, BOS_ID, EOS_ID)
    mask = torch.arange(batch.src.size(1))[None] < batch.src_lens[:, None]
    with torch.inference_mode():
        out = converted.generate(
            input_ids=batch.src,
            attention_mask=mask.long(),
            num_beams=1,
            do_sample=False,
            max_new_tokens=cap + 1,
        )
    for hyp, row in zip(hyps, out.tolist(), strict=True):
        assert row[0] == BOS_ID
        tokens = row[1 : row.index(EOS_ID)] if EOS_ID in row else row[1:]
        assert tokens == hyp.tokens


def test_the_comparison_sees_a_conversion_without_the_permutation(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizers, _ = variant_model(corpus, tmp_path, ["model.norm_first=false"])
    monkeypatch.setattr(hf, "permutation", lambda d: torch.arange(d))  # interleaved as ours
    batch = real_batch(corpus, tokenizers)
    with torch.inference_mode():
        ours = model(batch.src, batch.src_lens, batch.tgt_in).log_softmax(-1)
    theirs = hf_log_probs(hf.convert_model(model), batch)
    assert (ours - theirs).abs().max() > 1e-2


@pytest.mark.parametrize("joint", [True, False], ids=["joint", "two vocabularies"])
def test_the_tokenizer_gives_our_ids_and_our_text(
    joint: bool, corpus: Path, tmp_path: Path
) -> None:
    overrides = [] if joint else ["data.joint_vocab=false"]
    cfg = compose_config("train", [*corpus_overrides(corpus, tmp_path), *overrides])
    tokenizers = prepare_data(cfg.data).tokenizers
    out = tmp_path / "tok"
    out.mkdir()
    hf.write_tokenizer(tokenizers, out, cfg, 1024)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert type(tok).__name__ == "MarianTokenizer"
    sources = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines() + RARE
    targets = Path(f"{corpus}.en").read_text(encoding="utf-8").splitlines() + RARE
    assert any(tokenizers.src.pieces(tokenizers.src.encode(s))[-1].startswith("<0x") for s in RARE)
    enc = tok(sources, text_target=targets)
    for s, t, got_src, got_tgt in zip(
        sources, targets, enc["input_ids"], enc["labels"], strict=True
    ):
        assert got_src == tokenizers.src.encode(s) + [EOS_ID]
        assert got_tgt == tokenizers.tgt.encode(t) + [EOS_ID]
        ids = [BOS_ID, *tokenizers.tgt.encode(t), EOS_ID, PAD_ID]  # as generate returns them
        assert tok.decode(ids, skip_special_tokens=True) == tokenizers.tgt.decode(ids) == t


def reranking_model(
    corpus: Path,
    root: Path,
    override: str,
    seed: int,
    eos_row: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.nn.Module, TokenizerPair, Any, Any, list[str], Any]:
    """A small model for the re-ranking tests, its output row of EOS replaced by
    ``eos_row(row)``: the model, its tokenizers, its transformers conversion and tokenizer, and
    the corpus's first 24 sentences (as text and as our batch)."""
    cfg = compose_config(
        "train",
        [*corpus_overrides(corpus, root), *SMALL, *LAYERS, "model.dropout=0", override],
    )
    tokenizers = prepare_data(cfg.data).tokenizers
    torch.manual_seed(seed)
    model = build_model(cfg, tokenizers).eval()
    with torch.no_grad():
        weight = model.out_proj.weight
        weight[EOS_ID] = eos_row(weight[EOS_ID])
    converted = hf.convert_model(model)
    hf.write_tokenizer(tokenizers, root, cfg, 1024)
    tok = transformers.AutoTokenizer.from_pretrained(str(root))
    sources = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:24]
    return model, tokenizers, converted, tok, sources, real_batch(corpus, tokenizers, 24)


def test_re_ranking_transformers_n_best_by_our_penalty_gives_our_beam_output(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model whose EOS competes at the first steps: transformers' ``sum / n ** alpha`` then
    picks longer outputs than our ``sum / ((5 + n) / 6) ** alpha`` on many sentences, and its
    n-best re-ranked by ours gives our beam search's output on every one."""
    model, tokenizers, converted, tok, sources, batch = reranking_model(
        corpus, tmp_path, "model.tie_embeddings=false", 1,
        # the EOS logit follows the decoder's position signal
        lambda row: 4.0 * sinusoidal_positions(5, row.numel())[4],
    )  # fmt: skip
    beam, alpha, cap = 4, 1.0, 30
    caps = torch.full((24,), cap)
    ours = [h.tokens for h in beam_search(
        model, batch.src, batch.src_lens, caps, BOS_ID, EOS_ID, beam, alpha
    )]  # fmt: skip
    options = {"length_penalty": alpha, "early_stopping": False}
    nbest = hf_nbest(converted, tok, sources, caps.tolist(), 8, beam, **options)
    plain = hf_generate(converted, tok, sources, caps.tolist(), 8, num_beams=beam, **options)
    assert [hyps[0][0] for hyps in nbest] == plain  # the n-best's first: what generate returns
    other = [i for i in range(24) if plain[i] != ours[i]]
    assert len(other) >= 10 and all(len(plain[i]) > len(ours[i]) for i in other)
    assert reranked(nbest, alpha) == ours

    # the model card's recipe, with generate's defaults set to these
    converted.generation_config.update(num_beams=beam, length_penalty=alpha, max_length=cap + 2)
    batch = tok(sources, return_tensors="pt", padding=True)
    exec("\n".join(HF_RERANK), {"model": converted, "tok": tok, "batch": batch})
    printed = capsys.readouterr().out
    assert printed.strip() == str([tokenizers.tgt.decode(tokens) for tokens in ours])


def test_re_ranking_scores_the_eos_at_the_cap_as_our_search(corpus: Path, tmp_path: Path):
    """Every output cut at the cap: ``generate`` forces EOS there and scores it 0 (its logits
    processor leaves EOS alone), our search adds the model's log-probability of that EOS; the
    n-best's sums are the model's, so the re-ranking picks ours."""
    model, _, converted, tok, sources, batch = reranking_model(
        corpus, tmp_path, "model.norm_first=false", 0,
        lambda row: 3.0 * row,  # EOS likely enough to matter, never the best
    )  # fmt: skip
    beam, alpha, caps = 4, 1.0, torch.full((24,), 12)
    ours = [h.tokens for h in beam_search(
        model, batch.src, batch.src_lens, caps, BOS_ID, EOS_ID, beam, alpha
    )]  # fmt: skip
    assert all(len(tokens) == 12 for tokens in ours)
    nbest = hf_nbest(converted, tok, sources, caps.tolist(), 8, beam, length_penalty=alpha)
    assert sum(hyps[0][0] != mine for hyps, mine in zip(nbest, ours, strict=True)) >= 8
    assert reranked(nbest, alpha) == ours


def test_our_penalty_counts_eos_in_the_length_and_keeps_the_first_of_equals() -> None:
    # sums with EOS: -4 over 3 tokens, -7.2 over 9: ours -4 / (8 / 6) = -3 against
    # -7.2 / (14 / 6) = -3.09, transformers' -4 / 3 against -7.2 / 9 prefers the long one,
    # and so would ours if it left EOS out of the length (-4 / (7 / 6) < -7.2 / (13 / 6))
    short, long = ([5, 6], -4.0), ([5, 6, 7, 8, 9, 10, 11, 12], -7.2)
    assert gnmt_best([short, long], 1.0) == 0 and gnmt_best([long, short], 1.0) == 1
    assert gnmt_best([long, short], 0.0) == 1  # alpha 0: the best sum
    assert gnmt_best([short, short], 1.0) == 0


# -------------------------------------------------------------------------------- refusals


def test_the_gru_is_refused_with_the_reason(corpus: Path, tmp_path: Path) -> None:
    cfg = compose_config("train", [*corpus_overrides(corpus, tmp_path), "model=gru_bahdanau"])
    with pytest.raises(ConfigError, match="no\\s+recurrent"):
        hf.check_exportable(cfg, prepare_data(cfg.data).tokenizers)


def test_learned_positions_are_refused_with_the_reason(corpus: Path, tmp_path: Path) -> None:
    cfg = compose_config(
        "train", [*corpus_overrides(corpus, tmp_path), "model.learned_positions=true"]
    )
    with pytest.raises(ConfigError, match="learned_positions=true cannot be exported"):
        hf.check_exportable(cfg, prepare_data(cfg.data).tokenizers)


def test_fairseq_positions_are_refused_with_the_reason(corpus: Path, tmp_path: Path) -> None:
    cfg = compose_config("train", [*corpus_overrides(corpus, tmp_path), *TINY_TRANSFORMER,
                                   "model.position_style=fairseq"])  # fmt: skip
    tokenizers = prepare_data(cfg.data).tokenizers
    with pytest.raises(ConfigError, match="model.position_style=fairseq cannot be exported"):
        hf.check_exportable(cfg, tokenizers)


def test_a_pre_norm_model_with_two_vocabulary_sizes_is_refused(corpus: Path, tmp_path: Path):
    cfg = compose_config("train", [*corpus_overrides(corpus, tmp_path), "data.joint_vocab=false"])
    assert hf.refusal(cfg, 600, 600) is None
    assert "one vocabulary size" in hf.refusal(cfg, 600, 500)
    post = compose_config("train", ["model.norm_first=false", "data.joint_vocab=false"])
    assert hf.refusal(post, 600, 500) is None  # Marian holds two sizes


# ----------------------------------------------------------------------- the export command


@pytest.fixture(scope="module")
def run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Transformer trained for a few updates (post-norm: Marian)."""
    root = tmp_path_factory.mktemp("hfrun")
    overrides = tiny_run_overrides(
        corpus, root, "trainer.max_steps=4", "trainer.val_every=4", "model.norm_first=false"
    )
    run_dir = root / "run"
    train(compose_config("train", [*overrides, "decode.beam=3"]), run_dir)
    return run_dir


def test_nmt_export_writes_a_folder_transformers_loads(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    assert export_main([str(run), "--out", str(out), "--format", "hf"]) == 0
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out))
    assert type(model).__name__ == "MarianMTModel"
    config = json.loads((out / "config.json").read_text())
    assert (config["decoder_start_token_id"], config["pad_token_id"]) == (BOS_ID, PAD_ID)
    assert (config["encoder_layerdrop"], config["activation_function"]) == (0.0, "relu")
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["num_beams"] == 3 and generation["forced_eos_token_id"] == EOS_ID
    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert "translation" in meta["tags"] and meta["pipeline_tag"] == "translation"
    assert meta["language"] == ["de", "en"] and meta["license"] == "unknown"
    assert "max_new_tokens=int(1.2 * len(input_ids) + 10) + 1" in card
    assert "\n".join(HF_RERANK) in card and "`length_penalty=0.75`" in card  # alpha 1
    with pytest.raises(SystemExit) as stop:  # an export is replaced only with --force
        export_main([str(run), "--out", str(out), "--format", "hf"])
    assert stop.value.code == 2
    assert export_main([str(run), "--out", str(out), "--format", "hf", "--force"]) == 0


def test_a_package_exports_too(run: Path, tmp_path: Path) -> None:
    assert export_main([str(run), "--out", str(tmp_path / "pkg")]) == 0
    out = tmp_path / "hf"
    assert export_main([str(tmp_path / "pkg"), "--out", str(out), "--format", "hf"]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok("Ein Hund.")["input_ids"][-1] == EOS_ID


def test_a_failed_export_leaves_nothing(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise ConfigError("--format hf: the converted model differs")

    monkeypatch.setattr(hf, "verify_folder", broken)
    ckpt = run / "checkpoints" / "last.pt"
    with pytest.raises(ConfigError, match="differs"):
        export_hf(ckpt, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_the_gru_export_exits_2_with_one_line(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    overrides = [
        o
        for o in tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=1", "trainer.val_every=1")
        if o not in TINY_TRANSFORMER
    ]
    overrides += ["model=gru_bahdanau", "model.emb_dim=16", "model.hidden_dim=16"]
    train(compose_config("train", overrides), tmp_path / "gru")
    with pytest.raises(SystemExit) as stop:
        export_main([str(tmp_path / "gru"), "--out", str(tmp_path / "hf"), "--format", "hf"])
    assert stop.value.code == 2
    assert "no recurrent" in caplog.text and not (tmp_path / "hf").exists()


def test_without_a_length_penalty_beam_4_is_generates_output(corpus: Path, tmp_path: Path) -> None:
    """At alpha 0 both penalties divide by 1 and both searches keep the same hypotheses:
    ``generate(num_beams=4)`` on the exported folder returns our beam search's output on every
    sentence of a model trained until its outputs end (before the cap, where the two would
    score EOS otherwise)."""
    overrides = tiny_run_overrides(corpus, tmp_path, "trainer.max_steps=300",
                                   "trainer.val_every=300", "optim.lr=0.003",
                                   "optim.warmup_steps=20")  # fmt: skip
    train(compose_config("train", overrides), tmp_path / "run")
    out = export_hf(tmp_path / "run" / "checkpoints" / "last.pt", tmp_path / "hf")
    trained = load_trained(tmp_path / "run" / "checkpoints" / "last.pt", torch.device("cpu"))
    sources = Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:48]
    batch = real_batch(corpus, trained.tokenizers, 48)
    caps = torch.full((48,), 40)
    ours = [h.tokens for h in beam_search(
        trained.model, batch.src, batch.src_lens, caps, BOS_ID, EOS_ID, 4, 0.0
    )]  # fmt: skip
    assert all(len(tokens) < 40 for tokens in ours) and len(set(map(len, ours))) > 5
    converted = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    theirs = hf_generate(converted, tok, sources, caps.tolist(), 16, num_beams=4,
                         length_penalty=0.0, early_stopping=False, do_sample=False)  # fmt: skip
    assert theirs == ours


def test_the_parity_check_reports_greedy_and_user_text_parity(run: Path) -> None:
    """``make check-hf``'s report on a run: greedy tokens and the text a user gets equal ours
    (a search rule apart, beam BLEU is only reported here, its bound is the trained run's)."""
    report = check_run(
        run / "checkpoints" / "best.pt", limit=12, beam=2, generate={"early_stopping": "never"}
    )
    assert report["sentences"] == 12
    assert report["greedy"]["identical"] == 12 and report["greedy"]["ok"]
    assert report["strings"]["identical"] == 12 and report["strings"]["how"] == USER_STEPS
    beam = report["beam"]
    assert beam["beam"] == 2 and beam["gap"] >= 0 and beam["gap_reranked"] >= 0
    assert beam["ok"] == (beam["gap_reranked"] <= beam["wanted"])  # the re-ranked BLEU decides
    assert beam["generate"] == {"length_penalty": 1.0, "early_stopping": "never"}
    assert report["ok"] == report["beam"]["ok"]


def test_check_hf_passes_transformers_settings_from_its_command_line(
    run: Path, tmp_path: Path
) -> None:
    script = [sys.executable, str(REPO / "scripts" / "check_hf.py"), str(run), "--limit", "4"]
    out = tmp_path / "report.json"
    wanted = ["--beam", "2", "--length-penalty", "0.5", "--early-stopping", "never"]
    done = subprocess.run([*script, *wanted, "--out", str(out)], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: a check did not hold
    report = json.loads(out.read_text())
    assert report["beam"]["generate"] == {"length_penalty": 0.5, "early_stopping": "never"}
    bad = subprocess.run([*script, "--early-stopping", "maybe"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--early-stopping" in bad.stderr


def test_export_then_import_gives_back_the_model_bit_for_bit(run: Path, tmp_path: Path) -> None:
    """nmt-export --format hf, then nmt-import: the same weights, tensor by tensor, the same
    architecture and the same tokenizers' pieces (our ids read back as they were)."""
    from nmt.ship.import_command import main as import_main
    from nmt.store.checkpoint import load_checkpoint

    out = tmp_path / "hf"
    assert export_main([str(run), "--out", str(out), "--format", "hf"]) == 0
    assert import_main([str(out), "--out", str(tmp_path / "back")]) == 0
    before = load_checkpoint(run / "checkpoints" / "best.pt")
    after = load_checkpoint(tmp_path / "back" / "checkpoints" / "best.pt")
    assert after["model"].keys() == before["model"].keys()
    for name, tensor in before["model"].items():
        assert torch.equal(after["model"][name], tensor), name
    fields = ("d_model", "heads", "d_ff", "enc_layers", "dec_layers", "activation",
              "norm_first", "tie_embeddings", "output_bias", "position_style")  # fmt: skip
    for key in fields:
        assert after["config"]["model"][key] == before["config"]["model"][key], key
    ours = TokenizerPair.from_state_dict(before["tokenizers"])
    back = TokenizerPair.from_state_dict(after["tokenizers"])
    text = "Ein Mann fährt mit dem Fahrrad."
    assert back.src.encode(text) == ours.src.encode(text)
    assert back.tgt.pieces(range(ours.tgt.vocab_size)) == ours.tgt.pieces(
        range(ours.tgt.vocab_size)
    )
