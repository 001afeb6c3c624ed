"""The tool schemas a request carries (SPEC §9), read from `tool_schemas.json` beside this file.

The schemas are generated from the tools' argument models (`soba_nb.agent.tools`, pydantic)
and kept here as data, so what only needs their content — the cost of an empty conversation
that `soba-nb budget` and `inspect` key their saved counts by — does not import the tools and
pydantic with them. tests/agent/test_tool_schemas.py fails when the file and the models
disagree; `python -m soba_nb.agent.tools --write` writes it again from the models.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec

from soba_nb.messages import ToolSchema

SCHEMAS_FILE = Path(__file__).with_name("tool_schemas.json")

TOOL_SCHEMAS: tuple[ToolSchema, ...] = msgspec.json.decode(SCHEMAS_FILE.read_bytes(), type=tuple[ToolSchema, ...])


def _compact(schema: ToolSchema) -> ToolSchema:
    parameters = copy.deepcopy(schema.parameters)
    parameters.pop("additionalProperties", None)
    properties = parameters.get("properties")
    for prop in properties.values() if isinstance(properties, dict) else ():
        if isinstance(prop, dict):
            prop.pop("description", None)
    return ToolSchema(name=schema.name, description=schema.description, parameters=parameters)


COMPACT_TOOL_SCHEMAS: tuple[ToolSchema, ...] = tuple(_compact(schema) for schema in TOOL_SCHEMAS)
"""The same tools and parameters without the parameters' descriptions (about 30% fewer
tokens): what a model with a small window is sent (`tool_schemas_for`)."""
FULL_SCHEMAS_SHARE = 0.15
"""The full schemas are sent while the system prompt and they take at most this share of the
hard limit (any window of 16k tokens and more); beyond it (the embedded model's 8k, a
2,048-token llama.cpp server) the compact ones leave room for the work and its capsule."""


def tool_schemas_for(hard_limit: int, full_fixed_tokens: int) -> tuple[ToolSchema, ...]:
    """The tool schemas a request carries, given the hard limit and what the system prompt
    with the full schemas costs."""
    return TOOL_SCHEMAS if full_fixed_tokens <= hard_limit * FULL_SCHEMAS_SHARE else COMPACT_TOOL_SCHEMAS


def schemas_json(schemas: tuple[ToolSchema, ...]) -> str:
    """`tool_schemas.json`'s text for `schemas`."""
    return json.dumps([msgspec.structs.asdict(schema) for schema in schemas], indent=2, ensure_ascii=False) + "\n"
