"""Asking the server for its real window, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import pytest
from llm_server import LLMServer

from soba_nb.providers.discovery import ServerWindow, discover_window

SECRET = "sk-test-DiscoveryKey0123456789abcdef"
STALL_TIMEOUT_S = 0.5
STALL_MARGIN_S = 1.5
"""Generous: a 2-core CI machine may be slow to schedule, but never this slow."""

LLAMA_CPP_PROPS = {
    "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": 4096, "params": {}},
    "total_slots": 1,
    "model_path": "../models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
    "chat_template": "...",
}
OLLAMA_PARAMETERS = (
    'stop                           "<|eot_id|>"\n'
    "num_ctx                        8192\n"
    "temperature                    0.7"
)
OLLAMA_MODEL_INFO = {
    "general.architecture": "llama",
    "general.parameter_count": 8030261248,
    "llama.attention.head_count": 32,
    "llama.context_length": 131072,
}
VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "max_model_len": 32768},
        {"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "max_model_len": 16384},
        {"id": "my-lora", "object": "model", "root": "meta-llama/Llama-3.1-8B-Instruct"},
    ],
}


def routes(server: LLMServer) -> list[tuple[str, str]]:
    return [(request.method, request.path) for request in server.requests]


# -- each server kind answering its own shape ----------------------------------------


def test_llama_cpp_props(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", body=LLAMA_CPP_PROPS)
    window = discover_window(llm_server.url, "anything")
    assert window == ServerWindow(4096, "llama.cpp GET /props n_ctx")
    assert routes(llm_server) == [("GET", "/props")]


def test_llama_cpp_top_level_n_ctx(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", body={"n_ctx": 2048, "total_slots": 1})
    assert discover_window(llm_server.url, "m") == ServerWindow(2048, "llama.cpp GET /props n_ctx")


def test_llama_cpp_unusable_nested_n_ctx_falls_back_to_the_top_level(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", body={"default_generation_settings": {}, "n_ctx": 2048})
    assert discover_window(llm_server.url, "m") == ServerWindow(2048, "llama.cpp GET /props n_ctx")


def test_ollama_num_ctx_beats_the_models_own_length(llm_server: LLMServer) -> None:
    body = {"parameters": OLLAMA_PARAMETERS, "model_info": OLLAMA_MODEL_INFO}
    llm_server.route("POST", "/api/show", body=body)
    window = discover_window(llm_server.url, "llama3.1:8b")
    assert window == ServerWindow(8192, "Ollama POST /api/show num_ctx")
    show = llm_server.requests[-1]
    assert (show.method, show.path, show.body) == ("POST", "/api/show", {"model": "llama3.1:8b"})


def test_ollama_without_num_ctx_reads_the_architecture_length(llm_server: LLMServer) -> None:
    info = {"general.architecture": "qwen2", "qwen2.context_length": 32768}
    llm_server.route(
        "POST", "/api/show", body={"parameters": "temperature 0.7", "model_info": info}
    )
    window = discover_window(llm_server.url, "qwen2.5:7b")
    assert window == ServerWindow(32768, "Ollama POST /api/show qwen2.context_length")


def test_ollama_with_no_parameters_at_all(llm_server: LLMServer) -> None:
    llm_server.route("POST", "/api/show", body={"model_info": OLLAMA_MODEL_INFO})
    window = discover_window(llm_server.url, "llama3.1:8b")
    assert window == ServerWindow(131072, "Ollama POST /api/show llama.context_length")


def test_ollama_unusable_num_ctx_falls_back_to_model_info(llm_server: LLMServer) -> None:
    body = {"parameters": "num_ctx 0", "model_info": OLLAMA_MODEL_INFO}
    llm_server.route("POST", "/api/show", body=body)
    assert discover_window(llm_server.url, "llama3.1:8b") == ServerWindow(
        131072, "Ollama POST /api/show llama.context_length"
    )


@pytest.mark.parametrize(
    ("model", "window"),
    [("meta-llama/Llama-3.1-8B-Instruct", 16384), ("Qwen/Qwen2.5-7B-Instruct", 32768)],
)
def test_vllm_picks_the_entry_of_the_model(llm_server: LLMServer, model: str, window: int) -> None:
    llm_server.route("GET", "/v1/models", body=VLLM_MODELS)
    assert discover_window(llm_server.url, model) == ServerWindow(
        window, "vLLM GET /v1/models max_model_len"
    )
    assert routes(llm_server) == [("GET", "/props"), ("POST", "/api/show"), ("GET", "/v1/models")]


def test_vllm_single_entry_serves_any_name(llm_server: LLMServer) -> None:
    only = {"data": [{"id": "served-name", "max_model_len": 8192}]}
    llm_server.route("GET", "/v1/models", body=only)
    assert discover_window(llm_server.url, "what-the-user-typed") == ServerWindow(
        8192, "vLLM GET /v1/models max_model_len"
    )


@pytest.mark.parametrize("model", ["not-served", "my-lora"])
def test_vllm_several_entries_without_a_usable_match_is_none(
    llm_server: LLMServer, model: str
) -> None:
    llm_server.route("GET", "/v1/models", body=VLLM_MODELS)
    assert discover_window(llm_server.url, model) is None


def litellm_entry(alias: str, max_input_tokens: Any, upstream: str = "openai/smol") -> dict[str, Any]:
    """One deployment of LiteLLM's `GET /model/info` (trimmed: the real one has ~100 fields)."""
    return {
        "model_name": alias,
        "litellm_params": {"model": upstream, "api_base": "http://127.0.0.1:8080/v1"},
        "model_info": {"id": "3d003e1d", "key": upstream, "max_tokens": None, "max_input_tokens": max_input_tokens,
                       "max_output_tokens": None, "litellm_provider": "openai", "mode": None},
    }


def test_a_litellm_gateway_says_the_window_of_an_alias_it_knows(llm_server: LLMServer) -> None:
    """Through LiteLLM, `/props` and `/api/show` are 404 and `/v1/models` has no length; its
    `/model/info` has `max_input_tokens` for a model it knows (or the admin described)."""
    llm_server.route("GET", "/v1/models", body={"data": [{"id": "team-smol", "object": "model"}], "object": "list"})
    info = {"data": [litellm_entry("team-gpt", 128000, "gpt-4o-mini"), litellm_entry("team-smol", 2048)]}
    llm_server.route("GET", "/model/info", body=info)
    window = discover_window(llm_server.url, "team-smol", api_key=SECRET)
    assert window == ServerWindow(2048, "LiteLLM GET /model/info max_input_tokens")
    assert routes(llm_server)[-1] == ("GET", "/model/info")
    assert llm_server.requests[-1].headers.get("authorization") == f"Bearer {SECRET}"


def test_litellm_takes_the_smallest_deployment_of_an_alias(llm_server: LLMServer) -> None:
    """Two deployments behind one alias (load balancing): a request may land on either."""
    info = {"data": [litellm_entry("team", 8192), litellm_entry("team", None), litellm_entry("team", 4096)]}
    llm_server.route("GET", "/model/info", body=info)
    assert discover_window(llm_server.url, "team") == ServerWindow(4096, "LiteLLM GET /model/info max_input_tokens")


def test_litellm_saying_nothing_of_the_alias_is_none(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/model/info", body={"data": [litellm_entry("team-smol", None)]})
    assert discover_window(llm_server.url, "team-smol") is None


def test_base_url_without_v1_and_with_a_trailing_slash(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/models", body={"data": [{"id": "m", "max_model_len": 4096}]})
    assert discover_window(llm_server.anthropic_url + "/", "m") == ServerWindow(
        4096, "vLLM GET /models max_model_len"
    )
    llm_server.route("GET", "/props", body=LLAMA_CPP_PROPS)
    assert discover_window(llm_server.url + "/", "m") == ServerWindow(
        4096, "llama.cpp GET /props n_ctx"
    )


# -- order of probes and bad answers ------------------------------------------------


def test_probes_run_in_order_and_stop_at_the_first_answer(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", body=LLAMA_CPP_PROPS)
    llm_server.route("POST", "/api/show", body={"model_info": OLLAMA_MODEL_INFO})
    llm_server.route("GET", "/v1/models", body=VLLM_MODELS)
    window = discover_window(llm_server.url, "llama3.1:8b")
    assert window == ServerWindow(4096, "llama.cpp GET /props n_ctx")
    assert routes(llm_server) == [("GET", "/props")]


def test_a_bad_first_answer_moves_on_to_the_next_probe(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", status=500, body=LLAMA_CPP_PROPS)
    llm_server.route("POST", "/api/show", body={"model_info": OLLAMA_MODEL_INFO})
    window = discover_window(llm_server.url, "llama3.1:8b")
    assert window is not None and window.source.startswith("Ollama")
    assert routes(llm_server) == [("GET", "/props"), ("POST", "/api/show")]


def test_404_everywhere_is_none(llm_server: LLMServer) -> None:
    assert discover_window(llm_server.url, "llama3:8b") is None
    assert routes(llm_server) == [("GET", "/props"), ("POST", "/api/show"), ("GET", "/v1/models"), ("GET", "/model/info")]


BAD_PROPS: list[Any] = [
    "",
    "<html>Not Found</html>",
    '{"default_generation_settings": ',
    [4096],
    {"total_slots": 1},
    {"default_generation_settings": {"n_ctx": -1}},
    {"default_generation_settings": {"n_ctx": 0}},
    {"default_generation_settings": {"n_ctx": "4096"}},
    {"default_generation_settings": {"n_ctx": 4096.5}},
    {"default_generation_settings": {"n_ctx": True}},
    {"default_generation_settings": "n_ctx=4096"},
    {"n_ctx": 10**12},
    {"n_ctx": 100_000_001},
    {"n_ctx": 8192.0},
    {"n_ctx": None},
]
BAD_SHOW: list[Any] = [
    "",
    "not json",
    {"parameters": "num_ctx -5"},
    {"parameters": "num_ctx 8k", "model_info": {"llama.context_length": -1}},
    {"model_info": {"general.architecture": "llama"}},
    {"model_info": {"llama.context_length": "131072"}},
    {"model_info": ["llama.context_length", 131072]},
    {"parameters": ["num_ctx", 8192]},
    {"parameters": "num_ctx " + "9" * 5000},
    {"model_info": {"llama.context_length": 0}},
    {"model_info": {"llama.context_length": 10**30}},
]
BAD_MODELS: list[Any] = [
    "",
    "null",
    {"data": {}},
    {"data": [{"id": "m"}]},
    {"data": [{"id": "m", "max_model_len": None}]},
    {"data": [{"id": "m", "max_model_len": -4096}]},
    {"data": [{"id": "m", "max_model_len": 4096.0}]},
    {"data": ["m"]},
    {"object": "list"},
]


BAD_MODEL_INFO: list[Any] = [
    "",
    {"data": {}},
    {"data": [{"model_name": "m", "model_info": {"max_input_tokens": None}}]},
    {"data": [{"model_name": "m", "model_info": {"max_input_tokens": 2048.0}}]},
    {"data": [{"model_name": "m", "model_info": {"max_input_tokens": -1}}]},
    {"data": [{"model_name": "m", "model_info": "max_input_tokens=2048"}]},
    {"data": [{"model_name": "other", "model_info": {"max_input_tokens": 2048}}]},
    {"data": ["m"]},
    {"detail": "Not Found"},
]


BAD_ANSWERS = (
    [("GET", "/props", body) for body in BAD_PROPS]
    + [("POST", "/api/show", body) for body in BAD_SHOW]
    + [("GET", "/v1/models", body) for body in BAD_MODELS]
    + [("GET", "/model/info", body) for body in BAD_MODEL_INFO]
)


@pytest.mark.parametrize(("method", "path", "body"), BAD_ANSWERS)
def test_a_malformed_answer_is_no_answer(
    llm_server: LLMServer, method: str, path: str, body: Any
) -> None:
    llm_server.route(method, path, body=body)
    assert discover_window(llm_server.url, "m") is None
    assert len(llm_server.requests) == 4


def test_a_num_ctx_of_thousands_of_digits_falls_back_to_model_info(llm_server: LLMServer) -> None:
    """Python refuses to convert an integer of 4,300 digits or more: no crash, no skipped probe."""
    body = {"parameters": "num_ctx " + "9" * 5000, "model_info": {"llama.context_length": 8192}}
    llm_server.route("POST", "/api/show", body=body)
    assert discover_window(llm_server.url, "m") == ServerWindow(8192, "Ollama POST /api/show llama.context_length")


def test_malformed_answers_everywhere_are_none(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", body=BAD_PROPS[-1])
    llm_server.route("POST", "/api/show", body=BAD_SHOW[-1])
    llm_server.route("GET", "/v1/models", body=BAD_MODELS[-1])
    llm_server.route("GET", "/model/info", body=BAD_MODEL_INFO[-1])
    assert discover_window(llm_server.url, "m") is None


# -- time bound ------------------------------------------------------------------------


def test_a_stalling_server_is_given_up_on_within_the_timeout(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", body=LLAMA_CPP_PROPS, delay_s=30)
    started = time.monotonic()
    assert discover_window(llm_server.url, "m", timeout_s=STALL_TIMEOUT_S) is None
    assert time.monotonic() - started < STALL_TIMEOUT_S + STALL_MARGIN_S
    assert routes(llm_server) == [("GET", "/props")], "no time was left for later probes"


def test_the_deadline_covers_all_probes_together(llm_server: LLMServer) -> None:
    """Ollama answers within the timeout of one request, but not within what the slow
    llama.cpp probe left of the shared budget."""
    stall = STALL_TIMEOUT_S * 0.6
    llm_server.route("GET", "/props", status=404, delay_s=stall)
    llm_server.route("POST", "/api/show", body={"model_info": OLLAMA_MODEL_INFO}, delay_s=stall)
    started = time.monotonic()
    assert discover_window(llm_server.url, "m", timeout_s=STALL_TIMEOUT_S) is None
    assert time.monotonic() - started < STALL_TIMEOUT_S + STALL_MARGIN_S


def test_nobody_listening_is_none() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    assert discover_window(f"http://127.0.0.1:{port}/v1", "m", timeout_s=STALL_TIMEOUT_S) is None
    assert time.monotonic() - started < STALL_TIMEOUT_S + STALL_MARGIN_S


# -- public APIs, keys, clients --------------------------------------------------------


@pytest.mark.parametrize(
    "base_url",
    [
        "https://api.openai.com/v1",
        "https://API.OpenAI.com/v1/",
        "https://eu.api.openai.com/v1",
        "https://api.anthropic.com",
        "https://api.anthropic.com/v1",
    ],
)
def test_public_api_hosts_are_never_asked(base_url: str) -> None:
    asked: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json={"n_ctx": 4096})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        assert discover_window(base_url, "gpt-4o", api_key=SECRET, client=client) is None
    assert asked == []


def test_the_key_is_sent_as_bearer_only_when_given(llm_server: LLMServer) -> None:
    discover_window(llm_server.url, "m", api_key=SECRET)
    assert len(llm_server.requests) == 4
    assert all(r.headers.get("authorization") == f"Bearer {SECRET}" for r in llm_server.requests)
    discover_window(llm_server.url, "m")
    discover_window(llm_server.url, "m", api_key="")
    assert all("authorization" not in r.headers for r in llm_server.requests[4:])


def test_the_key_never_appears_in_the_source(llm_server: LLMServer) -> None:
    """A hostile server echoing the key back as a model_info key name."""
    echoed = {f"{SECRET}.context_length": 4096}
    llm_server.route("POST", "/api/show", body={"model_info": echoed})
    window = discover_window(llm_server.url, "m", api_key=SECRET)
    assert window is not None and window.context_window == 4096
    assert SECRET not in window.source
    assert SECRET not in repr(window)


def test_a_given_client_is_used_and_left_open(llm_server: LLMServer) -> None:
    llm_server.route("GET", "/props", body=LLAMA_CPP_PROPS)
    with httpx.Client() as client:
        assert discover_window(llm_server.url, "m", client=client) is not None
        assert not client.is_closed
        assert discover_window(llm_server.url, "m", client=client) is not None
