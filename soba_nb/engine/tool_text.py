"""The text tool-call protocol of the embedded model (`soba_nb.engine`; the `local`
provider, `soba_nb.providers.local`, speaks it too). It lives in the engine, the lowest
layer: the engine imports nothing from the providers above it.

The embedded model has no native tool calling, so tools are described in the system
prompt and calls travel as text. The protocol (also what the model is told):

    To call a tool, write a fenced block whose language is `tool`, holding one JSON object:

    ```tool
    {"name": "python", "arguments": {"code": "print(1 + 1)"}}
    ```

Each such block in the answer becomes one `ToolCall` (`arguments` re-serialised as JSON
text; `"parameters"` is accepted as an alias of `"arguments"`), the block is removed from
the answer text and, by `ToolBlockFilter`, from what `on_text` streams, and the finish
reason is `tool_calls`. A block that is not a JSON object with a string `name` stays plain
text. Blocks are only parsed when the request offers tools. Earlier calls are rendered back
into assistant messages in the same form, and tool results become user messages that start
with `Tool result (<name>, call <id>):` (`…, error):` when the tool failed).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from soba_nb.messages import ChatMessage, ToolCall, ToolSchema

TOOL_BLOCK_OPEN = "```tool"
TOOL_BLOCK_CLOSE = "```"

_TOOL_BLOCK = re.compile(r"```tool(?![\w-])(.*?)```", re.DOTALL)
"""A ```tool block: the marker not followed by a word character (```tools is prose)."""


def _schema_line(tool: ToolSchema) -> str:
    return (
        f"- {tool.name}: {tool.description.strip()}\n"
        f"  parameters (JSON schema): {json.dumps(tool.parameters, ensure_ascii=False)}"
    )


def tools_prompt(tools: list[ToolSchema]) -> str:
    """The system-prompt section that describes the tools and the call protocol."""
    example = tools[0]
    properties = example.parameters.get("properties")
    first = next(iter(properties), "input") if isinstance(properties, dict) else "input"
    call = json.dumps({"name": example.name, "arguments": {first: "..."}})
    listing = "\n".join(_schema_line(tool) for tool in tools)
    return (
        "# Tools\n"
        "You can call tools. To call one, write a fenced block whose language is `tool`, "
        "holding one JSON object with the tool's name and arguments, for example:\n"
        f"{TOOL_BLOCK_OPEN}\n{call}\n{TOOL_BLOCK_CLOSE}\n"
        "Then stop and wait: the result comes back in a message starting with "
        '"Tool result".\n'
        f"Available tools:\n{listing}"
    )


def render_tool_call(call: ToolCall) -> str:
    """A call as a ```tool block (how the model was told to write it)."""
    try:
        arguments: Any = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        arguments = call.arguments
    payload = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_BLOCK_OPEN}\n{payload}\n{TOOL_BLOCK_CLOSE}"


def render_message(message: ChatMessage) -> dict[str, str]:
    """One neutral message as a plain chat-template message (role + text)."""
    if message.role == "tool":
        status = ", error" if message.is_error else ""
        header = (
            f"Tool result ({message.name or 'tool'}, call {message.tool_call_id or '?'}{status}):"
        )
        return {"role": "user", "content": f"{header}\n{message.content}"}
    if message.role == "assistant" and message.tool_calls:
        parts = [message.content.strip()] if message.content.strip() else []
        parts += [render_tool_call(call) for call in message.tool_calls]
        return {"role": "assistant", "content": "\n".join(parts)}
    return {"role": message.role, "content": message.content}


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split an answer into its prose and the ```tool blocks it holds (see module doc)."""
    calls: list[ToolCall] = []

    def take(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1).strip())
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        calls.append(
            ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=payload["name"], arguments=arguments)
        )
        return ""

    prose = _TOOL_BLOCK.sub(take, text)
    if calls:
        prose = re.sub(r"\n{3,}", "\n\n", prose).strip()
    return prose, calls


class ToolBlockFilter:
    """Streams answer text with ```tool blocks held back (they are calls, not prose).

    Text that might be the start of a block is held until it is clear; a block that
    never closes is released at the end as the text it was.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._inside = False

    def feed(self, chunk: str) -> str:
        self._pending += chunk
        shown: list[str] = []
        while True:
            if self._inside:
                end = self._pending.find(TOOL_BLOCK_CLOSE, len(TOOL_BLOCK_OPEN))
                if end < 0:
                    break
                self._pending = self._pending[end + len(TOOL_BLOCK_CLOSE) :]
                self._inside = False
                continue
            start = self._pending.find(TOOL_BLOCK_OPEN)
            if start >= 0:
                shown.append(self._pending[:start])
                self._pending = self._pending[start:]
                if len(self._pending) == len(TOOL_BLOCK_OPEN):
                    break  # what follows the marker decides; wait for it
                if _is_word_char(self._pending[len(TOOL_BLOCK_OPEN)]):
                    shown.append(self._pending[: len(TOOL_BLOCK_OPEN)])  # ```tools: prose
                    self._pending = self._pending[len(TOOL_BLOCK_OPEN) :]
                    continue
                self._inside = True
                continue
            keep = _partial_prefix_length(self._pending, TOOL_BLOCK_OPEN)
            cut = len(self._pending) - keep
            shown.append(self._pending[:cut])
            self._pending = self._pending[cut:]
            break
        return "".join(shown)

    def flush(self) -> str:
        rest, self._pending, self._inside = self._pending, "", False
        return rest


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char in "_-"


def _partial_prefix_length(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
