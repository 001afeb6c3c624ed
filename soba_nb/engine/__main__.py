"""`python -m soba_nb.engine --model PATH`: load the model and serve it on 127.0.0.1.

Started and stopped by the notebook kernel (`soba_nb.providers.local_process`). It prints,
one per line on stdout: `loading NN%` while the weights load, then `ready URL` once it
serves; anything else it has to say goes to stderr, which the kernel keeps in a log file
and never shows. It dies with the process that started it (Linux: `PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
CONTROL_TOKEN_TYPE = 3
"""`tokenizer.ggml.token_type` of control tokens (`<|im_end|>` …)."""


def _die_with_parent(parent: int) -> None:
    """SIGTERM when the kernel dies, so no orphaned model keeps its memory."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the kernel's atexit stops us instead
        return
    if os.getppid() != parent:  # the parent died before the prctl
        sys.exit(1)


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
