"""The tool schemas a request carries are kept as data (`soba_nb/agent/tool_schemas.json`) so
the commands that only key counts by them import no tool and no pydantic: the file must be
exactly what the tools' argument models generate."""

from __future__ import annotations

import subprocess
import sys

import msgspec

from soba_nb.agent import tool_schemas
from soba_nb.agent.tools import TOOLS, generated_schemas
from soba_nb.agent.tools.__main__ import main


def test_the_schemas_file_is_what_the_argument_models_generate() -> None:
    generated = generated_schemas()
    assert generated == tool_schemas.TOOL_SCHEMAS, (
        "soba_nb/agent/tool_schemas.json differs from the tools' argument models: "
        "python -m soba_nb.agent.tools --write"
    )
    # Byte for byte too (the key order of each schema is what a provider is sent).
    assert tool_schemas.SCHEMAS_FILE.read_text(encoding="utf-8") == tool_schemas.schemas_json(generated)
    assert [schema.name for schema in generated] == list(TOOLS)


def test_the_check_says_when_the_file_is_stale(tmp_path, monkeypatch, capsys) -> None:
    stale = tmp_path / "tool_schemas.json"
    schemas = [msgspec.structs.asdict(schema) for schema in tool_schemas.TOOL_SCHEMAS]
    schemas[0]["description"] = "an older description"
    stale.write_text(msgspec.json.encode(schemas).decode())
    monkeypatch.setattr(tool_schemas, "SCHEMAS_FILE", stale)
    assert main([]) == 1
    assert "differs from the tools' argument models" in capsys.readouterr().out
    assert main(["--write"]) == 0
    assert stale.read_text(encoding="utf-8") == tool_schemas.schemas_json(generated_schemas())
    assert main([]) == 0


def test_reading_the_schemas_imports_no_tool_and_no_pydantic() -> None:
    code = (
        "import sys; from soba_nb.agent.tool_schemas import TOOL_SCHEMAS, COMPACT_TOOL_SCHEMAS; "
        "print(sorted(m for m in sys.modules if m == 'pydantic' or m.startswith('soba_nb.agent.tools')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
