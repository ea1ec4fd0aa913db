"""The one way a command ends on an error the user can fix: a one-line message, exit status 2."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.cli import UserError, config_dir, exit_on_error, setup_logging
from nmt.config import ConfigError
from nmt.data.cache import CacheError
from nmt.data.corpus import DataError
from nmt.environment import CONFIG_DIR, VARIABLES, launcher_variables
from nmt.runtime.distributed import DistInfo, init_distributed
from nmt.store.gate import CheckpointError

from .helpers import REPO

log = logging.getLogger("nmt.test_cli")


@pytest.mark.parametrize("error", [ConfigError, DataError, CacheError, CheckpointError])
def test_a_user_error_is_one_logged_line_and_exit_status_2(error, caplog) -> None:
    with pytest.raises(SystemExit) as stop, exit_on_error(log):
        raise error("data.max_len=0 must be > 0")
    assert stop.value.code == 2
    assert stop.value.__context__ is None or stop.value.__suppress_context__  # no traceback
    assert [r.getMessage() for r in caplog.records] == ["data.max_len=0 must be > 0"]
    assert caplog.records[0].levelno == logging.ERROR


def test_other_errors_pass_unless_named(caplog) -> None:
    with pytest.raises(ZeroDivisionError), exit_on_error(log):
        _ = 1 / 0
    with pytest.raises(SystemExit) as stop, exit_on_error(log, OSError):
        raise OSError(98, "Address already in use")
    assert stop.value.code == 2 and "Address already in use" in caplog.text
    with exit_on_error(log):
        pass  # nothing raised: nothing logged, no exit
    assert len(caplog.records) == 1


def test_the_error_classes_keep_their_builtin_bases() -> None:
    assert issubclass(ConfigError, UserError) and issubclass(ConfigError, ValueError)
    assert issubclass(CheckpointError, UserError) and issubclass(CheckpointError, RuntimeError)
    assert issubclass(DataError, UserError)


def test_no_entry_point_has_its_own_exit_status_2() -> None:
    """Every command goes through exit_on_error; none repeats the except clause."""
    own = re.compile(r"SystemExit\(2\)|exit\(2\)|return 2$", re.MULTILINE)
    sources = [p for p in (REPO / "nmt").rglob("*.py") if p.name != "cli.py"]
    assert [str(p) for p in sources if own.search(p.read_text(encoding="utf-8"))] == []
    scripts = (REPO / "pyproject.toml").read_text(encoding="utf-8").split("[project.scripts]")[1]
    entry = re.findall(r'^nmt-[a-z-]+ = "(nmt[a-z_.]*):main"$', scripts.split("\n[")[0], re.M)
    assert len(entry) >= 9, entry
    for module in entry:
        path = REPO / (module.replace(".", "/") + ".py")
        assert "exit_on_error(" in path.read_text(encoding="utf-8"), module


def test_the_cli_module_needs_no_pytorch() -> None:
    probe = "import sys, nmt.cli, nmt.store.gate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


# the commands that only decode, and what nmt-serve's decoding process loads
DECODING_MODULES = (
    "nmt.evaluate.scoring", "nmt.decode.translate", "nmt.evaluate.tune_decode",
    "nmt.ship.export", "nmt.store.average", "nmt.serve.main", "nmt.decode.engines",
    "nmt.store.loading",
)  # fmt: skip


def test_the_decoding_commands_load_neither_the_compiler_nor_matplotlib() -> None:
    """Only training compiles and draws: a command that decodes starts without importing
    torch._dynamo or matplotlib (seconds of every start), and nmt-train imports matplotlib
    only to draw."""
    loaded = "print(sorted(m for m in ('torch._dynamo', 'matplotlib') if m in sys.modules))"
    decoding = f"import sys, {', '.join(DECODING_MODULES)}; {loaded}"
    probe = f"{decoding}; import nmt.train.command; {loaded}"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    after_decoding, after_training = out.stdout.splitlines()
    assert after_decoding == "[]" and "matplotlib" not in after_training, out.stdout


def test_a_bad_option_ends_nmt_prepare_with_status_2(tmp_path: Path) -> None:
    """Through a real entry point: a compose-time error (a misspelt choice) names the key."""
    cmd = [
        sys.executable,
        "-m",
        "nmt.data.prepare",
        "optim.schedule=cosin",
        f"data.root={tmp_path}",
    ]
    bad = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "optim.schedule" in bad.stderr and "Traceback" not in bad.stderr
    assert not any(tmp_path.iterdir())


def test_the_readme_lists_every_environment_variable() -> None:
    """The README's table has a row for each entry of nmt.environment.VARIABLES."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("### Environment variables")[1].split("\n## ")[0]
    for names in VARIABLES:
        for name in names.split(","):
            assert f"`{name.strip()}`" in table, name


def test_the_config_directory_comes_from_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CONFIG_DIR, str(tmp_path))
    assert config_dir() == str(tmp_path.resolve())
    monkeypatch.delenv(CONFIG_DIR)
    monkeypatch.chdir(tmp_path)
    assert config_dir() != str(tmp_path.resolve())  # no configs/train.yaml here: the package's


def test_launcher_variables_reach_the_process_group_setup_as_values(monkeypatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launcher_variables() == {"WORLD_SIZE": "1"}
    assert init_distributed("cpu", {"WORLD_SIZE": "1"}) == DistInfo()


def test_the_console_log_follows_stderr_when_it_is_replaced(monkeypatch) -> None:
    """A notebook or a test harness may swap sys.stderr, and close the old one, after a
    command has set logging up in-process: records go to the current stderr, none is lost."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    for h in before:
        root.removeHandler(h)
    first, second = io.StringIO(), io.StringIO()
    try:
        monkeypatch.setattr(sys, "stderr", first)
        setup_logging()
        logging.getLogger("nmt.test").info("into the first")
        assert "into the first" in first.getvalue()
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("nmt.test").info("into the second")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in before:
            root.addHandler(h)
        root.setLevel(level)
    assert "into the second" in second.getvalue()
    assert "Logging error" not in second.getvalue()
