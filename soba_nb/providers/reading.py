"""A local server reading a long prompt is not a stall (SPEC §17).

A model on a laptop CPU (llama.cpp, Ollama, LM Studio) reads a prompt at 30–100 tokens a
second and sends nothing, not even its headers, until it has read it all: a 10,000-token
session waits minutes for its first byte. So before the first byte, a server on this machine or
a private network is given at least one second per `LOCAL_READING_TOKENS_PER_S` prompt tokens,
and never less than the idle limit (`Silence.reading_s`). After the first byte (content, or
llama.cpp's `prompt_progress`), and for a short prompt, the idle limit of SPEC §12 holds as
before. A public server keeps the idle limit: it reads on a GPU in seconds, and a silent one is
a stall.

Which servers are local is decided by the request URL's host alone, with no DNS lookup (a
lookup can block for seconds and would ask the network about every request):

- `localhost`, and IP literals in the loopback (127.0.0.0/8, ::1), private (RFC 1918: 10/8,
  172.16/12, 192.168/16; IPv6 unique local fc00::/7) and link-local (169.254/16, fe80::/10)
  ranges, IPv4-mapped IPv6 included;
- any other name is taken as remote (`ollama.lan`, a docker-compose service name): such a
  server keeps the idle limit, which `%config SobaMagics.idle_timeout_s` raises for every server.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from soba_nb.providers.base import ModelRequest

LOCAL_READING_TOKENS_PER_S = 40
"""SPEC §17: the slowest prompt reading a local server is given time for (a 7B model on a laptop
CPU reads 30–100 tokens a second)."""
LOCAL_HOSTNAME = "localhost"
LOCAL_NETWORKS = tuple(
    ipaddress.ip_network(network)
    for network in (
        "127.0.0.0/8",  # loopback
        "10.0.0.0/8",  # RFC 1918
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",  # link-local
        "::1/128",
        "fc00::/7",  # unique local
        "fe80::/10",
    )
)
CHARS_PER_PROMPT_TOKEN = 4
"""A request that carries no count of its own (a summary request) is counted cheaply by its text."""
READING = "the model is reading"


def is_private_server(url: str) -> bool:
    """Whether `url` names a server on this machine or a private network (see the module)."""
    host = (urlsplit(url).hostname or "").lower()
    if host == LOCAL_HOSTNAME:
        return True
    try:
        # An IPv6 zone (fe80::1%eth0) is no part of the address.
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in LOCAL_NETWORKS)


def prompt_tokens(request: ModelRequest) -> int:
    """The request's prompt in tokens: the caller's count (`input_tokens`), else its text at
    `CHARS_PER_PROMPT_TOKEN` characters a token (images left out: their cost is the server's
    own rule, and a base64 length would be no measure of it)."""
    if request.input_tokens:
        return request.input_tokens
    chars = len(request.system) + sum(len(message.content) for message in request.messages)
    chars += sum(len(call.arguments) for message in request.messages for call in message.tool_calls)
    chars += sum(len(tool.description) + len(str(tool.parameters)) for tool in request.tools)
    return chars // CHARS_PER_PROMPT_TOKEN


def reading_allowance_s(tokens: int, idle_limit_s: float) -> float:
    """How long a local server may take to its first byte: 1 s per 40 prompt tokens, never
    less than the idle limit."""
    return max(idle_limit_s, tokens / LOCAL_READING_TOKENS_PER_S)


def reading_status(tokens: int) -> str:
    """The cell's status line while a local server reads: "the model is reading 12,400 tokens"."""
    return f"{READING} {tokens:,} tokens"
