"""The CUDA paths, checked on a machine without a GPU by faking what torch.cuda reports: the
random states a checkpoint keeps and gives back on fewer or other GPUs, ``precision=auto`` by
compute capability, TF32 where a command picks its device, the GPU and backend of each DDP
rank, the validation decode's precision against ``nmt-eval``'s, and the PyTorch floor checked
when nmt is imported."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import nmt
from nmt.decode import translate as translate_command
from nmt.decode.options import DecodeOptions
from nmt.evaluate import scoring, tune_decode
from nmt.runtime import device as device_module
from nmt.runtime.device import native_bf16, setup_device
from nmt.runtime.distributed import DistInfo, init_distributed, rank_gpu, slurm_dist_env
from nmt.runtime.precision import SpeedProbe, resolve_precision
from nmt.serve import backend
from nmt.store import checkpoint as ckpt
from nmt.train.build import build_scaler
from nmt.train.setup import training_device, training_precision
from nmt.train.validation import validation_options
from nmt.viz import plot_attention

from .helpers import REPO, compose_config

CUDA = torch.device("cuda")


class FakeGpus:
    """torch.cuda's device count, current device and random states of ``count`` GPUs, with
    torch's error for a GPU beyond them (``default_generators[index]``: an IndexError)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int, current: int = 0) -> None:
        self.count, self.current = count, current
        self.states = [self.state(index) for index in range(count)]
        for name, value in {
            "is_available": lambda: True,
            "device_count": lambda: self.count,
            "current_device": lambda: self.current,
            "get_rng_state_all": lambda: [s.clone() for s in self.states],
            "set_rng_state": self.set_rng_state,
            "set_rng_state_all": self.set_rng_state_all,
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)

    @staticmethod
    def state(tag: int) -> torch.Tensor:
        return torch.full((16,), tag, dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor, device: Any = "cuda") -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        self.states[self.current if index is None else index] = state.clone()

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        for index, state in enumerate(states):
            self.set_rng_state(state, index)

    def tags(self) -> list[int]:
        return [int(s[0]) for s in self.states]


def saved_on(monkeypatch: pytest.MonkeyPatch, count: int, current: int, tmp_path: Path) -> dict:
    """The random state a process drawing from cuda:``current`` of ``count`` GPUs saves (GPU i's
    state tagged 10 + i), through a checkpoint file."""
    gpus = FakeGpus(monkeypatch, count, current)
    gpus.states = [gpus.state(10 + i) for i in range(count)]
    path = tmp_path / f"rng-{count}-{current}.pt"
    ckpt.save_checkpoint({"rng": ckpt.rng_state()}, path)
    return ckpt.load_checkpoint(path)["rng"]


# ---------------------------------------------------------------- the random state of the GPUs


def test_on_the_same_gpus_every_gpus_state_comes_back(monkeypatch, tmp_path) -> None:
    state = saved_on(monkeypatch, 4, 2, tmp_path)
    assert state["cuda_device"] == 2 and len(state["cuda"]) == 4
    gpus = FakeGpus(monkeypatch, 4, current=2)
    ckpt.set_rng_state(state)
    assert gpus.tags() == [10, 11, 12, 13]


@pytest.mark.parametrize(
    ("saved", "resumed", "own_tag"),
    [
        ((4, 0), (1, 0), 10),  # CUDA_VISIBLE_DEVICES=0 on resume
        ((4, 2), (1, 0), 12),  # rank 2 of 4 GPUs, requeued alone on a node's one GPU
        ((2, 1), (4, 3), 11),  # rank 1 of 2 GPUs, now local rank 3 of 4
    ],
    ids=["fewer-gpus", "rank-moved-to-a-smaller-node", "rank-moved-to-a-larger-node"],
)
def test_a_process_resumes_its_own_gpus_state_on_fewer_or_other_gpus(
    monkeypatch, tmp_path, caplog, saved: tuple, resumed: tuple, own_tag: int
) -> None:
    state = saved_on(monkeypatch, *saved, tmp_path)
    gpus = FakeGpus(monkeypatch, *resumed)
    with caplog.at_level(logging.INFO, logger="nmt.store.checkpoint"):
        ckpt.set_rng_state(state)
    assert gpus.tags()[resumed[1]] == own_tag
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"{saved[0]} GPU(s), {resumed[0]} are visible now" in caplog.text


def test_a_checkpoint_of_a_list_of_states_still_loads(monkeypatch, tmp_path, caplog) -> None:
    """Checkpoints written before the saving GPU was recorded: the GPU of the same index."""
    state = saved_on(monkeypatch, 4, 0, tmp_path)
    del state["cuda_device"]
    gpus = FakeGpus(monkeypatch, 2, current=1)
    ckpt.set_rng_state(state)
    assert gpus.tags() == [10, 11]

    one = saved_on(monkeypatch, 1, 0, tmp_path)
    del one["cuda_device"]
    gpus = FakeGpus(monkeypatch, 4, current=3)
    with caplog.at_level(logging.WARNING, logger="nmt.store.checkpoint"):
        ckpt.set_rng_state(one)
    assert gpus.tags() == [10, 1, 2, 3]  # cuda:3 keeps its own state, and says so
    assert "none for cuda:3" in caplog.text


def test_the_device_a_process_names_is_the_one_recorded_and_restored(monkeypatch) -> None:
    gpus = FakeGpus(monkeypatch, 2, current=0)
    gpus.states = [gpus.state(10), gpus.state(11)]
    state = ckpt.rng_state(torch.device("cuda", 1))
    assert state["cuda_device"] == 1
    gpus = FakeGpus(monkeypatch, 1, current=0)
    ckpt.set_rng_state(state, torch.device("cuda", 0))
    assert gpus.tags() == [11]


def test_without_cuda_the_random_state_has_no_cuda_part(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert set(ckpt.rng_state()) == {"python", "numpy", "torch"}


# ------------------------------------------------------------------ precision=auto on a GPU


@pytest.fixture
def gpu_of(monkeypatch: pytest.MonkeyPatch):
    """Make torch.cuda report one GPU of a given compute capability; bf16 'supported' as torch
    says by default, i.e. emulated below 8.0 too."""

    def fake(capability: tuple[int, int]) -> None:
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True: including_emulation or capability[0] >= 8,
        )

    return fake


def no_probe() -> SpeedProbe:
    def measure() -> Any:
        raise AssertionError("a GPU is never probed")

    return SpeedProbe(measure, {})


@pytest.mark.parametrize(
    ("gpu", "capability", "expected"),
    [
        ("P100", (6, 0), "16"),
        ("V100", (7, 0), "16"),
        ("T4", (7, 5), "16"),
        ("A100", (8, 0), "bf16"),
        ("RTX 3090", (8, 6), "bf16"),
        ("H100", (9, 0), "bf16"),
    ],
)
def test_auto_is_bf16_only_on_a_gpu_that_computes_it_natively(
    gpu_of, gpu: str, capability: tuple[int, int], expected: str
) -> None:
    gpu_of(capability)
    assert native_bf16(CUDA) is (expected == "bf16")
    assert resolve_precision("auto", CUDA, no_probe()) == expected
    assert resolve_precision("auto", CUDA) == expected  # decoding
    cfg = compose_config("train", ["trainer.precision=auto"])
    trained_in = training_precision(cfg, CUDA, DistInfo(), None, no_probe)
    assert trained_in == expected
    scaler = build_scaler(trained_in, CUDA)  # fp16 trains with loss scaling
    assert (scaler is not None) is (expected == "16")


def test_validation_decodes_in_the_precision_nmt_eval_decodes_in(gpu_of) -> None:
    """On a GPU with bf16 and a run trained in bf16: validation BLEU is nmt-eval's BLEU."""
    gpu_of((8, 0))
    run = compose_config("train", ["trainer.precision=bf16"])
    validation = validation_options(run).precision
    evaluation = DecodeOptions.from_config(compose_config("eval")).precision
    assert resolve_precision(validation, CUDA) == resolve_precision(evaluation, CUDA)


# -------------------------------------------------------------------------------------- TF32


@pytest.fixture
def tf32_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start from TF32 off; the flags are put back after the test."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_tf32_is_set_for_a_gpu_and_left_alone_on_a_cpu(monkeypatch, tf32_off) -> None:
    assert setup_device("cpu", True) == torch.device("cpu")
    assert tf32_flags() == (False, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert setup_device("auto", True) == CUDA
    assert tf32_flags() == (True, True)
    assert setup_device("cuda:1", False) == torch.device("cuda", 1)
    assert tf32_flags() == (False, False)


class Picked(Exception):
    """Raised by the spy where a command picks its device."""


OPTIONS = ["device=cuda:1", "tf32=false"]


@pytest.mark.parametrize(
    ("module", "run"),
    [
        (scoring, lambda: scoring.evaluate(compose_config("eval", OPTIONS))),
        (
            translate_command,
            lambda: translate_command.translate(compose_config("translate", OPTIONS)),
        ),
        (
            plot_attention,
            lambda: plot_attention.plot_attention(
                compose_config("attention", [*OPTIONS, "sentence=Ein Hund.", "ckpt=unread.pt"])
            ),
        ),
        (device_module, lambda: backend.torch_backend(compose_config("serve", OPTIONS))),
        (tune_decode, lambda: tune_decode.tune("run", None, [1], [1.0], "cuda:1", tf32=False)),
    ],
    ids=["eval", "translate", "attention", "serve", "tune-decode"],
)
def test_the_decoding_commands_set_tf32_where_they_pick_their_device(
    monkeypatch, module: Any, run: Any
) -> None:
    seen: list[tuple[str, bool]] = []

    def spy(name: str, tf32: bool) -> torch.device:
        seen.append((name, tf32))
        raise Picked

    monkeypatch.setattr(module, "setup_device", spy)
    with pytest.raises(Picked):
        run()
    assert seen == [("cuda:1", False)]
    assert tune_decode.make_parser().parse_args(["--no-tf32"]).tf32 is False


def test_training_has_a_tf32_switch() -> None:
    assert compose_config("train").trainer.tf32 is True
    assert compose_config("train", ["trainer.tf32=false"]).trainer.tf32 is False


@pytest.mark.parametrize("tf32", [True, False])
def test_training_makes_its_gpu_current_with_tf32_as_configured(
    monkeypatch, tf32_off, tf32: bool
) -> None:
    """A run on cuda:1 draws from (and checkpoints the random state of) cuda:1, not cuda:0."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    t = compose_config("train", ["trainer.device=cuda:1", f"trainer.tf32={tf32}"]).trainer
    device = training_device(t, DistInfo())
    assert device == torch.device("cuda", 1) and current == [device]
    assert tf32_flags() == (tf32, tf32)


# ------------------------------------------------------------------ the GPU of each DDP rank


@pytest.mark.parametrize(
    ("local_world", "gpus", "want"),
    [
        (2, 2, [(0, "nccl"), (1, "nccl")]),  # one GPU per rank
        (2, 1, [(0, "gloo"), (0, "gloo")]),  # two ranks check DDP on one GPU
        (4, 2, [(0, "gloo"), (1, "gloo"), (0, "gloo"), (1, "gloo")]),
        (1, 8, [(0, "nccl")]),
    ],
)
def test_ranks_take_a_gpu_each_or_share_them_over_gloo(local_world, gpus, want) -> None:
    assert [rank_gpu(r, local_world, gpus) for r in range(local_world)] == want


@pytest.mark.parametrize(
    ("launcher", "gpus", "want"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, 1, (0, "gloo")),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, 2, (1, "nccl")),
        # two machines of two GPUs: torchrun's LOCAL_WORLD_SIZE says each GPU has one rank
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 2,
         (1, "nccl")),
    ],
)  # fmt: skip
def test_a_rank_trains_on_its_own_gpu_or_shares_one(
    monkeypatch, tf32_off, launcher, gpus, want
) -> None:
    """The process group's backend and the rank's current GPU, and the device training then
    takes: the same one."""
    import torch.distributed as dist

    FakeGpus(monkeypatch, gpus)
    current, joined = [], []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.append(backend))
    info = init_distributed("auto", launcher)
    assert (current, joined) == ([want[0]], [want[1]])
    t = compose_config("train", ["trainer.device=auto"]).trainer
    assert training_device(t, info) == torch.device("cuda", want[0])


def test_a_slurm_task_says_how_many_ranks_share_its_machine(monkeypatch) -> None:
    import submitit

    job = SimpleNamespace(num_tasks=8, num_nodes=2, global_rank=5, local_rank=1,
                          hostnames=["gpu07", "gpu08"])  # fmt: skip
    monkeypatch.setattr(submitit, "JobEnvironment", lambda: job)
    env = slurm_dist_env({"SUBMITIT_EXECUTOR": "slurm"})
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"]) == ("1", "4", "8")


# ---------------------------------------------------------------------------- the torch floor


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("2.13.0+cpu", (2, 13, 0)),
        ("2.6.0a0+git1a2b3c4", (2, 6, 0)),
        ("2.4.0.dev20240601+cu121", (2, 4, 0)),
        ("2.3.1", (2, 3, 1)),
    ],
)
def test_torch_versions_with_dev_and_local_parts_parse(
    monkeypatch, version: str, release: tuple[int, ...]
) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    assert nmt.release(torch.__version__) == release
    if release >= nmt.TORCH_FLOOR:
        nmt.check_torch_version(torch.__version__)
    else:
        with pytest.raises(ImportError, match=re.escape("pip install 'torch>=2.4'")):
            nmt.check_torch_version(torch.__version__)


def test_the_installed_torch_passes_and_pyproject_declares_the_same_floor() -> None:
    nmt.check_torch_version(torch.__version__)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    floor = re.search(r'"torch>=([\d.]+),', pyproject)
    assert floor is not None and nmt.release(floor.group(1)) == nmt.TORCH_FLOOR


def test_importing_nmt_with_an_old_torch_says_which_and_how_to_install() -> None:
    code = (
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda name: '2.3.1' if name == 'torch' else real(name)\n"
        "import nmt\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert message == (
        "ImportError: nmt needs PyTorch 2.4 or later, and torch 2.3.1 is installed: "
        "pip install 'torch>=2.4'"
    )
