"""``trainer.freeze``: the named parts of a model keep their values through training (those a
fine-tuning run starts from), have no optimizer state, and every parameter of both models
belongs to a part; the others train as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import ConfigError
from nmt.config_checks import check_train_config
from nmt.models.registry import create_model
from nmt.store.checkpoint import load_checkpoint
from nmt.train.freeze import freeze, part_of

from .helpers import compose_config, run_in_process

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("model", "extra"),
    [("transformer", []), ("transformer", ["model.tie_embeddings=false", "model.output_bias=true",
                                           "model.learned_positions=true"]),
     ("gru_bahdanau", [])],
)  # fmt: skip
def test_every_parameter_belongs_to_a_part(model: str, extra: list[str]) -> None:
    cfg = compose_config("train", [f"model={model}", *extra])
    built = create_model(OmegaConf.to_container(cfg.model), src_vocab_size=40,
                         tgt_vocab_size=40, pad_id=0, shared_vocab=True)  # fmt: skip
    parts = {part_of(n) for n, _ in built.named_parameters(remove_duplicate=False)}
    assert parts == {"embeddings", "encoder", "decoder", "output"}


def test_a_frozen_part_does_not_change_in_a_gru_update() -> None:
    cfg = compose_config("train", ["model=gru_bahdanau", "model.emb_dim=8",
                                   "model.hidden_dim=8", "model.attn_dim=8"])  # fmt: skip
    torch.manual_seed(0)
    model = create_model(OmegaConf.to_container(cfg.model), src_vocab_size=30,
                         tgt_vocab_size=30, pad_id=0, shared_vocab=False)  # fmt: skip
    freeze(model, ["decoder", "output"])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    src = torch.randint(4, 30, (3, 5))
    tgt = torch.randint(4, 30, (3, 4))
    logits = model(src, torch.tensor([5, 4, 3]), tgt)
    logits.log_softmax(-1).mean().backward()
    optimizer.step()
    for name, param in model.named_parameters():
        same = torch.equal(param, before[name])
        assert same == (part_of(name) in ("decoder", "output")), name


def test_an_unknown_part_is_refused_by_name() -> None:
    cfg = compose_config("train", ["trainer.freeze=[encoder,wings]"])
    with pytest.raises(ConfigError, match=r"trainer.freeze\[1\]='wings' is not one of"):
        check_train_config(cfg)


def test_fine_tuning_with_frozen_embeddings_and_encoder(corpus: Path, tmp_path: Path) -> None:
    """A source run, then a run fine-tuned from it with the (tied) embeddings and the encoder
    frozen: those tensors are the source's bit for bit and have no Adam state; the decoder
    trained."""
    steps = ("trainer.max_steps=4", "trainer.val_every=4", "model.dropout=0.0")
    run_in_process(corpus, tmp_path, "source", *steps)
    source = tmp_path / "outputs" / "runs" / "source"
    run_in_process(corpus, tmp_path, "tuned", *steps, f"trainer.init_from={source}",
                   "trainer.freeze=[embeddings,encoder]", "optim.lr=1e-2")  # fmt: skip
    before = load_checkpoint(source / "checkpoints" / "last.pt")
    after = load_checkpoint(tmp_path / "outputs" / "runs" / "tuned" / "checkpoints" / "last.pt")
    changed = {n for n, t in after["model"].items() if not torch.equal(t, before["model"][n])}
    frozen = {n for n in after["model"] if part_of(n) in ("embeddings", "encoder")}
    assert frozen and not changed & frozen
    assert any(part_of(n) == "decoder" for n in changed)
    trained = sum(1 for n in after["model"] if part_of(n) not in ("embeddings", "encoder")
                  and not n.startswith("out_proj.weight"))  # fmt: skip
    assert len(after["optimizer"]["state"]) == trained
