"""Model packages (``nmt-export``): the round trip is bit for bit, and a package loads through
the same gate as a checkpoint (nothing in it chooses code)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from nmt.atomic import sha256_file
from nmt.config import ConfigError
from nmt.data.datasets import encode_texts
from nmt.decode.options import DecodeOptions
from nmt.decode.search import decode_dataset
from nmt.decode.translate import translate
from nmt.evaluate.scoring import evaluate
from nmt.ship.export import export_package
from nmt.store.gate import CheckpointError
from nmt.store.loading import load_package, load_trained
from nmt.store.package import CONFIG, MANIFEST, WEIGHTS, model_argument
from nmt.train.command import train
from nmt.viz.plot_attention import plot_attention

from .helpers import REPO, TINY_TRANSFORMER, compose_config, tiny_run_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")


def tiny_run(corpus: Path, root: Path, *extra: str, gru: bool = False) -> Path:
    """A run of a few steps (weights barely trained: enough for bit-for-bit comparisons)."""
    overrides = tiny_run_overrides(
        corpus, root, "trainer.max_steps=6", "trainer.val_every=6", "trainer.device=cpu", *extra
    )
    if gru:  # the tiny Transformer's sizes do not apply
        overrides = [o for o in overrides if o not in TINY_TRANSFORMER]
    run = root / "run"
    train(compose_config("train", overrides), run)
    return run


@pytest.fixture(scope="module")
def gru_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(
        corpus,
        tmp_path_factory.mktemp("gru"),
        "model=gru_bahdanau",
        "model.emb_dim=32",
        "model.hidden_dim=32",
        "model.attn_dim=32",
        "data.joint_vocab=false",
        gru=True,
    )


@pytest.fixture(scope="module")
def transformer_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tiny_run(corpus, tmp_path_factory.mktemp("transformer"), "decode.beam=3")
    return run


def sources(corpus: Path, n: int = 40) -> list[str]:
    return Path(f"{corpus}.de").read_text(encoding="utf-8").splitlines()[:n]


@pytest.mark.parametrize("which", ["transformer_run", "gru_run"])
@pytest.mark.parametrize("beam", [1, 4])
def test_package_decodes_bit_for_bit_like_its_checkpoint(
    which: str, beam: int, corpus: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run = request.getfixturevalue(which)
    ckpt = run / "checkpoints" / "best.pt"
    package = export_package(ckpt, tmp_path / "pkg")
    trained, packaged = load_trained(ckpt, CPU), load_package(package, CPU)
    for (name, a), (_, b) in zip(
        trained.model.state_dict().items(), packaged.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    # tied matrices stay tied, so they are stored once
    stored = json.loads((package / MANIFEST).read_text())
    assert stored["parameters"] == trained.model.num_parameters()
    data = encode_texts(trained.tokenizers, sources(corpus), [""] * 40)
    opts = DecodeOptions(beam=beam, length_penalty=0.6)
    ours = decode_dataset(trained.model, data, opts, CPU)
    theirs = decode_dataset(packaged.model, data, opts, CPU)
    assert [h.tokens for h in ours] == [h.tokens for h in theirs]
    assert [h.score for h in ours] == [h.score for h in theirs]  # fp32: bit for bit
    assert packaged.tokenizers.joint == trained.tokenizers.joint
    assert packaged.tokenizers.tgt.proto == trained.tokenizers.tgt.proto


def test_commands_accept_model_dir_with_the_checkpoint_results(
    transformer_run: Path, corpus: Path, tmp_path: Path
) -> None:
    ckpt = transformer_run / "checkpoints" / "best.pt"
    package = export_package(ckpt, tmp_path / "pkg")
    card = (package / "README.md").read_text()
    assert "licence of the data" in card and "nmt-train" in card and "transformer" in card
    manifest = json.loads((package / MANIFEST).read_text())
    assert manifest["source_checkpoint"] == "run/checkpoints/best.pt"  # no local paths
    # the run's decode section travels with the package: beam 3 here
    assert yaml.safe_load((package / CONFIG).read_text())["decode"]["beam"] == 3
    test = f"test=[{corpus}.de:{corpus}.en]"
    from_ckpt = evaluate(compose_config("eval", [f"ckpt={ckpt}", test, f"out={tmp_path / 'a'}"]))
    from_pkg = evaluate(
        compose_config("eval", [f"model_dir={package}", test, f"out={tmp_path / 'b'}"])
    )
    assert from_pkg["options"] == from_ckpt["options"] and from_pkg["options"]["beam"] == 3
    (a,), (b,) = from_ckpt["sets"].values(), from_pkg["sets"].values()
    assert Path(a["hypotheses"]).read_text() == Path(b["hypotheses"]).read_text()
    assert a["scores"]["BLEU"] == b["scores"]["BLEU"]

    src = tmp_path / "in.de"
    src.write_text("\n".join(sources(corpus, 5)) + "\n", encoding="utf-8")
    outputs = []
    for key, value in (("ckpt", ckpt), ("model_dir", package), ("run", package)):
        out = tmp_path / f"{key}.en"
        translate(compose_config("translate", [f"{key}={value}", f"input={src}", f"output={out}"]))
        outputs.append(out.read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].count("\n") == 5

    pngs = plot_attention(
        compose_config(
            "attention", [f"model_dir={package}", "sentence=Ein Hund.", f"out={tmp_path / 'att'}"]
        )
    )
    assert pngs and all(p.is_file() for p in pngs)
    assert set(os.listdir(package)) == {MANIFEST, CONFIG, WEIGHTS, "README.md", "tokenizer"}


def test_model_equals_dir_on_the_command_line() -> None:
    assert model_argument(["model=/p", "beam=5", "+model=q"]) == [
        "model_dir=/p",
        "beam=5",
        "model_dir=q",
    ]
    assert model_argument(["model_dir=/p", "run=x"]) == ["model_dir=/p", "run=x"]


def _rewrite(package: Path, name: str, edit) -> None:
    """Edit a package file and record its new sha256, as a forger would."""
    path = package / name
    if name == CONFIG:
        path.write_text(yaml.safe_dump(edit(yaml.safe_load(path.read_text()))))
    else:
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    manifest = json.loads((package / MANIFEST).read_text())
    if name != MANIFEST:
        manifest["files"][name] = sha256_file(path)
        (package / MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture
def package(transformer_run: Path, tmp_path: Path) -> Path:
    return export_package(transformer_run / "checkpoints" / "best.pt", tmp_path / "pkg")


@pytest.mark.parametrize(
    ("name", "edit", "key"),
    [
        (CONFIG, lambda c: {**c, "model": {**c["model"], "arch": "os.system"}}, "model.arch"),
        (
            CONFIG,
            lambda c: {**c, "model": {**c["model"], "_target_": "builtins.exec"}},
            "model._target_",
        ),
        (CONFIG, lambda c: {**c, "model": {**c["model"], "extra": 1}}, "model.extra"),
        (CONFIG, lambda c: {**c, "hook": {"_target_": "os.system"}}, "hook"),
        (MANIFEST, lambda m: {**m, "loader": "pickle"}, "loader"),
        (MANIFEST, lambda m: {**m, "step": "many"}, "step"),
        (MANIFEST, lambda m: {**m, "arch": "gru_bahdanau"}, "arch"),
        (MANIFEST, lambda m: {**m, "files": {**m["files"], "../x.py": "0"}}, "files.../x.py"),
    ],
)
def test_a_package_that_chooses_code_or_carries_unknown_keys_is_refused(
    package: Path, name: str, edit, key: str
) -> None:
    _rewrite(package, name, edit)
    with pytest.raises(CheckpointError) as err:
        load_package(package, CPU)
    assert str(package / name) in str(err.value) and f"'{key}" in str(err.value)


def test_a_changed_file_is_refused(package: Path) -> None:
    with open(package / WEIGHTS, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(CheckpointError, match="sha256 does not match"):
        load_package(package, CPU)


def test_export_refuses_to_overwrite_and_cleans_up(transformer_run: Path, tmp_path: Path) -> None:
    ckpt = transformer_run / "checkpoints" / "best.pt"
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        export_package(ckpt, tmp_path / "taken")
    with pytest.raises(ConfigError, match="--quantize"):
        export_package(ckpt, tmp_path / "q", quantize="int8")
    export_package(ckpt, tmp_path / "pkg")
    with pytest.raises(ConfigError, match="--force"):
        export_package(ckpt, tmp_path / "pkg")
    export_package(ckpt, tmp_path / "pkg", force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg", "taken"]  # no temporaries


def test_nmt_export_command(transformer_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "nmt.ship.export", str(transformer_run), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"package {out}" in proc.stdout and (out / WEIGHTS).is_file()
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and "already exists" in bad.stderr
    shutil.rmtree(out)
