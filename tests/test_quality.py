"""Quality regression: a short training run on the real Multi30k corpus must learn.

A change that quietly breaks learning (a wrong mask, a shifted target, a schedule that never
warms up, a loss that ignores the wrong tokens) still passes shape and equality tests; it does
not pass this one. The default Transformer trains for a fixed number of updates on the whole
de->en training split, and greedy validation BLEU must clear a floor set from measurements on
a 2-core CPU with a wide margin (see FLOOR). Takes about four minutes there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.train.command import train

from .helpers import compose_config

STEPS = 200
VAL_SENTENCES = 300
# Measured on a 2-core CPU (bf16, 4 minutes on a quiet machine): validation BLEU 15.1 and
# validation loss 3.17 (training loss 6.9 at update 50) after 200 updates. A run that has stopped
# learning stays near BLEU 0 and a loss above 6.
FLOOR_BLEU = 8.0
MAX_LOSS = 5.0


@pytest.mark.slow(seconds=195)
def test_default_transformer_learns_multi30k_de_en(multi30k_root: Path, tmp_path: Path) -> None:
    overrides = [
        f"data.root={multi30k_root}",  # prepared once for this and tests/test_data.py
        f"outputs={tmp_path / 'outputs'}",
        "optim=adam_linear",
        "optim.lr=2e-3",
        "optim.warmup_steps=100",
        f"trainer.max_steps={STEPS}",
        f"trainer.val_every={STEPS}",
        f"trainer.val_sentences={VAL_SENTENCES}",
        "trainer.attention_sentences=0",
        "trainer.progress=false",
        "trainer.seed=1",
        "trainer.precision=bf16",  # as measured; auto's probe costs seconds, minutes when busy
    ]
    result = train(compose_config("train", overrides), tmp_path / "run")
    state = result["state"]
    assert state["step"] == STEPS
    (last,) = state["history"]
    assert last["loss"] < MAX_LOSS, f"validation loss {last['loss']:.2f} after {STEPS} updates"
    assert last["bleu"] >= FLOOR_BLEU, (
        f"validation BLEU {last['bleu']:.2f} after {STEPS} updates, below the floor "
        f"{FLOOR_BLEU} (2-core CPU measurement: see the module docstring)"
    )
