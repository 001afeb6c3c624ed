"""Shared fixtures for the real parts: the loopback LLM server, a notebook folder whose
`soba.json` points at it, and an IPython shell with the extension loaded."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compaction_support import good_summary
from llm_server import LLMServer, RecordedRequest, Reply, text

TEST_KEY_ENV = "SOBA_NB_TEST_API_KEY"
TEST_KEY_VALUE = "sk-test-NotebookFixtureKey0123456789"
NOTEBOOK_NAME = "analysis.ipynb"

SMALL_LIMITS: dict[str, Any] = {
    "model": {"contextWindow": 6000, "maxOutputTokens": 500},
    "compaction": {
        "minTokensForAutoCompact": 1500,
        "minReclaimableTokens": 500,
        "keepRecentTokens": 1000,
        "safetyReserveTokens": 500,
        "timeoutMs": 5000,
    },
}
"""hardLimit 5,000, softLimit 4,000: a few long turns are enough to compact."""


class ScriptedModel:
    """Routes the server's answers: inference replies from a queue, summaries separately
    (requests say which with `X-Soba-Operation`)."""

    def __init__(self, server: LLMServer):
        self.server = server
        self.inference: deque[Reply] = deque()
        self.summary: Reply = text(good_summary())
        server.default_reply = self  # type: ignore[assignment]  # the server accepts callables

    def script(self, *replies: Reply) -> None:
        self.inference.extend(replies)

    def __call__(self, request: RecordedRequest) -> Reply:
        if request.operation == "compaction":
            return self.summary
        return self.inference.popleft() if self.inference else text("ok")

    def inference_requests(self) -> list[RecordedRequest]:
        return [r for r in self.server.requests if r.operation == "inference"]


@pytest.fixture(scope="session")
def _test_run_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test run's cache folder, holding the plain tokens a machine keeps after its first
    count (`soba_nb.plain_counts`) from the start, whatever test comes first."""
    from soba_nb import plain_counts, tokens

    folder = tmp_path_factory.getbasetemp() / "soba-cache"
    folder.mkdir(mode=0o700, exist_ok=True)
    ranks = tokens._mergeable_ranks("o200k_base", tokens._packaged_bpe("o200k_base"))
    (folder / plain_counts.FILE_NAME).write_bytes(plain_counts.build(ranks))
    return folder


@pytest.fixture(autouse=True)
def _tokenizer_cache(_test_run_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer's ranks are kept in a folder of the test run, not the user's `~/.soba/`;
    each test reads the plain tokens afresh (one that replaces them is seen)."""
    from soba_nb import plain_counts, tokenizer_cache

    monkeypatch.setattr(tokenizer_cache, "CACHE_FOLDER", _test_run_cache)
    monkeypatch.setattr(plain_counts, "_COUNTERS", {})


@pytest.fixture(autouse=True)
def _no_figures_left_open() -> Iterator[None]:
    """pyplot's open figures belong to the process, not to a test's shell: one a test leaves
    open is shown again by the next test's python call (a second image where one is expected)."""
    yield
    import sys

    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


@pytest.fixture
def llm_server() -> Iterator[LLMServer]:
    with LLMServer() as server:
        yield server


@pytest.fixture
def forbid_tokenizer(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it, and from then on loading a tokenizer fails the test (what a saved state should
    have spared), the plain tokens too (`soba_nb.plain_counts`: counting at all)."""
    from soba_nb import plain_counts, tokens

    def refuse(name: str) -> None:
        raise AssertionError(f"tokenizer {name} loaded")

    def forbid() -> None:
        monkeypatch.setattr(tokens, "_ENCODINGS", {})
        monkeypatch.setattr(tokens, "get_encoding", refuse)
        monkeypatch.setattr(plain_counts, "plain_counter", refuse)

    return forbid


@pytest.fixture
def scripted(llm_server: LLMServer) -> ScriptedModel:
    return ScriptedModel(llm_server)


def write_soba_json(folder: Path, server_url: str, layer: dict[str, Any] | None = None) -> Path:
    """`soba.json` for the loopback server; `layer` replaces the small test limits."""
    layer = SMALL_LIMITS if layer is None else layer
    config = {
        "model": {
            "provider": "openai",
            "name": "gpt-4o",
            "baseUrl": server_url,
            "apiKeyEnv": TEST_KEY_ENV,
            **layer.get("model", {}),
        },
        "compaction": dict(layer.get("compaction", {})),
    }
    path = folder / "soba.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


@pytest.fixture
def nb_dir(tmp_path: Path, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A notebook folder (the working folder) with `soba.json`; no user or system config, no
    SOBA_* settings."""
    for var in list(os.environ):
        if var.startswith("SOBA_") or var in ("JPY_SESSION_NAME",):
            monkeypatch.delenv(var)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    # No admin layer either: a machine's /etc/soba/config.json must not change the tests.
    monkeypatch.setenv("SOBA_SYSTEM_CONFIG", str(tmp_path / "etc-soba-config.json"))
    monkeypatch.setenv(TEST_KEY_ENV, TEST_KEY_VALUE)
    folder = tmp_path / "project"
    folder.mkdir()
    write_soba_json(folder, llm_server.url)
    monkeypatch.chdir(folder)
    return folder


def new_shell(nb_dir: Path, *, load: bool = True) -> Any:
    """A fresh `InteractiveShell` singleton with the extension loaded (`load`), as after a
    kernel start."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    if InteractiveShell.initialized():
        forget(InteractiveShell.instance())
    InteractiveShell.clear_instance()
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    shell.user_ns["__session__"] = str(nb_dir / NOTEBOOK_NAME)
    if load:
        shell.run_line_magic("load_ext", "soba_nb")
    return shell


def shut_down(shell: Any) -> None:
    """Unload the extension (closing the session) and drop the singleton, as a kernel exit."""
    from IPython.core.interactiveshell import InteractiveShell

    shell.extension_manager.unload_extension("soba_nb")
    forget(shell)
    InteractiveShell.clear_instance()


def forget(shell: Any) -> None:
    """Take back the exit handler each shell registers: kept, it holds every shell of the run
    (1 GB at the end of the suite) and runs `reset` on each at exit, each with a full garbage
    collection of that heap (about 3 minutes after the last test). A shell here keeps its
    history in memory and no temporary files: its handler has nothing to save."""
    import atexit

    atexit.unregister(shell.atexit_operations)


@pytest.fixture
def ip(nb_dir: Path) -> Iterator[Any]:
    yield new_shell(nb_dir)
    # A test may have "restarted the kernel": shut down whichever shell is current.
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        shut_down(InteractiveShell.instance())


# -- reliability figures (docs/reliability.md; tests/reliability) ----------------------------

FIGURES: list[tuple[str, str]] = []


class Figures:
    """`figures.add("crash safety", "kills survived 200/200 · lost 0 · unopenable 0")`: printed
    as one table at the end of the run (CI too)."""

    def add(self, name: str, figure: str) -> None:
        FIGURES.append((name, figure))


@pytest.fixture
def figures() -> Iterator[Figures]:
    yield Figures()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    width = max(len(name) for name, _ in FIGURES)
    for name, figure in FIGURES:
        terminalreporter.write_line(f"{name:<{width}}  {figure}")
