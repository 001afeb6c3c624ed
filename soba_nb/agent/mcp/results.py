"""What soba makes of an MCP server's words: a tool's schema as the model is sent it, and a
call's result as a tool outcome. Both are data from outside (SPEC §12): a description is
clipped, its control characters escaped, and marked as the server's; a result is text
(an image or audio named, never fetched), clipped like any output."""

from __future__ import annotations

import json
from typing import Any

from soba_nb.agent.tools.base import ToolOutcome
from soba_nb.messages import ToolSchema
from soba_nb.printable import printable
from soba_nb.text import clip, clip_middle

MAX_DESCRIPTION_CHARS = 1_000
"""A tool's description as sent: a server's long manual would cost every request."""
MAX_SCHEMA_CHARS = 8_000
"""A parameter schema larger than this (as JSON) is sent as a bare object, said in the description."""
MAX_RESULT_CHARS = 100_000
"""A result kept whole up to this; beyond it its middle is clipped before it is recorded (model
input clips it further, as it does every tool's output: SPEC §15)."""
EMPTY_SCHEMA: dict[str, object] = {"type": "object", "properties": {}}


def tool_schema(offered: str, server: str, description: str | None, schema: Any) -> ToolSchema:
    """The schema the model is sent for a server's tool, offered as `offered`."""
    told = printable(clip(" ".join((description or "").split()), MAX_DESCRIPTION_CHARS))
    parameters: dict[str, object] = dict(schema) if isinstance(schema, dict) else dict(EMPTY_SCHEMA)
    try:
        too_large = len(json.dumps(parameters)) > MAX_SCHEMA_CHARS
    except (TypeError, ValueError, RecursionError):
        too_large = True
    if too_large:
        parameters = dict(EMPTY_SCHEMA)
        told += " (its parameter schema was too large to send: pass the arguments it documents)"
    parameters = _without_titles(parameters)
    parameters.setdefault("type", "object")
    return ToolSchema(name=offered, description=f"[MCP server '{server}'] {told}".strip(), parameters=parameters)


def _without_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without the generated `title`s (pydantic's "Repo Path" beside `repo_path`:
    tokens in every request that tell the model nothing), as soba's own schemas are sent. A
    property named `title` stays: only schema keywords are dropped."""
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            value = {name: _without_titles(sub) if isinstance(sub, dict) else sub for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            value = _without_titles(value)
        elif key in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
            value = [_without_titles(sub) if isinstance(sub, dict) else sub for sub in value]
        cleaned[key] = value
    return cleaned


def outcome_of(result: Any) -> ToolOutcome:
    """A `CallToolResult` as soba's outcome: its text parts joined, the rest named."""
    parts = [_part(item) for item in getattr(result, "content", None) or ()]
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    text = "\n".join(part for part in parts if part) or "(the tool returned nothing)"
    return ToolOutcome(clip_middle(text, MAX_RESULT_CHARS), is_error=bool(getattr(result, "is_error", False)))


def _part(item: Any) -> str:
    kind = getattr(item, "type", "")
    if kind == "text":
        return str(getattr(item, "text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {printable(str(getattr(item, 'mime_type', '') or 'unknown type'))}, not shown]"
    if kind == "resource":
        resource = getattr(item, "resource", None)
        text = getattr(resource, "text", None)
        uri = printable(str(getattr(resource, "uri", "")))
        return f"[resource {uri}]\n{text}" if isinstance(text, str) else f"[resource {uri}: binary, not shown]"
    if kind == "resource_link":
        return f"[resource link: {printable(str(getattr(item, 'uri', '')))}]"
    return f"[{printable(str(kind)) or 'content'} part, not shown]"
