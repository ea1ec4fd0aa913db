"""The paired bootstrap test of the mean BLEU difference over several sets: sacreBLEU's own test
where there is one set, a reference computed with sacreBLEU's public corpus_bleu where there
are two, and the mean row of nmt-compare."""

from __future__ import annotations

import numpy as np
import pytest
import sacrebleu

from nmt.evaluate.compare import CompareError, compare, markdown
from nmt.evaluate.metrics import paired_bootstrap
from nmt.evaluate.pooled import SetPair, mean_difference

from .test_compare import BASE, BETTER, REFS, bilingual, multilingual

pytestmark = pytest.mark.usefixtures("one_thread")

WORSE = [
    "A man a bike.",
    "Dogs snow.",
    "A woman is reading a book in the park.",
    "Children soccer.",
    "A black dog.",
    "People are walking.",
]


def test_one_set_is_sacrebleus_paired_test_resample_for_resample() -> None:
    for lang in (None, "en"):
        base, (system,) = paired_bootstrap(BASE, [BETTER], REFS, 300, 11, paper_lang=lang)
        mean = mean_difference([SetPair(BASE, BETTER, REFS, lang)], 300, 11)
        assert mean.difference == pytest.approx(system.score - base.score)
        assert mean.p_value == pytest.approx(system.p_value)
        assert mean.sets == 1 and mean.low <= mean.difference <= mean.high


def _reference(pairs: list[tuple[list[str], list[str], list[str]]], resamples: int, seed: int):
    """The mean test written out with corpus_bleu on the drawn sentences themselves."""
    rng = np.random.default_rng(seed)
    observed, drawn = [], []
    for base, system, refs in pairs:
        observed.append(
            sacrebleu.corpus_bleu(system, [refs]).score - sacrebleu.corpus_bleu(base, [refs]).score
        )
        draws = rng.choice(len(refs), size=(resamples, len(refs)), replace=True)
        drawn.append([
            sacrebleu.corpus_bleu([system[i] for i in d], [[refs[i] for i in d]]).score
            - sacrebleu.corpus_bleu([base[i] for i in d], [[refs[i] for i in d]]).score
            for d in draws
        ])  # fmt: skip
    means = np.mean(drawn, axis=0)
    difference = float(np.mean(observed))
    spread = np.abs(means)
    p = (np.sum(spread - spread.mean() > abs(difference)) + 1) / (resamples + 1)
    ordered = np.sort(means)
    return difference, ordered[resamples // 40], ordered[resamples - resamples // 40 - 1], p


def test_two_sets_match_the_test_written_out_with_corpus_bleu() -> None:
    refs2 = list(reversed(REFS))
    sets = [(BASE, BETTER, REFS), (list(reversed(BASE)), list(reversed(WORSE)), refs2)]
    mean = mean_difference([SetPair(*s) for s in sets], 200, 5)
    difference, low, high, p = _reference(sets, 200, 5)
    assert mean.difference == pytest.approx(difference)
    assert (mean.low, mean.high) == (pytest.approx(low), pytest.approx(high))
    assert mean.p_value == pytest.approx(p)
    one = mean_difference([SetPair(*sets[0])], 200, 5).difference
    two = mean_difference([SetPair(*sets[1])], 200, 5).difference
    assert mean.difference == pytest.approx((one + two) / 2)


def test_the_sides_swapped_negate_the_difference_and_keep_p() -> None:
    sets = [SetPair(BASE, BETTER, REFS), SetPair(BASE, WORSE, REFS)]
    swapped = [SetPair(s.system, s.baseline, s.references) for s in sets]
    a, b = mean_difference(sets, 300, 3), mean_difference(swapped, 300, 3)
    assert b.difference == pytest.approx(-a.difference)
    assert (b.low, b.high) == (pytest.approx(-a.high), pytest.approx(-a.low))
    assert b.p_value == pytest.approx(a.p_value)


def test_equal_sides_differ_by_nothing_and_a_clear_gain_is_significant() -> None:
    same = mean_difference([SetPair(BASE, BASE, REFS), SetPair(WORSE, WORSE, REFS)], 200, 1)
    assert (same.difference, same.p_value) == (0.0, 1.0)
    many_refs, many_base = REFS * 20, WORSE * 20
    gain = mean_difference(
        [SetPair(many_base, many_refs, many_refs), SetPair(many_base, BASE * 20, many_refs)],
        200,
        1,
    )
    assert gain.difference > 20 and gain.p_value < 0.01 and gain.low > 0


def test_sets_without_sentences_or_resamples_are_refused() -> None:
    with pytest.raises(ValueError, match="no sets"):
        mean_difference([], 100, 1)
    with pytest.raises(ValueError, match="5 baseline and 6 system"):
        mean_difference([SetPair(BASE[:5], BETTER, REFS)], 100, 1)
    with pytest.raises(ValueError, match="resamples=0"):
        mean_difference([SetPair(BASE, BETTER, REFS)], 0, 1)


def test_compare_adds_the_mean_row_for_several_sets_only(tmp_path) -> None:
    system = multilingual(tmp_path, {"de-en": BETTER, "fr-en": WORSE, "en-de": BASE})
    bases = [bilingual(tmp_path, d, d, BASE) for d in ("de-en", "fr-en", "en-de")]
    result = compare(bases, system, resamples=200, seed=7)
    rows, mean = result["rows"], result["mean"]
    assert mean["sets"] == 3
    assert mean["difference"] == pytest.approx(sum(r["difference"] for r in rows) / 3)
    assert mean["system"] - mean["baseline"] == pytest.approx(mean["difference"])
    pairs = [SetPair(BASE, h, REFS) for h in (BETTER, WORSE, BASE)]
    assert mean["p_value"] == pytest.approx(mean_difference(pairs, 200, 7).p_value)
    assert "| mean of 3 | |" in markdown(result)
    chosen = compare(bases, system, resamples=200, seed=7, directions=["de-en", "en-de"])
    assert [r["direction"] for r in chosen["rows"]] == ["de-en", "en-de"]
    assert chosen["mean"]["sets"] == 2
    one = compare(bases, system, resamples=200, seed=7, directions=["de-en"])
    assert "mean" not in one and "mean of" not in markdown(one)
    named = compare(bases, system, resamples=200, seed=7, sets=["test_2016_flickr"])
    assert named["rows"] == rows
    with pytest.raises(CompareError, match=r"--sets test_2017_flickr: no set of .* among them"):
        compare(bases, system, resamples=200, seed=7, sets=["test_2017_flickr"])


def test_a_set_without_references_is_refused_by_its_file(tmp_path) -> None:
    system = multilingual(tmp_path, {"de-en": []})
    base = bilingual(tmp_path, "de-en", "de-en", [], refs=[])
    with pytest.raises(CompareError, match=r"de-en\.ref: no references"):
        compare([base], system, resamples=100, seed=1)


def test_directions_that_name_nothing_or_no_direction_are_refused(tmp_path) -> None:
    system = multilingual(tmp_path, {"de-en": BETTER})
    base = bilingual(tmp_path, "de-en", "de-en", BASE)
    with pytest.raises(CompareError, match=r"--directions cs-en: no set of .* is among them"):
        compare([base], system, resamples=100, seed=1, directions=["cs-en"])
    with pytest.raises(CompareError, match=r"--directions\[0\]='deen' is not a direction"):
        compare([base], system, resamples=100, seed=1, directions=["deen"])
