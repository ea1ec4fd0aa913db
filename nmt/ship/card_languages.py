"""The languages of a model package: its manifest's directions and tag placement, and what its
model card says of a multilingual model (each direction and its ``nmt-eval`` scores, and how
its ``--format hf`` folder names the languages)."""

from __future__ import annotations

from typing import Any

from nmt.data.multilingual import directions_of, languages, placement_of
from nmt.ship.hf import code_languages, marian_code


def package_languages(cfg: Any) -> dict[str, Any]:
    """The manifest's ``directions`` and ``tag_placement`` of a multilingual model (a bilingual
    one: nothing)."""
    directions = directions_of(cfg.data)
    if not directions:
        return {}
    return {"directions": [str(d) for d in directions], "tag_placement": placement_of(cfg.data)}


def card_languages(cfg: Any) -> list[str]:
    """The card's ``language`` list: every language of the directions, or source and target."""
    directions = directions_of(cfg.data)
    if directions:
        return languages(directions)
    return [str(cfg.data.src_lang), str(cfg.data.tgt_lang)]


def card_directions(cfg: Any, bilingual: list[str]) -> list[str]:
    """The directions' names (``de-en``), or ``bilingual`` for a bilingual model."""
    directions = directions_of(cfg.data)
    return [str(d) for d in directions] if directions else bilingual


def direction_results(report: dict[str, Any], corpus: str, search: str) -> list[dict[str, Any]]:
    """The model-index entries of a multilingual ``nmt-eval`` report: one per test set and
    direction, its task naming the direction."""
    results = []
    for name, entry in report.get("directions", {}).items():
        direction = str(entry.get("direction", ""))
        kind = " (zero-shot)" if entry.get("zero_shot") else ""
        metrics = index_metrics(entry.get("scores", {}), search)
        results.append(
            {
                "task": {"type": "translation", "name": f"Translation {direction}{kind}"},
                "dataset": {"name": str(name), "type": corpus},
                "metrics": metrics,
            }
        )
    return results


def direction_score_lines(report: dict[str, Any], search: str) -> list[str]:
    """The card's score lines of a multilingual ``nmt-eval`` report, a paragraph per test set
    and direction (with its off-target rate when it was measured)."""
    lines: list[str] = []
    for name, entry in report.get("directions", {}).items():
        kind = ", zero-shot" if entry.get("zero_shot") else ""
        head = f"{name}: {entry.get('direction')}{kind} ({entry.get('sentences')} sentences"
        lines += [f"{head}, {search}):", ""]
        for metric, s in entry.get("scores", {}).items():
            score = s.get("score", float("nan"))
            lines.append(f"- {metric} {score:.2f} `{s.get('signature')}`")
        if "off_target" in entry:
            lines.append(f"- off-target rate {100 * float(entry['off_target']):.1f}% (py3langid)")
        pivot = entry.get("pivot")
        if isinstance(pivot, dict):
            for metric, s in pivot.get("scores", {}).items():
                score = s.get("score", float("nan"))
                lines.append(f"- through {pivot.get('via')}: {metric} {score:.2f}")
        lines.append("")
    return lines


def index_metrics(scores: dict[str, Any], search: str) -> list[dict[str, Any]]:
    """The ``metrics`` of a model-index result: each score of an eval report's set, named with
    the search that gave it, its sacreBLEU signature as the argument."""
    return [
        {
            "type": metric.lower(),
            "value": round(float(s.get("score", float("nan"))), 2),
            "name": f"{metric} ({search})",
            "verified": False,
            "args": {"signature": str(s.get("signature"))},
        }
        for metric, s in scores.items()
    ]


def hf_language_use(cfg: Any) -> tuple[list[str], list[str]]:
    """What the ``--format hf`` card says of a multilingual model's language codes, and the
    lines of its first example that name them: the tokenizer's call and, where the target's
    code is the first output token, ``forced_bos_token_id`` (nothing for a bilingual model)."""
    directions = directions_of(cfg.data)
    if not directions:
        return [], ['batch = tok(["<a source sentence>"], return_tensors="pt", padding=True)']
    placement, first = placement_of(cfg.data), directions[0]
    n = len(languages(directions))
    untrained = n * (n - 1) > len({str(d) for d in directions})  # an ordered pair not trained
    codes = ", ".join(f"`{marian_code(lang)}`" for lang in code_languages(cfg))
    where = {
        "source": "each source starts with the target language's code, Marian's convention",
        "target": "the target language's code is the first output token, the convention of "
        "M2M100 and NLLB: `generate` forces it (`forced_bos_token_id`, per call or in the "
        "generation config as below), and a label for training starts with it "
        '(`text_target=">>xx<< ..."`)',
        "both": "the source starts with its own language's code and the output with the target "
        "language's, the convention of NLLB: `generate` forces the target's "
        "(`forced_bos_token_id`, per call or in the generation config as below), and a label "
        "for training starts with it",
    }[placement]
    intro = [
        "",
        f"A multilingual model: {where}. Its codes, which the tokenizer turns into the model's "
        f"language tags: {codes}. Trained directions: {', '.join(str(d) for d in directions)}"
        + ("; another pair of its languages is zero-shot." if untrained else "."),
    ]
    head = {"source": first.tgt, "both": first.src}.get(placement)
    text = f"{marian_code(head)} <a source sentence>" if head else "<a source sentence>"
    example = [f'batch = tok(["{text}"], return_tensors="pt", padding=True)']
    if placement != "source":
        code = marian_code(first.tgt)
        example.append(
            f'model.generation_config.forced_bos_token_id = tok.convert_tokens_to_ids("{code}")'
        )
    return intro, example
