"""The tokenizer loaded while the user types their first request.

Every session counts with its model's tokenizer from its first turn on (what the user typed
is counted before the request leaves), and loading it is the longest wait of a first `%soba`
in a new kernel: tiktoken's o200k_base about 0.15 s (60 MiB at its peak), the embedded
model's vocabulary about 0.2 s; a session opened cold (its transcript copied without what
soba-nb keeps beside it) waits for it before its first preflight too. `%load_ext soba_nb`
starts that load on a background thread, for the model the configuration names then, so the
first `%soba` finds it done. The configuration is read on the calling thread (a warning about
it shows in that cell, where the user just loaded the extension); a configuration that does
not load starts nothing (`%soba` says what is wrong with it). The thread holds the
interpreter for the load itself and then ends; a `%soba` that comes first counts plain text
from the encoding's plain tokens meanwhile (`soba_nb.plain_counts`) and waits for the same
load for anything else (the tokenizers are loaded once per process, under a lock), never twice.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

from soba_nb.agent.limits import session_counter
from soba_nb.config import SobaConfig, load_config
from soba_nb.notebook.location import locate

logger = logging.getLogger(__name__)

THREAD_NAME = "soba-nb tokenizer"


def start(namespace: dict[str, Any] | None) -> threading.Thread | None:
    """Start loading the tokenizer of the model the configuration names; the thread, or None
    when the configuration does not load."""
    try:
        location = locate(namespace)
        config = load_config(location.notebook.parent if location.notebook else Path.cwd())
    except Exception as exc:  # noqa: BLE001 - `%soba` reports it; loading the extension never fails for it
        logger.debug("tokenizer not loaded ahead: %s", type(exc).__name__)
        return None
    return start_for(config)


def start_for(config: SobaConfig) -> threading.Thread:
    """Start loading the tokenizer `config`'s model counts with."""
    thread = threading.Thread(target=_load, args=(session_counter(config).load,), name=THREAD_NAME, daemon=True)
    thread.start()
    return thread


def _load(load: Any) -> None:
    with contextlib.suppress(Exception):  # the first count loads it again and says what failed
        load()
