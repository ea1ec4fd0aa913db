"""A pretrained transformers model as a run directory: the folder (or Hub id) resolved, read
by :func:`nmt.store.hf_import.import_marian` (a ``MarianMTModel``, OPUS-MT) or
:func:`nmt.store.m2m100_import.import_m2m100` (M2M100, NLLB-200), and written as a run whose
every command reads it as it reads one trained here: ``config.yaml`` (the Transformer's fields;
the languages of the tokenizer's config, or the model's own, any pair of them) and
``checkpoints/best.pt`` (weights, tokenizers, config, a step-0 training state). The run
directory is written whole or not at all. ``nmt-import`` writes one where it is told;
``trainer.init_from=hf:SOURCE`` (:func:`imported_run`) once under ``<outputs>/imported/``.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from nmt.atomic import atomic_write_bytes
from nmt.cli import config_dir
from nmt.config import ConfigError, register_configs, to_container
from nmt.store.checkpoint import save_checkpoint
from nmt.store.hf_import import Imported, import_marian, read_config, read_json_object
from nmt.store.m2m100_import import import_m2m100

log = logging.getLogger(__name__)

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")
LANGUAGE = re.compile(r"[A-Za-z]{2,3}(_[A-Za-z]{4})?")
# what a Marian, M2M100 or NLLB folder holds that the import reads
HUB_FILES = ["config.json", "vocab.json", "target_vocab.json", "source.spm", "target.spm",
             "sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json",
             "model.safetensors", "pytorch_model.bin"]  # fmt: skip


def resolve_source(source: str) -> Path:
    """The local folder of ``source``: a folder as it is, a Hub id through ``huggingface_hub``."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or not HUB_ID.fullmatch(source):
        raise ConfigError(f"{source}: not a model folder, nor a Hub id such as "
                          "Helsinki-NLP/opus-mt-de-en")  # fmt: skip
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ConfigError(
            f"{source}: a Hub id needs huggingface_hub: pip install 'nmt[hf]'"
        ) from None
    try:
        return Path(snapshot_download(source, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, unknown id, refused: huggingface_hub's own errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"{source}: not a local folder, and the Hub did not give it ({first}); without the "
            "network, download the folder elsewhere and pass its path"
        ) from None


def languages(folder: Path) -> tuple[str, str]:
    """The source and target languages of ``tokenizer_config.json`` (``src``/``tgt`` where it
    names none, or names something that is not a language code)."""
    try:
        config = read_json_object(folder, "tokenizer_config.json")
    except ConfigError:
        config = {}
    pair = []
    for key, default in (("source_lang", "src"), ("target_lang", "tgt")):
        value = config.get(key)
        pair.append(value if isinstance(value, str) and LANGUAGE.fullmatch(value) else default)
    return pair[0], pair[1]


def run_config(imported: Imported, data: list[str]) -> DictConfig:
    """The train config of the imported model: its architecture and the ``data`` overrides
    of its languages and tokenizers (the folder's, never trained again)."""
    overrides = ["model=transformer", *data, *fine_tune_overrides(imported)]
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose("train", overrides=overrides)  # the training config, composed


def write_run(imported: Imported, cfg: DictConfig, out: Path, origin: str) -> None:
    """``out`` as a run directory holding the imported model, written whole or not at all."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty folder; choose another")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "checkpoints").mkdir()
        payload = {
            "model": imported.model.state_dict(),
            "tokenizers": imported.tokenizers.state_dict(),
            "config": to_container(cfg),
            # a run at step 0, none of whose updates were made here
            "state": {"step": 0, "history": [], "init_from": {"checkpoint": origin, "step": 0}},
        }
        save_checkpoint(payload, tmp / "checkpoints" / "best.pt")
        atomic_write_bytes(tmp / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True).encode())
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def import_folder(folder: Path) -> tuple[Imported, list[str], str]:
    """The folder's model, the ``data`` overrides of its run, and its languages in words."""
    if read_config(folder).get("model_type") == "m2m_100":
        imported = import_m2m100(folder)
        langs = imported.vocab.languages
        data = _multilingual(langs[0], langs[1], "all", "both", joint=True)
        data.append(f"data.languages=[{','.join(langs)}]")
        return imported, data, f"{len(langs)} languages, any pair"
    imported = import_marian(folder)
    src_lang, tgt_lang = languages(folder)
    targets = [lang for lang in imported.vocab.languages if lang != src_lang]
    if targets:  # a multi-target model: the target's code first in the source (>>fra<<)
        directions = ",".join(f"{src_lang}-{lang}" for lang in targets)
        data = _multilingual(src_lang, targets[0], f"[{directions}]", "source", joint=False)
        return imported, data, f"{src_lang}->{', '.join(targets)}"
    data = [f"data.src_lang={src_lang}", f"data.tgt_lang={tgt_lang}", "data.joint_vocab=false"]
    return imported, data, f"{src_lang}->{tgt_lang}"


def _multilingual(src: str, tgt: str, directions: str, placement: str, joint: bool) -> list[str]:
    """The ``data`` overrides of an imported multilingual run: its directions and the place of
    its tags; no corpus of its own (a fine-tuning run names one)."""
    return ["data=parallel", "data.train=train", "data.valid=valid", f"data.src_lang={src}",
            f"data.tgt_lang={tgt}", f"data.directions={directions}",
            f"data.tag_placement={placement}", f"data.joint_vocab={str(joint).lower()}",
            "data.zero_shot=[]"]  # fmt: skip


def fine_tune_overrides(imported: Imported) -> list[str]:
    """The imported architecture as model overrides."""
    return [f"model.{k}={v}" for k, v in imported.fields.items() if k != "arch"]


def imported_run(source: str, outputs: Path) -> Path:
    """The run directory of ``source`` (a model folder or a Hub id) under
    ``<outputs>/imported/``: imported on first use, then reused as it is."""
    name = re.sub(r"[^\w.-]+", "--", source.strip("/")).strip("-.") or "model"
    out = outputs / "imported" / name
    if (out / "checkpoints" / "best.pt").is_file():
        log.info("trainer.init_from=hf:%s: the import made earlier, %s (delete it to import "
                 "again)", source, out)  # fmt: skip
        return out
    folder = resolve_source(source)
    imported, data, said = import_folder(folder)
    write_run(imported, run_config(imported, data), out, str(folder))
    log.info("trainer.init_from=hf:%s: imported (%s) as %s", source, said, out)
    return out
