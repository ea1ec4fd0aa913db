"""The documentation site (mkdocs.yml, docs/, docs.hooks through scripts/docs_reference.py): the
generated reference pages list every key of every config and every command, and the site builds
strictly, offline."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf

from docs.hooks import listings
from docs.hooks.sections import expand
from nmt.config import (
    MODEL_SCHEMAS,
    AttentionConfig,
    EvalConfig,
    ServeConfig,
    TrainConfig,
    TranslateConfig,
)
from nmt.environment import VARIABLES
from nmt.store.package import CTranslate2Manifest, Manifest
from nmt.train.runlog import EVENTS

from .helpers import compose_config

REPO = Path(__file__).resolve().parents[1]
HYDRA_COMMANDS = {
    "nmt-eval": ("eval", EvalConfig),
    "nmt-translate": ("translate", TranslateConfig),
    "nmt-attention": ("attention", AttentionConfig),
    "nmt-serve": ("serve", ServeConfig),
}
ARGPARSE_COMMANDS = {
    "nmt-prepare": "nmt.data.prepare",
    "nmt-average": "nmt.store.average",
    "nmt-tune-decode": "nmt.evaluate.tune_decode",
    "nmt-compare": "nmt.evaluate.compare",
    "nmt-export": "nmt.ship.export",
    "nmt-import": "nmt.ship.import_command",
}


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """The reference pages with their generated sections filled in, as the site shows them."""
    folder = REPO / "docs/reference"
    return {p.stem: expand(p.read_text("utf-8"), REPO) for p in sorted(folder.glob("*.md"))}


def dataclass_keys(cls: type, prefix: str = "") -> set[str]:
    """Every leaf key of a config dataclass, nested dataclasses walked, ``model`` as every model
    schema."""
    keys: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kinds = [t for t in typing.get_args(hints[f.name]) or [hints[f.name]]]
        nested = [t for t in kinds if dataclasses.is_dataclass(t)]
        if f.name == "model" and cls is TrainConfig:
            nested = list(MODEL_SCHEMAS.values())
        if nested and not (cls is Manifest and f.name == "ctranslate2"):
            for schema in nested:
                keys |= dataclass_keys(schema, f"{prefix}{f.name}.")
        else:
            keys.add(prefix + f.name)
    return keys


def composed_keys(cfg: DictConfig | dict, prefix: str = "") -> set[str]:
    """Every leaf key of a composed config, as the command line names it."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=False)
    keys: set[str] = set()
    for key, value in cfg.items():
        if isinstance(value, dict):
            keys |= composed_keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def section(page: str, heading: str) -> str:
    """The part of a page under ``## `heading` ``, up to the next second-level heading."""
    marker = f"\n## `{heading}`\n"
    assert marker in page, f"no section {heading!r}"
    return page.split(marker, 1)[1].split("\n## ", 1)[0]


def listed(text: str, keys: set[str]) -> list[str]:
    """The keys that have no table row in ``text``."""
    return sorted(k for k in keys if f"| `{k}` |" not in text)


def test_the_configuration_page_lists_every_key_of_the_training_config(pages) -> None:
    page = pages["configuration"]
    keys = dataclass_keys(TrainConfig)
    for model in ("transformer", "transformer_base", "gru_bahdanau"):
        keys |= composed_keys(compose_config("train", [f"model={model}"]))
    assert "data.vocab_size" in keys and "model.d_model" in keys and "model.emb_dim" in keys
    assert listed(page, keys) == []


def test_the_configuration_page_lists_every_option_of_every_group(pages) -> None:
    page = pages["configuration"]
    for path in sorted((REPO / "configs").glob("*/**/*.yaml")):
        group = path.parent.relative_to(REPO / "configs").as_posix()
        assert f"`{group}={path.stem}`" in page, path


def test_the_commands_page_lists_every_command(pages) -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    commands = re.findall(r"^([\w-]+)\s*=", scripts, re.MULTILINE)
    assert "nmt-train" in commands and len(commands) >= 9
    assert set(commands) == {"nmt-train", *HYDRA_COMMANDS, *ARGPARSE_COMMANDS}
    for command in commands:
        section(pages["commands"], command)


@pytest.mark.parametrize("command", sorted(HYDRA_COMMANDS))
def test_the_commands_page_lists_every_key_of_a_hydra_command(pages, command: str) -> None:
    name, schema = HYDRA_COMMANDS[command]
    keys = dataclass_keys(schema) | composed_keys(compose_config(name))
    assert listed(section(pages["commands"], command), keys) == []


@pytest.mark.parametrize("command", sorted(ARGPARSE_COMMANDS))
def test_the_commands_page_lists_every_option_of_an_argparse_command(
    pages, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(ARGPARSE_COMMANDS[command]).main  # the command's entry point
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit) as stopped:
        main()
    shown = capsys.readouterr()
    assert stopped.value.code == 0, shown.err[-2000:]
    options = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", shown.out)) - {"-h", "--help"}
    assert options
    text = section(pages["commands"], command)
    assert sorted(o for o in options if f"`{o}`" not in text) == []


def test_the_make_targets_are_listed(pages) -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = re.findall(r"^([a-zA-Z_-]+):.*## ", makefile, re.MULTILINE)
    assert "train" in targets and "docs" in targets
    assert sorted(t for t in targets if f"| `make {t}` |" not in pages["commands"]) == []


def test_every_event_manifest_field_and_environment_variable_is_listed(pages) -> None:
    assert sorted(e for e in EVENTS if f"| `{e}` |" not in pages["run-files"]) == []
    manifest = dataclass_keys(Manifest) | dataclass_keys(CTranslate2Manifest, "ctranslate2.")
    assert listed(pages["package"], manifest) == []
    names = [n.strip() for names in VARIABLES for n in names.split(",")]
    assert sorted(n for n in names if f"`{n}`" not in pages["environment"]) == []


def test_the_concept_pages_link_to_listed_source() -> None:
    anchors = set(re.findall(r"\{#([\w-]+)\}", listings.code(REPO)))
    links = set()
    for page in (REPO / "docs/concepts").glob("*.md"):
        links |= set(re.findall(r"code\.md#([\w-]+)", page.read_text(encoding="utf-8")))
    assert links and sorted(links - anchors) == []


def test_the_readme_links_point_at_files_of_the_repository() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)#]+)", readme) if "://" not in t]
    assert "docs/results.md" in targets
    assert sorted(t for t in targets if not (REPO / t).exists()) == []


@pytest.mark.slow(seconds=11)
def test_the_site_builds_strictly_and_loads_nothing_from_elsewhere(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", str(site)]
    built = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    pages = re.findall(r"'([\w/.-]+\.md)'", str(nav))
    for page in pages:
        html = page.removesuffix("README.md").removesuffix(".md") or "index"
        html = f"{html}index" if html.endswith("/") else html
        assert (site / f"{html}.html").is_file(), page
    remote = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//")
    loading = [p.name for p in site.rglob("*.html") if remote.search(p.read_text("utf-8"))]
    assert loading == []
    configuration = (site / "reference/configuration.html").read_text(encoding="utf-8")
    assert "data.vocab_size" in configuration and "<math" in (
        site / "concepts/scoring.html"
    ).read_text(encoding="utf-8")
