"""Shared test fixtures.

The tests that read Multi30k get it as `make train` does, through ``fetch_multi30k`` into the
repository's ``data/multi30k``: already there (and verified), copied from
``NMT_MULTI30K_MIRROR``, or downloaded once (from ``NMT_MULTI30K_URL`` or the official URL).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt.data.corpus import MULTI30K_SPLITS, DataError, clean_pairs, fetch_multi30k, read_parallel
from nmt.data.tokenizer import TokenizerPair, train_tokenizers
from nmt.environment import Multi30kSource, multi30k_source

from .helpers import compose_config, corpus_overrides, write_subset

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = REPO / "data"  # the default data.root of `make train`, which runs in the repository
TEST_LANGS = ("de", "en")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs one worker per core), each worker and the
    commands it starts get their share of the cores, so that the workers do not fight over
    them: PyTorch's threads here, ``OMP_NUM_THREADS`` for child processes."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return
    share = max(1, (os.cpu_count() or 1) // int(worker["workercount"]))
    torch.set_num_threads(share)
    os.environ.setdefault("OMP_NUM_THREADS", str(share))


def slow_seconds(item: pytest.Item) -> float:
    """The seconds a test marked ``slow(seconds=N)`` takes on one core (0 for the others)."""
    marker = item.get_closest_marker("slow")
    return float(marker.kwargs.get("seconds", 0)) if marker is not None else 0.0


# session fixtures that take seconds to make: their tests run on one worker (real_corpus with
# joint_tok, which test_prepare.py and test_prepare_cache.py share; the package nmt-serve serves)
SHARED = ("trained_runs", "serve_package", "real_corpus", "multilingual_runs")


def shared_fixtures(items: list[pytest.Item]) -> dict[str, str]:
    """Each costly session fixture (SHARED) mapped to the one that stands for it: fixtures
    that some test uses together are one (a test of both needs both on its worker)."""
    lead = {name: name for name in SHARED}

    def find(name: str) -> str:
        while lead[name] != name:
            name = lead[name]
        return name

    for item in items:
        used = [find(name) for name in SHARED if name in getattr(item, "fixturenames", ())]
        for name in used[1:]:
            lead[name] = used[0]
    return {name: find(name) for name in SHARED}


def worker_groups(items: list[pytest.Item], workers: int) -> dict[str, str]:
    """Which worker group each test joins (by node id) under ``--dist loadgroup``.

    The tests marked ``slow(seconds=N)`` are dealt into one group per worker, the longest first,
    each to the group with the fewest seconds so far, so that the groups take about as long as
    each other. The tests of a costly session fixture (SHARED) go together, so that one worker
    makes it and the other never waits for it (with those of any fixture that a test uses
    beside it): where some of them are slow, all of them are dealt as one, with their summed
    seconds. Every other test goes with the tests of its
    module, so that a module-scoped fixture is made once."""
    leads = shared_fixtures(items)

    def shared_fixture(item: pytest.Item) -> str | None:
        names = [leads[name] for name in SHARED if name in getattr(item, "fixturenames", ())]
        return names[0] if names else None

    clusters: dict[str, float] = {}  # a SHARED fixture's slow tests, or one slow test
    for item in items:
        seconds = slow_seconds(item)
        if seconds > 0:
            key = shared_fixture(item) or item.nodeid
            clusters[key] = clusters.get(key, 0.0) + seconds
    load = [0.0] * workers
    dealt = {}
    for key, seconds in sorted(clusters.items(), key=lambda kv: -kv[1]):
        least = load.index(min(load))
        load[least] += seconds
        dealt[key] = f"slow-{least}"
    groups = {}
    for item in items:
        shared = shared_fixture(item)
        if slow_seconds(item) > 0:
            groups[item.nodeid] = dealt[shared or item.nodeid]
        elif shared:
            groups[item.nodeid] = dealt.get(shared, shared)
        else:
            groups[item.nodeid] = item.nodeid.split("::")[0]
    return groups


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first, the rest in their usual order; in a worker of ``make test``
    (``--dist loadgroup``), each test in its group (:func:`worker_groups`), so that the slow
    groups start side by side, one per worker, and the modules fill in around them."""
    items.sort(key=lambda item: -slow_seconds(item))
    worker = getattr(config, "workerinput", None)
    # a worker sees its own dist as "no" (pytest-xdist rewrites it) and loadgroup as a flag
    if worker is None or not getattr(config.option, "loadgroup", False):
        return
    groups = worker_groups(items, int(worker["workercount"]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))


@pytest.fixture(scope="session")
def multi30k() -> Path:
    """The directory of verified Multi30k de/en files of every split (``data/multi30k``).

    Without a copy, a mirror or the network, the session stops here with the message that
    `make train` gives, instead of one error per test that needs the corpus.
    """
    try:
        return fetch_multi30k(DATA_ROOT, TEST_LANGS, MULTI30K_SPLITS, multi30k_source())
    except DataError as err:
        pytest.exit(f"Multi30k is needed by the tests and could not be fetched: {err}", 1)


@pytest.fixture(scope="session")
def multi30k_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  multi30k: Path) -> Path:  # fmt: skip
    """A data root with de/en Multi30k (every split) copied in through the mirror
    (``NMT_MULTI30K_MIRROR``), as a first `make train` fills its ``data.root``.

    One for the whole run, the workers of ``make test`` included (beside their own temporary
    directories): the default data config prepared there (tests/test_data.py, the quality
    run) is prepared once, by whichever test comes first, the others wait for it (the
    preparation's own lock) and read it. Tests only read what is in it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if hasattr(request.config, "workerinput") else base
    path = shared / "multi30k_root"
    with open(shared / "multi30k_root.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fetch_multi30k(path, TEST_LANGS, MULTI30K_SPLITS, Multi30kSource(mirror=multi30k))
    return path


@pytest.fixture(scope="session")
def corpus(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 real Multi30k training pairs as plain files; returns their prefix."""
    return write_subset(multi30k, tmp_path_factory.mktemp("corpus"), "train", 120)


# lines that the cleaning and the length filter drop (max_len 100, max_len_ratio 3)
ODD_PAIRS = [
    ("", "An empty source."),
    ("Ein leeres Ziel.", "   \t"),
    (" ".join(["Hund"] * 150), " ".join(["dog"] * 150)),
    ("Ja.", "Yes, and then a great many more words than the short source could ever justify."),
]


@pytest.fixture(scope="session")
def real_corpus(multi30k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 real Multi30k training pairs plus a few that cleaning or filtering drops
    (ODD_PAIRS) as plain files; returns their prefix."""
    prefix = write_subset(multi30k, tmp_path_factory.mktemp("real"), "train", 3000)
    for lang, k in (("de", 0), ("en", 1)):
        with open(f"{prefix}.{lang}", "a", encoding="utf-8") as f:
            f.write("".join(pair[k] + "\n" for pair in ODD_PAIRS))
    return prefix


@pytest.fixture(scope="session")
def joint_tok(real_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> TokenizerPair:
    """A joint 600-piece tokenizer trained on ``real_corpus``."""
    src, tgt, _ = clean_pairs(*read_parallel(f"{real_corpus}.de", f"{real_corpus}.en"))
    return train_tokenizers(src, tgt, tmp_path_factory.mktemp("spm"), joint=True, vocab_size=600)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: one thread is fastest, and does not fight other processes for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def threads_restored() -> Iterator[None]:
    """In-process training sets torch's thread count (trainer.threads): put it back after."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# Two tiny models trained for a few seconds on `corpus`, validated (and their attention drawn)
# twice: the runs that the attention explorer and TensorBoard tests read.
TRAINED_STEPS = 60
TRAINED_MODELS = {
    "transformer": [
        "model=transformer",
        "model.d_model=32",
        "model.heads=2",
        "model.d_ff=64",
        "model.enc_layers=2",
        "model.dec_layers=2",
        "optim.lr=5e-3",
        "optim.warmup_steps=20",
    ],
    "gru_bahdanau": [
        "model=gru_bahdanau",
        "model.emb_dim=32",
        "model.hidden_dim=48",
        "model.attn_dim=32",
        "optim=adam_constant",
        "optim.lr=1e-2",
        "optim.warmup_steps=10",
    ],
}


@pytest.fixture(scope="session")
def trained_runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run directories of a tiny Transformer and a tiny GRU, by arch (``<root>/runs/<arch>``).

    Each ran TRAINED_STEPS updates on the 120 pairs of ``corpus`` (validating on 20 of them at
    the half and at the end), logged one validation sentence's cross-attention images to
    TensorBoard (drawing them is most of the time these runs take) and wrote its explorer page
    (trainer.attention_html).
    """
    from nmt.train.command import train

    root = tmp_path_factory.mktemp("trained")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest on a busy machine
    runs = {}
    try:
        for arch, model in TRAINED_MODELS.items():
            overrides = [
                *corpus_overrides(corpus, root),
                "data.max_tokens=600",
                f"outputs={root / 'outputs'}",
                "trainer.device=cpu",
                "trainer.precision=32",
                f"trainer.max_steps={TRAINED_STEPS}",
                f"trainer.val_every={TRAINED_STEPS // 2}",
                "trainer.val_sentences=20",
                "trainer.attention_sentences=1",
                "trainer.attention_layers=none",
                "trainer.attention_html=true",
                "trainer.label_smoothing=0.0",
                "trainer.progress=false",
                "model.dropout=0.0",
                *model,
            ]
            runs[arch] = root / "runs" / arch
            train(compose_config("train", overrides), runs[arch])
    finally:
        torch.set_num_threads(threads)
    return runs


@pytest.fixture(scope="session")
def serve_package(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package of a briefly trained tiny Transformer, with its CTranslate2 model: what the
    tests of nmt-serve serve (made once, by the worker that runs them all)."""
    from nmt.ship.export import export_package
    from nmt.train.command import train

    from .helpers import tiny_run_overrides

    root = tmp_path_factory.mktemp("serve")
    overrides = tiny_run_overrides(
        corpus, root, "trainer.max_steps=6", "trainer.val_every=6", "trainer.device=cpu"
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(compose_config("train", overrides), root / "run")
    finally:
        torch.set_num_threads(threads)
    return export_package(root / "run" / "checkpoints" / "best.pt", root / "pkg", fmt="ctranslate2")


# -- a real browser (tests marked `browser`) ---------------------------------------------------

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_HELP = (
    "the tests marked 'browser' drive a headless Chromium: install it (Debian/Ubuntu: "
    "`apt-get install chromium`; .ci/run does), or point NMT_CHROMIUM at a Chromium/Chrome "
    "executable; to run the other tests only: pytest -m 'not browser'"
)


def chromium_executable() -> str:
    """The system Chromium: $NMT_CHROMIUM, else the first of CHROMIUM_NAMES on PATH."""
    given = os.environ.get("NMT_CHROMIUM")
    if given:
        if not Path(given).is_file():
            pytest.fail(f"NMT_CHROMIUM={given} is not a file; {CHROMIUM_HELP}", pytrace=False)
        return given
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"no Chromium found on PATH ({', '.join(CHROMIUM_NAMES)}); {CHROMIUM_HELP}", False)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by Playwright (never Playwright's own browser downloads).

    One per test module: Playwright's sync API keeps an asyncio event loop running in the
    main thread while it is open, and tests that run their own loop (nmt-serve's) must not
    meet it."""
    executable = chromium_executable()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install -e '.[dev]' (or make install)", False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def threeway(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 four-way lines of Multi30k's train split in German, English and French (a prefix)."""
    root = tmp_path_factory.mktemp("m30k3")
    m30k = fetch_multi30k(root / "data", ("de", "en", "fr"), ["train"], multi30k_source())
    return write_subset(m30k, root / "corpus", "train", 60, langs=("de", "en", "fr"))


@pytest.fixture(scope="session")
def threeway_test(threeway: Path) -> Path:
    """The first 20 lines of ``threeway`` (a prefix): the test split of ``multilingual_runs``."""
    prefix = threeway.parent / "test0_20"
    for lang in ("de", "en", "fr"):
        lines = Path(f"{threeway}.{lang}").read_text(encoding="utf-8").splitlines()[:20]
        Path(f"{prefix}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return prefix


@pytest.fixture(scope="session")
def shared_tmp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary folder of the whole run, the workers of ``make test`` included (beside their
    own temporary folders): where ``helpers.made_once`` makes what one worker makes for all."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@pytest.fixture(scope="session")
def multilingual_runs(threeway: Path, threeway_test: Path, shared_tmp: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:  # fmt: skip
    """A getter: placement (source | target) -> the run directory of a tiny Transformer trained
    by nmt-train (its function, in this process) for 12 steps on the MULTI_DIRECTIONS of
    ``threeway``, tested on ``threeway_test`` (made on first use). Its validations draw one
    sentence's cross-attention in each direction.

    Each placement is trained once for the whole run (``made_once``), and each worker gets its
    own copy of the run directory, so that what a test writes into a run (its eval folder)
    meets no other worker's."""
    from nmt.train.command import train

    from .helpers import MULTI_DIRECTIONS, TINY_TRANSFORMER, made_once

    runs: dict[str, Path] = {}

    def make(placement: str, folder: Path) -> None:
        overrides = [
            "data=parallel", f"data.directions=[{','.join(MULTI_DIRECTIONS)}]",
            f"data.train={threeway}", f"data.valid={threeway}", f"data.test=[{threeway_test}]",
            f"data.root={folder / 'data'}", "data.vocab_size=700", "data.max_tokens=800",
            f"data.tag_placement={placement}", "data.sampling_temperature=5",
            f"outputs={folder / 'outputs'}",
            "trainer.max_steps=12", "trainer.val_every=6", "trainer.log_every=6",
            "trainer.val_sentences=8", "trainer.progress=false", "trainer.attention_sentences=1",
            "trainer.attention_layers=none", "trainer.attention_html=true",
            "trainer.precision=32", "trainer.threads=1",
            "optim.lr=1e-2", "optim.warmup_steps=6", "model.dropout=0.0",
            *TINY_TRANSFORMER,
        ]  # fmt: skip
        threads = torch.get_num_threads()
        try:
            train(compose_config("train", overrides), folder / "run")
        finally:
            torch.set_num_threads(threads)

    def get(placement: str) -> Path:
        if placement not in runs:
            made = made_once(shared_tmp, f"multilingual-{placement}",
                             lambda folder: make(placement, folder))  # fmt: skip
            runs[placement] = tmp_path_factory.mktemp(f"multi-{placement}") / "run"
            shutil.copytree(made / "run", runs[placement])
        return runs[placement]

    yield get
