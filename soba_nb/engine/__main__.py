"""`python -m soba_nb.engine --model PATH`: load the model and serve it on 127.0.0.1.

Started and stopped by the notebook kernel (`soba_nb.providers.local_process`). It prints,
one per line on stdout: `loading NN%` while the weights load, then `ready URL` once it
serves; anything else it has to say goes to stderr, which the kernel keeps in a log file
and never shows. It exits within a second of the process that started it (`--parent`):
a watcher thread sees its parent change. (`PR_SET_PDEATHSIG` would fire when the *thread*
that started it ends — the kernel starts it from a short-lived thread to warm it up.)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

CONTROL_TOKEN_TYPE = 3
"""`tokenizer.ggml.token_type` of control tokens (`<|im_end|>` …)."""
PARENT_CHECK_S = 1.0


def _die_with_parent(parent: int) -> None:
    """Exit when the kernel is gone, so no orphaned model keeps its memory."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="soba-engine-parent").start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soba_nb.engine")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0, help="die with this process")
    args = parser.parse_args(argv)
    if args.parent:
        _die_with_parent(args.parent)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    from soba_nb.engine.chat import TEMPLATE_KEY, ChatTemplate
    from soba_nb.engine.gguf_file import read_gguf
    from soba_nb.engine.llama import LlamaModel
    from soba_nb.engine.server import Engine, EngineServer
    from soba_nb.engine.tokenizer import GGUFTokenizer

    gguf = read_gguf(args.model)
    tokenizer = GGUFTokenizer.from_gguf(gguf)
    template = gguf.metadata.get(TEMPLATE_KEY)
    if not isinstance(template, str):
        print(f"{args.model}: no chat template ({TEMPLATE_KEY})", file=sys.stderr)
        return 2
    bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    chat = ChatTemplate(template, bos=bos, eos=tokenizer.token_text(tokenizer.eos_id))
    shown = [-1]

    def progress(share: float) -> None:
        percent = int(share * 100)
        if percent // 10 != shown[0] // 10:
            shown[0] = percent
            print(f"loading {percent}%", flush=True)

    model = LlamaModel(gguf, on_progress=progress)
    types = gguf.metadata.get("tokenizer.ggml.token_type") or []
    stops = frozenset(
        {tokenizer.eos_id} | {i for i, kind in enumerate(types) if kind == CONTROL_TOKEN_TYPE}
    )
    engine = Engine(model, tokenizer, chat, args.model.stem.split(".")[0], stops)
    server = EngineServer(engine, port=args.port)
    print(f"ready {server.url}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
