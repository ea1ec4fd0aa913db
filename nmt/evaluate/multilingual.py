"""``nmt-eval`` of a multilingual run: every trained direction, and the zero-shot directions
named by ``zero_shot=[de-fr]``, each on the run's test split(s) in that direction, on its
validation split (``split=valid``, into ``eval-valid/``), or on the sets of ``test=[...]``
(:func:`direction_sets`).

Each direction gets BLEU, chrF (with bootstrap intervals, as the bilingual evaluation), TER,
the papers' lowercased Moses-tokenized BLEU (``bleu_paper``, as the bilingual evaluation),
and its off-target rate: the share of non-empty outputs that a language identifier
(``py3langid``, whose model ships inside its wheel; the ``multilingual`` extra) does not
assign to the target language, choosing among the model's own languages. A zero-shot
direction is also translated through the pivot language (``pivot=en``: two decodes, source
to pivot and pivot to target), the baseline its direct figures are read against, and (with
``bootstrap`` resamples) the paired bootstrap test of the direct output against the pivot's.
So is a trained direction between two languages other than the pivot (``pivot_trained``, on by
default: the de-fr of a ``data.directions=all`` model), which shows whether training the pair
directly beat going through the pivot. Each direction's references are written beside its
hypotheses, for ``nmt-compare``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from nmt.atomic import atomic_write_bytes
from nmt.cli import Progress
from nmt.config import ConfigError, EvalSplit
from nmt.config_checks import Direction, parse_directions
from nmt.data.corpus import (
    DataError,
    multi30k_languages,
    read_parallel,
    resolve_pair,
    strip_lines,
)
from nmt.data.multilingual import (
    directions_of,
    languages,
    placement_of,
    target_languages,
    target_tag,
)
from nmt.data.multiprep import DirectionSplit, direction_prefix, resolve_direction_splits
from nmt.decode.engines import TorchEngine
from nmt.decode.languages import Target, target_dataset
from nmt.decode.options import DecodeOptions
from nmt.environment import multi30k_source
from nmt.evaluate.metrics import (
    SIGNIFICANCE,
    all_scores,
    moses_tokenize,
    paired_bootstrap,
    paper_entry,
    paper_line,
)
from nmt.store.loading import Trained

log = logging.getLogger(__name__)


class LanguageIdentifier:
    """py3langid restricted to a model's languages: ``language(text)`` is the most likely."""

    def __init__(self, langs: Sequence[str]) -> None:
        try:
            from py3langid.langid import MODEL_FILE
            from py3langid.langid import LanguageIdentifier as _Identifier
        except ImportError as err:
            raise ConfigError(
                "the off-target rate needs py3langid: pip install 'nmt[multilingual]' "
                "(or off_target=false)"
            ) from err
        self._id = _Identifier.from_model_file(MODEL_FILE, norm_probs=False)
        known = set(self._id.nb_classes)
        usable = [lang for lang in langs if lang in known]
        if not usable:
            raise ConfigError(f"py3langid knows none of the languages {', '.join(langs)}")
        self._id.set_languages(usable)
        self.languages = usable

    def language(self, text: str) -> str:
        return str(self._id.classify(text)[0])


def off_target_rate(hyps: Sequence[str], lang: str, identify: Callable[[str], str]) -> float:
    """Share of the non-empty outputs identified as another language than ``lang``."""
    texts = [h for h in hyps if h.strip()]
    if not texts:
        return 0.0
    return sum(identify(h) != lang for h in texts) / len(texts)


def _decode(
    engine: TorchEngine,
    trained: Trained,
    opts: DecodeOptions,
    src: list[str],
    langs: tuple[str, str],
    advance: Callable[[int], None],
) -> list[str]:
    """Translations of ``src`` from ``langs[0]`` into ``langs[1]`` (tagged as the run's
    placement says), as nmt-translate makes them: each line stripped, an empty one not
    decoded."""
    tok = trained.tokenizers
    tag = target_tag(tok.tgt, langs[1], target_languages(trained.cfg.data))
    placement = placement_of(trained.cfg.data)
    src_tag = tok.src.tags.get(langs[0]) if placement == "both" else None
    target = Target(langs[1], tag, placement, langs[0], src_tag)
    data = target_dataset(tok, strip_lines(src), target)
    hyps = engine.hypotheses(data, opts, advance=advance)
    return [tok.tgt.decode(h.tokens) for h in hyps]


def _scored(
    hyps: list[str],
    refs: list[str],
    ref_tokens: list[str],
    lang: str,
    cfg: DictConfig,
    identify: Any,
) -> dict[str, Any]:
    """The scores of ``hyps`` (``ref_tokens``: the references Moses-tokenized in ``lang``)."""
    scores = all_scores(hyps, refs, cfg.bootstrap, cfg.bootstrap_seed)
    paper = paper_entry(hyps, ref_tokens, lang, cfg.bootstrap, cfg.bootstrap_seed)
    entry: dict[str, Any] = {"scores": {s.name: s.as_dict() for s in scores}, "bleu_paper": paper}
    if identify is not None:
        entry["off_target"] = off_target_rate(hyps, lang, identify)
    for s in scores:
        print(f"  {s.line()}")
    print(f"  {paper_line(paper)}")
    if identify is not None:
        print(f"  off-target rate: {100 * entry['off_target']:.1f}% (py3langid)")
    return entry


def _write(path: Path, lines: list[str]) -> None:
    atomic_write_bytes(path, "".join(h + "\n" for h in lines).encode("utf-8"))


def eval_directions(cfg: DictConfig, trained: Trained) -> tuple[list[Direction], list[Direction]]:
    """The trained directions and the zero-shot ones asked for (``zero_shot``; unset, the
    run's ``data.zero_shot``), checked: a target language the model has no tag for is refused,
    naming the languages it has."""
    trained_dirs = directions_of(trained.cfg.data)
    key, names = "zero_shot", cfg.zero_shot
    if names is None:
        key, names = "data.zero_shot", trained.cfg.data.get("zero_shot") or []
    zero = [d for d in parse_directions(list(names), key) if d not in trained_dirs]
    targets = target_languages(trained.cfg.data)
    for d in trained_dirs + zero:
        target_tag(trained.tokenizers.tgt, d.tgt, targets)
    known = languages(trained_dirs)
    for d in zero:
        if d.src not in known:
            raise DataError(
                f"source language {d.src!r} of zero_shot direction {d} was not trained: this "
                f"model reads {', '.join(known)}"
            )
        if cfg.pivot not in targets:
            raise DataError(
                f"pivot={cfg.pivot!r} was not trained as a target language: this model "
                f"translates into {', '.join(targets)}"
            )
    return trained_dirs, zero


def evaluate_multilingual(
    cfg: DictConfig, trained: Trained, opts: DecodeOptions, out_dir: Path, tag: str
) -> dict[str, Any]:
    """Decode and score every direction (see the module docstring); the report."""
    if cfg.engine not in ("auto", "torch"):
        raise ConfigError(f"engine={cfg.engine}: a multilingual model decodes with engine=torch")
    trained_dirs, zero = eval_directions(cfg, trained)
    pivoted = set(zero) | set(pivoted_trained(cfg, trained, trained_dirs))
    data_cfg = trained.cfg.data
    identify = None
    if cfg.off_target:
        identify = LanguageIdentifier(languages(trained_dirs)).language
    engine = TorchEngine(trained.model, trained_device(trained))
    progress = Progress(cfg.progress)
    report: dict[str, Any] = {"directions": {}, "zero_shot": [str(d) for d in zero]}
    for d, splits in direction_sets(cfg, data_cfg, trained_dirs + zero).items():
        for split in splits:
            src, refs = (strip_lines(x) for x in read_parallel(split.src_path, split.tgt_path))
            if not src:
                raise DataError(f"test set {split.src_path} has no sentences")
            name = f"{split.set_name}.{d}"
            start = time.perf_counter()
            with progress.bar(name, len(src)) as advance:
                hyps = _decode(engine, trained, opts, src, (d.src, d.tgt), advance)
            seconds = time.perf_counter() - start
            hyp_file = out_dir / f"{name}.{tag}.hyp"
            _write(hyp_file, hyps)
            ref_file = out_dir / f"{name}.ref"  # what nmt-compare pairs hypotheses with
            _write(ref_file, refs)
            ref_tokens = moses_tokenize(refs, d.tgt)  # once, for the direct and pivot outputs
            kind = "zero-shot" if d in zero else "trained"
            print(f"{name} ({kind}): {len(hyps)} sentences in {seconds:.1f}s -> {hyp_file}")
            entry = {"set": split.set_name, "direction": str(d), "zero_shot": d in zero,
                     "sentences": len(hyps), "seconds": seconds, "hypotheses": str(hyp_file),
                     "references": str(ref_file),
                     **_scored(hyps, refs, ref_tokens, d.tgt, cfg, identify)}  # fmt: skip
            if d in pivoted:
                pivot_file = out_dir / f"{name}.pivot-{cfg.pivot}.{tag}.hyp"
                entry["pivot"], pivot_hyps = _pivot(
                    engine, trained, opts, src, (refs, ref_tokens), d, cfg, identify, pivot_file
                )
                if cfg.bootstrap:
                    entry["pivot"]["paired"] = _against_pivot(hyps, pivot_hyps, refs, cfg)
            report["directions"][name] = entry
    return report


def direction_sets(
    cfg: DictConfig, data_cfg: DictConfig, directions: Sequence[Direction]
) -> dict[Direction, list[DirectionSplit]]:
    """The sets each direction is scored on: the run's ``data.test`` splits, its ``data.valid``
    one (``split=valid``), or those of ``test=[...]``: split names of the run's corpus (Multi30k's
    held-out ``test_2017_flickr``) or path prefixes with a ``<prefix>.<lang>`` file per
    language. A set that lacks one of a direction's two languages (the 2017 sets have no Czech)
    is left out for that direction, and said so; a set that no direction can use is an
    error."""
    if cfg.test:
        key, names = "test", [str(n) for n in cfg.test]
    elif cfg.split == EvalSplit.valid:
        key, names = "data.valid", [str(data_cfg.valid)]
    else:
        key, names = "data.test", [str(n) for n in data_cfg.test]
    for name in names:
        if ":" in name:
            raise ConfigError(
                f"{key}: {name!r} is a source:reference pair, which names no direction; a "
                "multilingual run is scored in each direction on a split of its corpus "
                "(test_2017_flickr) or on a path prefix with one <prefix>.<lang> file per language"
            )
    usable = {n: [d for d in directions if _has_both_sides(data_cfg, n, d)] for n in names}
    hint = "" if data_cfg.corpus == "multi30k" else "; a prefix needs both <prefix>.<lang> files"
    for name, dirs in usable.items():
        if not dirs:
            raise DataError(
                f"{key}: {name!r} has both languages of none of this model's directions "
                f"({', '.join(map(str, directions))}){hint}"
            )
        left_out = [str(d) for d in directions if d not in dirs]
        if left_out:
            print(f"{Path(name).name}: not scored in {', '.join(left_out)}, whose languages it "
                  "does not both have")  # fmt: skip
    return {
        d: resolve_direction_splits(
            data_cfg, [n for n in names if d in usable[n]], [d], multi30k_source()
        )
        for d in directions
    }


def _has_both_sides(data_cfg: DictConfig, name: str, d: Direction) -> bool:
    """Whether the set ``name`` of the run's corpus has both languages of ``d``; an unknown
    Multi30k split counts as having them, so that its own error names the valid ones."""
    if data_cfg.corpus == "multi30k":
        has = multi30k_languages(name)
        return not has or {d.src, d.tgt} <= set(has)
    try:
        resolve_pair(direction_prefix(name, d), d.src, d.tgt)
    except DataError:
        return False
    return True


def pivoted_trained(
    cfg: DictConfig, trained: Trained, trained_dirs: Sequence[Direction]
) -> list[Direction]:
    """The trained directions also decoded through the pivot (``pivot_trained``): those between
    two languages other than the pivot, where the model translates into the pivot."""
    if not cfg.pivot_trained or cfg.pivot not in target_languages(trained.cfg.data):
        return []
    return [d for d in trained_dirs if cfg.pivot not in (d.src, d.tgt)]


def _pivot(
    engine: TorchEngine,
    trained: Trained,
    opts: DecodeOptions,
    src: list[str],
    refs: tuple[list[str], list[str]],
    d: Direction,
    cfg: DictConfig,
    identify: Any,
    hyp_file: Path,
) -> tuple[dict[str, Any], list[str]]:
    """The baseline of a zero-shot (or pivoted trained) direction: source -> pivot -> target,
    two decodes; its report entry and its hypotheses (``refs``: the references, raw and
    Moses-tokenized)."""
    start = time.perf_counter()
    middle = _decode(engine, trained, opts, src, (d.src, cfg.pivot), lambda _: None)
    hyps = _decode(engine, trained, opts, middle, (cfg.pivot, d.tgt), lambda _: None)
    _write(hyp_file, hyps)
    print(f"  pivot through {cfg.pivot} ({time.perf_counter() - start:.1f}s) -> {hyp_file}")
    entry = {
        "via": cfg.pivot,
        "hypotheses": str(hyp_file),
        **_scored(hyps, *refs, d.tgt, cfg, identify),
    }
    return entry, hyps


def _against_pivot(
    direct_hyps: list[str], pivot_hyps: list[str], refs: list[str], cfg: DictConfig
) -> dict[str, Any]:
    """The paired bootstrap test of the direct output against the pivot's."""
    pivot, (direct,) = paired_bootstrap(
        pivot_hyps, [direct_hyps], refs, cfg.bootstrap, cfg.bootstrap_seed
    )
    assert direct.p_value is not None
    difference = direct.score - pivot.score
    verdict = "significant" if direct.p_value < SIGNIFICANCE else "not significant"
    print(
        f"  direct - pivot: {difference:+.2f} BLEU, p = {direct.p_value:.4f} ({verdict}; "
        f"paired bootstrap, {cfg.bootstrap} resamples)"
    )
    return {"test": "paired bootstrap", "resamples": cfg.bootstrap, "seed": cfg.bootstrap_seed,
            "direct_minus_pivot": difference, "p_value": direct.p_value}  # fmt: skip


def trained_device(trained: Trained) -> Any:
    """The device the model's weights are on."""
    return next(trained.model.parameters()).device
