"""Multilingual data (data.directions): tags, their placement, the sampling of directions by
temperature, one copy of each language's file, per-direction validation, and the bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import ConfigError, DataConfig
from nmt.config_checks import check_train_config
from nmt.data.batching import TokenBatchSampler, make_batch
from nmt.data.corpus import DataError, fetch_multi30k
from nmt.data.datasets import prepare_data
from nmt.data.multilingual import temperature_shares
from nmt.data.multiprep import ensure_multi_prepared
from nmt.data.tagged import NO_TAG
from nmt.decode.search import beam_search, greedy_search
from nmt.environment import multi30k_source
from nmt.evaluate.multilingual import LanguageIdentifier, off_target_rate
from nmt.train.validation import validation_scores

from .helpers import compose_config, write_subset
from .test_search import BOS, EOS, SRC_V, random_sources, real_model

LANGS = ("cs", "de", "en", "fr")


def lines_of(prefix, lang: str) -> list[str]:
    with open(f"{prefix}.{lang}", encoding="utf-8") as f:
        return f.read().split("\n")


SIX = "[de-en,fr-en,cs-en,en-de,en-fr,en-cs]"


@pytest.fixture(scope="module")
def fourway(tmp_path_factory):
    """The first 120 lines of Multi30k's training split in its four languages."""
    root = tmp_path_factory.mktemp("m30k")
    m30k = fetch_multi30k(root / "data", LANGS, ["train"], multi30k_source())
    return write_subset(m30k, root / "corpus", "train", 120, langs=LANGS)


def multi_cfg(prefix, root, directions=SIX, **over):
    cfg = DataConfig(
        name="m", corpus="parallel", root=str(root), train=str(prefix), valid=str(prefix),
        test=[], vocab_size=700, num_workers=1,
    )  # fmt: skip
    merged = OmegaConf.merge(OmegaConf.structured(cfg), over)
    merged.directions = directions.strip("[]").split(",")
    return merged


def test_tags_are_single_pieces_and_decode_to_nothing(fourway, tmp_path):
    cache = ensure_multi_prepared(multi_cfg(fourway, tmp_path))
    tok = cache.tokenizers.src
    assert sorted(tok.tags) == list(LANGS)
    assert sorted(tok.tags.values()) == [4, 5, 6, 7]  # right after <pad> <unk> <s> </s>
    for lang, tag in tok.tags.items():
        assert tag in tok.encode(f"<2{lang}>")  # one piece (after the word-start marker)
        assert tok.pieces([tag]) == [f"<2{lang}>"]
        ids = tok.encode("Ein Hund läuft.")
        assert tok.decode([tag, *ids]) == "Ein Hund läuft."


@pytest.mark.parametrize("placement", ["source", "target", "both"])
def test_tag_placement(fourway, tmp_path, placement):
    """Each training pair carries its target language's tag first on the side asked for,
    and nowhere else (at ``both`` the source starts with its own language's tag); the rest is
    the file's line as encoded."""
    cfg = multi_cfg(fourway, tmp_path, "[de-en,en-fr]", tag_placement=placement)
    data = prepare_data(cfg)
    tok = data.tokenizers.src
    tags = set(tok.tags.values())
    lines = {lang: lines_of(fourway, lang) for lang in ("de", "en", "fr")}
    n = data.train_corpora[0].pairs
    for i, (src_lang, tgt_lang) in [(0, ("de", "en")), (n + 3, ("en", "fr"))]:
        src, tgt = data.train.src(i).tolist(), data.train.tgt(i).tolist()
        tagged, plain = (src, tgt) if placement == "source" else (tgt, src)
        assert tagged[0] == tok.tags[tgt_lang]
        if placement == "both":
            assert plain[0] == tok.tags[src_lang]
            plain = plain[1:]
        assert not tags & set(tagged[1:]) and not tags & set(plain)
        j = i if i < n else i - n
        text_src = tagged[1:] if placement == "source" else plain
        assert tok.decode(text_src) == lines[src_lang][j].strip()
    batch = make_batch(data.train, [0, n + 3])
    first = batch.src[:, 0] if placement == "source" else batch.tgt_in[:, 1]
    assert first.tolist() == [tok.tags["en"], tok.tags["fr"]]
    if placement == "both":
        assert batch.src[:, 0].tolist() == [tok.tags["de"], tok.tags["en"]]
        valid = data.valid.data
        valid_first = {int(valid.src(i)[0]) for i in range(len(valid))}
        assert valid_first == {tok.tags["de"], tok.tags["en"]}
    forced = data.valid.data.forced
    assert (forced is None) == (placement == "source")
    if forced is not None:
        assert forced.tolist() == [tok.tags["en"]] * 120 + [tok.tags["fr"]] * 120


def test_shared_sides_are_stored_once(fourway, tmp_path):
    """Six directions over four languages: each file is encoded once; a direction is a pair
    of sentence numbers into those lines."""
    cache = ensure_multi_prepared(multi_cfg(fourway, tmp_path))
    files = cache.manifest["files"]
    assert sorted(f["lang"] for f in files) == sorted(LANGS)
    assert len(cache.arrays["text.lengths"]) == 4 * 120
    tok = cache.tokenizers.src
    lines = [line for lang in LANGS for line in lines_of(fourway, lang)[:120]]
    total = sum(len(tok.encode(line.strip())) for line in lines)
    assert len(cache.arrays["text.tokens"]) == total
    assert len(cache.corpora) == 6
    en = next(f for f in files if f["lang"] == "en")
    for c, (src, tgt) in zip(cache.corpora, cache.direction_pairs(), strict=True):
        side = src if c["direction"].startswith("en-") else tgt
        assert np.all((side >= en["start"]) & (side < en["start"] + 120))


def test_sampling_shares_follow_the_temperature(fourway, tmp_path):
    """Directions of 120, 60 and 20 pairs: an epoch gives each the share n ** (1/T) / sum,
    drawn the same for a seed and epoch, differently for another epoch."""
    corpus = tmp_path / "corpus"
    for d, n in (("de-en", 120), ("fr-en", 60), ("cs-en", 20)):
        write_subset(fourway.parent.parent / "data" / "multi30k", corpus / d, "train", n,
                     langs=d.split("-"))  # fmt: skip
    prefix = {"de-en": "train0_120", "fr-en": "train0_60", "cs-en": "train0_20"}
    for d, name in prefix.items():
        for lang in d.split("-"):
            (corpus / d / f"{name}.{lang}").rename(corpus / d / f"train.{lang}")
    sizes = [120, 60, 20]
    for temperature in (1.0, 5.0, math.inf):
        cfg = multi_cfg(corpus / "{src}-{tgt}" / "train", tmp_path, "[de-en,fr-en,cs-en]",
                        sampling_temperature=temperature, max_len_ratio=100.0)  # fmt: skip
        data = prepare_data(cfg)
        assert [c.pairs for c in data.train_corpora] == sizes
        sampler = TokenBatchSampler(
            data.train.src_lens, data.train.tgt_lens, 4096, seed=7,
            corpora=[(c.pairs, c.weight) for c in data.train_corpora],
        )  # fmt: skip
        epoch = sampler.epoch_examples(0)
        epoch = np.arange(200) if epoch is None else epoch
        counts = np.bincount(np.searchsorted([120, 180], epoch, side="right"), minlength=3)
        expected = np.array(temperature_shares(sizes, temperature)) * 200
        assert np.abs(counts - expected).max() <= 1, (temperature, counts, expected)
        shares = [d["share"] for d in data.stats["directions"].values()]
        assert np.allclose(shares, counts / counts.sum())
        if temperature != 1.0:
            again = TokenBatchSampler(
                data.train.src_lens, data.train.tgt_lens, 4096, seed=7,
                corpora=[(c.pairs, c.weight) for c in data.train_corpora],
            )  # fmt: skip
            assert np.array_equal(again.epoch_examples(0), sampler.epoch_examples(0))
            assert not np.array_equal(sampler.epoch_examples(1), sampler.epoch_examples(0))
    z = 120**0.2 + 60**0.2 + 20**0.2
    assert temperature_shares(sizes, 5.0) == pytest.approx([120**0.2 / z, 60**0.2 / z, 20**0.2 / z])
    assert temperature_shares(sizes, 1.0) == pytest.approx([0.6, 0.3, 0.1])
    assert temperature_shares(sizes, math.inf) == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize("name", ["transformer", "gru"])
def test_forced_first_token(name):
    """The target tag placed on the target side is the first output token of both searches,
    whatever the model would have chosen; rows without one (-1) search freely."""
    model = real_model(name)
    src, src_lens = random_sources([5, 3, 4])
    caps = torch.tensor([6, 6, 6])
    forced = torch.tensor([7, 9, NO_TAG])
    free = greedy_search(model, src, src_lens, caps, BOS, EOS)
    for hyps in (
        greedy_search(model, src, src_lens, caps, BOS, EOS, forced=forced),
        beam_search(model, src, src_lens, caps, BOS, EOS, beam=3, forced=forced),
    ):
        assert [h.tokens[0] for h in hyps[:2]] == [7, 9]
    assert greedy_search(model, src, src_lens, caps, BOS, EOS, forced=forced)[2].tokens == (
        free[2].tokens
    )
    assert SRC_V > 9
    # the score is that of the tokens after the forced one (and the EOS), as transformers'
    # forced_bos_token_id and CTranslate2's target_prefix score it
    hyp = greedy_search(model, src[:1], src_lens[:1], caps[:1], BOS, EOS, forced=forced[:1])[0]
    tokens = list(hyp.tokens)
    with torch.inference_mode():
        logp = model(src[:1], src_lens[:1], torch.tensor([[BOS, *tokens]])).log_softmax(-1)[0]
    chosen = [*tokens[1:], EOS]
    expected = sum(float(logp[i, t]) for i, t in enumerate(chosen, start=1))
    assert hyp.score == pytest.approx(expected, abs=1e-4)


def test_validation_per_direction_and_mean_criterion(fourway, tmp_path):
    """Each direction is scored on its own sentences; bleu and chrf are the directions' mean."""
    sizes = ["model.d_model=16", "model.heads=2", "model.d_ff=32", "model.enc_layers=1"]
    cfg = compose_config("train", ["model=transformer", *sizes, "model.dec_layers=1"])
    cfg.data = multi_cfg(fourway, tmp_path, "[de-en,en-fr,fr-en]")
    cfg.trainer.val_sentences = 10
    data = prepare_data(cfg.data)
    from nmt.store.loading import build_model

    model = build_model(cfg, data.tokenizers)
    perfect = {"de-en"}

    def spy(model, ds, tok, opts, device, limit):
        n = min(limit, len(ds)) if limit else len(ds)
        first = ds.src(0).tolist()
        part = next(p for p in data.valid.parts if data.valid.data.src(p[1]).tolist() == first)
        refs = data.valid.ref_text[part[1] : part[1] + n]
        return refs if part[0] in perfect else ["xyz"] * n

    metrics = validation_scores(model, data, cfg, torch.device("cpu"), translate=spy)
    per = metrics["directions"]
    assert list(per) == ["de-en", "en-fr", "fr-en"]
    assert per["de-en"]["bleu"] == pytest.approx(100.0)
    assert per["en-fr"]["bleu"] == pytest.approx(0.0)
    assert metrics["bleu"] == pytest.approx(sum(p["bleu"] for p in per.values()) / 3)
    assert metrics["chrf"] == pytest.approx(sum(p["chrf"] for p in per.values()) / 3)
    assert all(p["sentences"] == 10 and "tok:13a" in p["bleu_signature"] for p in per.values())


# --------------------------------------------------------------------------- bad input


def test_a_tag_in_the_corpus_is_refused(fourway, tmp_path):
    bad = tmp_path / "bad"
    for lang in ("de", "en"):
        lines = lines_of(fourway, lang)
        if lang == "en":
            lines[4] = "A man says <2de> loudly."
        (tmp_path / f"bad.{lang}").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.en:5: .*'<2de>'"):
        ensure_multi_prepared(multi_cfg(bad, tmp_path, "[de-en,en-de]"))


def test_missing_file_and_unequal_lengths_name_the_file(fourway, tmp_path):
    with pytest.raises(DataError, match=r"no it file for corpus prefix"):
        ensure_multi_prepared(multi_cfg(fourway, tmp_path, "[de-en,en-it]"))
    short = tmp_path / "short"
    for lang, n in (("de", 120), ("en", 119)):
        lines = lines_of(fourway, lang)[:n]
        (tmp_path / f"short.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"short\.de has 120 lines, .*short\.en has 119 lines"):
        ensure_multi_prepared(multi_cfg(short, tmp_path, "[de-en,en-de]"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.directions=[de_en]", r"data\.directions\[0\]='de_en' is not a direction"),
        ("data.directions=[de-en,de-en]", r"data\.directions\[1\]='de-en' is named twice"),
        ("data.directions=[de-it]", r"data\.directions\[0\] \(de-it\)='it' is not one of"),
        ("data.sampling_temperature=0", r"data\.sampling_temperature=0.0 must be > 0"),
        ("data.joint_vocab=false", r"one sentencepiece model over all its languages"),
        ("data.zero_shot=[de_fr]", r"data\.zero_shot\[0\]='de_fr' is not a direction"),
        ("data.zero_shot=[de-en]", r"data\.zero_shot\[0\]=de-en is a trained direction"),
        ("data.zero_shot=[it-de]", r"data\.zero_shot\[0\]=it-de: 'it' is in no trained"),
        ("data.zero_shot=[de-it]", r"data\.zero_shot\[0\]=de-it: 'it' is not a trained target"),
    ],
)
def test_bad_multilingual_config(override, message):
    cfg = compose_config("train", ["data=multi30k_multilingual", "model=transformer", override])
    with pytest.raises(ConfigError, match=message):
        check_train_config(cfg)


def test_zero_shot_needs_directions():
    cfg = compose_config("train", ["data.zero_shot=[de-fr]"])
    with pytest.raises(ConfigError, match=r"data\.zero_shot=\['de-fr'\] needs a multilingual run"):
        check_train_config(cfg)


def test_preset_and_data_config_compose():
    cfg = compose_config("train", ["experiment=multilingual_cpu"])
    check_train_config(cfg)
    assert list(cfg.data.directions) == SIX.strip("[]").split(",")
    assert list(cfg.data.zero_shot) == ["de-fr", "fr-de"]  # what make eval adds
    # the default, which beat source on Multi30k validation (docs/results.md)
    assert cfg.data.tag_placement == "target"
    # six bilingual cpu_quick models' updates, the learning rate decaying over them
    assert (cfg.trainer.max_steps, cfg.trainer.max_time, cfg.optim.decay_over) == (6816, 0, "steps")
    inf = compose_config("train", ["data=multi30k_multilingual", "data.sampling_temperature=inf"])
    assert math.isinf(inf.data.sampling_temperature)


def test_weighted_corpora_in_every_direction(fourway, tmp_path):
    """Each weighted entry of data.train is read in every direction with its weight; the
    temperature scales a direction's corpora together."""
    m30k = fourway.parent.parent / "data" / "multi30k"
    second = write_subset(m30k, tmp_path / "more", "train", 40, langs=("de", "en"), start=200)
    for temperature, scale in ((1.0, 1.0), (math.inf, 1.0)):
        cfg = multi_cfg(fourway, tmp_path, "[de-en,en-de]", sampling_temperature=temperature)
        cfg.train = [str(fourway), f"{second}:2"]
        data = prepare_data(cfg)
        names = [c.name for c in data.train_corpora]
        assert names == ["train0_120 de-en", "train0_120 en-de", "train200_40 de-en",
                         "train200_40 en-de"]  # fmt: skip
        assert [c.weight for c in data.train_corpora] == pytest.approx([scale, scale, 2, 2])
        per_epoch = {d: v["per_epoch"] for d, v in data.stats["directions"].items()}
        kept = [c.pairs for c in data.train_corpora]
        assert per_epoch == {"de-en": kept[0] + 2 * kept[2], "en-de": kept[1] + 2 * kept[3]}


def test_a_tokenizer_without_the_tags_is_refused(fourway, tmp_path):
    """Fine-tuning hands its own tokenizer: one without a language's tag stops the run."""
    first = ensure_multi_prepared(multi_cfg(fourway, tmp_path, "[de-en,en-de]"))
    cfg = multi_cfg(fourway, tmp_path, "[de-en,en-fr]")
    with pytest.raises(DataError, match=r"no language tag for fr \(it has de, en\)"):
        prepare_data(cfg, first.tokenizers)


def test_off_target_rate_on_real_references(fourway):
    """py3langid, among the model's languages: each language's own lines are on target, every
    other language's are off target."""
    identify = LanguageIdentifier(list(LANGS)).language
    for lang in LANGS:
        own = lines_of(fourway, lang)[:120]
        assert off_target_rate(own, lang, identify) <= 0.02
        other = LANGS[(LANGS.index(lang) + 1) % 4]
        assert off_target_rate(own, other, identify) >= 0.98
    assert off_target_rate(["", "  "], "en", identify) == 0.0


def test_held_out_sets_are_scored_where_a_direction_has_both_languages(monkeypatch):
    """Multi30k's 2017 sets have no Czech: nmt-eval scores them in de-en but not in en-cs, and
    refuses a set that no direction of the model can use."""
    from nmt.config_checks import parse_directions
    from nmt.data.corpus import multi30k_languages
    from nmt.evaluate import multilingual

    assert multi30k_languages("test_2017_mscoco") == ["en", "de", "fr"]
    assert multi30k_languages("test_2018_flickr") == ["en", "de", "fr", "cs"]
    given: dict[str, list[str]] = {}

    def resolve(cfg, names, directions, source):
        given[str(directions[0])] = names
        return []

    monkeypatch.setattr(multilingual, "resolve_direction_splits", resolve)
    data_cfg = compose_config("train", ["data=multi30k_multilingual"]).data
    cfg = compose_config("eval", ["test=[test_2017_flickr,test_2018_flickr]"])
    multilingual.direction_sets(cfg, data_cfg, parse_directions(["de-en", "en-cs"], "test"))
    assert given == {"de-en": ["test_2017_flickr", "test_2018_flickr"],
                     "en-cs": ["test_2018_flickr"]}  # fmt: skip
    cfg = compose_config("eval", ["test=[test_2017_mscoco]"])
    with pytest.raises(DataError, match="'test_2017_mscoco' has both languages of none of this "
                                        r"model's directions \(en-cs, cs-en\)"):  # fmt: skip
        multilingual.direction_sets(cfg, data_cfg, parse_directions(["en-cs", "cs-en"], "test"))
    cfg = compose_config("eval", ["test=[a.de:a.en]"])
    with pytest.raises(ConfigError, match="'a.de:a.en' is a source:reference pair"):
        multilingual.direction_sets(cfg, data_cfg, parse_directions(["de-en"], "test"))
