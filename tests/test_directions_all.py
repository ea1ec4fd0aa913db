"""``data.directions=all``: every ordered pair of ``data.languages``, in the config checks, the
presets and a training run's data."""

from __future__ import annotations

import json

import pytest

from nmt.config import ConfigError
from nmt.config_checks import check_train_config, parse_directions
from nmt.data.multilingual import directions_of
from nmt.train.command import train

from .helpers import TINY_TRANSFORMER, compose_config


def names(directions) -> list[str]:
    return [str(d) for d in directions]


def test_all_is_every_ordered_pair_of_the_languages() -> None:
    want = ["de-en", "de-fr", "en-de", "en-fr", "fr-de", "fr-en"]
    assert names(parse_directions("all", languages=["de", "en", "fr"])) == want
    assert names(parse_directions(["all"], languages=["de", "en", "fr", "en"])) == want
    assert names(parse_directions(["de-en"], languages=["de", "en", "fr"])) == ["de-en"]


@pytest.mark.parametrize("languages", [None, [], ["en"], ["en", "en"]])
def test_all_without_two_languages_is_refused_by_name(languages) -> None:
    with pytest.raises(ConfigError, match=r"data.directions=all needs data.languages"):
        parse_directions("all", languages=languages)


def test_multi30k_has_twelve_directions_and_the_preset_trains_them_all() -> None:
    cfg = compose_config("train", ["data=multi30k_multilingual", "data.directions=all"])
    assert len(directions_of(cfg.data)) == 12
    preset = compose_config("train", ["experiment=multilingual_all_cpu"])
    check_train_config(preset)
    assert set(names(directions_of(preset.data))) == {
        f"{a}-{b}" for a in ("cs", "de", "en", "fr") for b in ("cs", "de", "en", "fr") if a != b
    }
    # six bilingual models' updates, the learning rate decaying over them
    assert (preset.trainer.max_steps, preset.trainer.max_time) == (6 * 1136, 0)
    assert preset.optim.decay_over == "steps"
    english = compose_config("train", ["experiment=multilingual_cpu"])
    assert len(directions_of(english.data)) == 6  # the English-centred preset is unchanged


def test_a_parallel_corpus_needs_its_languages(threeway, tmp_path) -> None:
    cfg = compose_config("train", ["data=parallel", "data.directions=all",
                                   f"data.train={threeway}", f"data.valid={threeway}"])  # fmt: skip
    with pytest.raises(ConfigError, match="data.languages"):
        check_train_config(cfg)


@pytest.mark.slow(seconds=8)
def test_a_run_on_all_directions_prepares_and_samples_each(threeway, tmp_path) -> None:
    overrides = [
        "data=parallel", "data.directions=all", "data.languages=[de,en,fr]",
        f"data.train={threeway}", f"data.valid={threeway}", f"data.test=[{threeway}]",
        f"data.root={tmp_path / 'data'}", "data.vocab_size=700", "data.max_tokens=800",
        f"outputs={tmp_path / 'outputs'}", "trainer.max_steps=3", "trainer.val_every=3",
        "trainer.val_sentences=4", "trainer.progress=false", "trainer.attention_sentences=0",
        "trainer.precision=32", "trainer.threads=1", *TINY_TRANSFORMER,
    ]  # fmt: skip
    result = train(compose_config("train", overrides), tmp_path / "run")
    assert result["state"]["step"] == 3
    events = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    start = next(e for e in events if e["event"] == "start")
    assert sorted(start["directions"]) == ["de-en", "de-fr", "en-de", "en-fr", "fr-de", "fr-en"]
    assert sum(d["share"] for d in start["directions"].values()) == pytest.approx(1.0)
    (validation,) = [e for e in events if e["event"] == "validation"]
    assert len(validation["directions"]) == 6
