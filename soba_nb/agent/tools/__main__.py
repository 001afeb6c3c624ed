"""`python -m soba_nb.agent.tools [--write]`: whether `soba_nb/agent/tool_schemas.json` is what
the tools' argument models generate (exit 1 when not); `--write` writes it from them."""

from __future__ import annotations

import sys

from soba_nb.agent import tool_schemas
from soba_nb.agent.tools import generated_schemas


def main(argv: list[str]) -> int:
    text = tool_schemas.schemas_json(generated_schemas())
    target = tool_schemas.SCHEMAS_FILE
    if argv == ["--write"]:
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
        return 0
    same = target.read_text(encoding="utf-8") == text
    print(f"{target}: {'matches' if same else 'differs from'} the tools' argument models")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
