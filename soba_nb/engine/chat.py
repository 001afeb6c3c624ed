"""From a Chat Completions request to the model's prompt, and from its text back to calls.

The model has no native tool calling: the tools are described in the system message and
calls travel as ```tool blocks (`soba_nb.engine.tool_text`, the protocol's one home).
Messages arrive in the Chat Completions wire shape; they become plain role/content
messages and are rendered with the GGUF's own chat template (Jinja2, sandboxed), exactly
as llama.cpp's server does, so prompt token counts are exact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

from soba_nb.engine.tool_text import render_message, tools_prompt
from soba_nb.messages import ChatMessage, ToolCall, ToolSchema

TEMPLATE_KEY = "tokenizer.chat_template"


class RequestError(ValueError):
    """The request body is not a chat request this server can serve (HTTP 400)."""


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    raise RequestError("message content must be a string or a list of parts")


def _calls(message: Mapping[str, Any]) -> list[ToolCall]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise RequestError("a tool call has no function")
        arguments = function.get("arguments", "{}")
        calls.append(
            ToolCall(
                id=str(call.get("id", "")),
                name=str(function.get("name", "")),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return calls


def parse_messages(body: Mapping[str, Any]) -> tuple[str, list[ChatMessage], list[ToolSchema]]:
    """(system text, the conversation, the tools offered) of a request body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list")
    system_parts: list[str] = []
    conversation: list[ChatMessage] = []
    names: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, Mapping):
            raise RequestError("every message must be an object")
        role = message.get("role")
        content = _text(message.get("content"))
        if role in ("system", "developer"):
            system_parts.append(content)
        elif role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            conversation.append(
                ChatMessage(
                    role="tool", content=content, tool_call_id=call_id, name=names.get(call_id)
                )
            )
        elif role in ("user", "assistant"):
            calls = _calls(message) if role == "assistant" else []
            names.update({call.id: call.name for call in calls})
            conversation.append(ChatMessage(role=role, content=content, tool_calls=calls))
        else:
            raise RequestError(f"unknown message role {role!r}")
    return (
        "\n\n".join(part for part in system_parts if part),
        conversation,
        _tools(body.get("tools")),
    )


def _tools(tools: Any) -> list[ToolSchema]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("`tools` must be a list")
    schemas = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise RequestError("every tool needs a function with a name")
        parameters = function.get("parameters")
        schemas.append(
            ToolSchema(
                name=function["name"],
                description=str(function.get("description", "")),
                parameters=parameters if isinstance(parameters, dict) else {},
            )
        )
    return schemas


class ChatTemplate:
    """The GGUF's chat template, compiled once."""

    def __init__(self, template: str, *, bos: str, eos: str):
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise
        self._template = environment.from_string(template)
        self._bos, self._eos = bos, eos

    def render(
        self, system: str, conversation: Sequence[ChatMessage], tools: Sequence[ToolSchema]
    ) -> str:
        """The prompt text, ending with the assistant's turn opened."""
        system_parts = [system.strip()] if system.strip() else []
        if tools:
            system_parts.append(tools_prompt(list(tools)))
        messages = (
            [{"role": "system", "content": "\n\n".join(system_parts)}] if system_parts else []
        )
        messages += [render_message(message) for message in conversation]
        return self._template.render(
            messages=messages, add_generation_prompt=True, bos_token=self._bos, eos_token=self._eos
        )


def _raise(message: str) -> None:
    raise RequestError(f"the chat template refused the conversation: {message}")
