"""API keys of the HTTP providers: read from the environment, kept out of error messages.

The key is read from the environment variable that `ModelSettings.api_key_env` names, at each
call (so a key exported after loading works); a local server (Ollama, llama.cpp, vLLM, LM
Studio) needs none. Anything a server echoes back is redacted from the error.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from soba_nb.config.settings import api_key_env_problem
from soba_nb.providers.errors import MissingApiKeyError

REDACTED = "[redacted]"

LOCAL_HOSTNAMES = frozenset({"localhost", "host.docker.internal"})
LOCAL_HOST_SUFFIXES = (".localhost", ".local", ".internal", ".lan")


def is_local_url(url: str) -> bool:
    """True for loopback and private-network servers (Ollama, llama.cpp, vLLM, LM Studio),
    which usually need no API key."""
    host = (urlsplit(url).hostname or "").lower()
    if host in LOCAL_HOSTNAMES or host.endswith(LOCAL_HOST_SUFFIXES):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return (
        address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified
    )


def read_api_key(env_name: str, base_url: str) -> str | None:
    """The API key from the environment variable `env_name`.

    A missing key is an error for a remote server and allowed (None) for a local one.
    """
    key = os.environ.get(env_name, "").strip() if env_name else ""
    if key:
        return key
    if is_local_url(base_url):
        return None
    if not env_name:
        raise MissingApiKeyError(
            f"no API key for {base_url}: model.apiKeyEnv is empty; set it to the name of "
            "the environment variable that holds the key"
        )
    problem = api_key_env_problem(env_name)
    if problem is not None:  # a key where its variable's name belongs
        raise MissingApiKeyError(f"no API key for {base_url}: model.apiKeyEnv {problem} (its value is not shown)")
    raise MissingApiKeyError(
        f"no API key for {base_url}: the environment variable {env_name} (model.apiKeyEnv) "
        "is not set; export it before starting the kernel, or set os.environ in the notebook"
    )


def redact(error: BaseException, secret: str | None) -> None:
    """Remove `secret` from the error's message (servers sometimes echo the key back)."""
    if secret and any(secret in str(arg) for arg in error.args):
        error.args = tuple(str(arg).replace(secret, REDACTED) for arg in error.args)
