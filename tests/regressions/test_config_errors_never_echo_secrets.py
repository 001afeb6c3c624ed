"""A configuration error never echoes a secret (SPEC §3: no key in any file, in any form).

Found after issue 27: a key pasted into `soba.json` as `"apiKey"` (a natural guess: the key
that exists is `apiKeyEnv`) made `%soba` answer `model.apiKey: unknown key (value
"sk-proj-…")`, and a key pasted where a figure belongs (`"contextWindow": "sk-…"`) was echoed
the same way. The error is a cell's output, and the notebook file keeps its outputs: the key
went to disk, and to git with the notebook. Now a value under a key that names a secret is
not shown, and any other value is redacted before it is clipped.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from IPython.core.error import UsageError

KEY = "sk-proj-Q7pLx2Vb9TnR4kWd8YzH3cFm6Ja1Ue5S"
ENV_NAME = "ACME_SERVICE_TOKEN"
ENV_VALUE = "zqXvTpLmRwNs"
STRIPE_LIKE = "sk_live_51HxQ7pLx2Vb9TnR4kWd8YzH3cFm6Ja1Ue5S"
"""A valid identifier: only its look gives it away."""
GOOGLE_LIKE = "AIzaSyD4xQ7pLx2Vb9TnR4kWd8YzH3cFm6Ja1U"
SECRETS = (KEY, KEY[:12], ENV_VALUE, STRIPE_LIKE, STRIPE_LIKE[:16], GOOGLE_LIKE, GOOGLE_LIKE[:12])

LAYERS = {
    "apiKey": ({"model": {"apiKey": KEY}}, "model.apiKey: unknown key (its value is not shown"),
    "api_key": ({"model": {"api_key": KEY}}, "model.api_key: unknown key (its value is not shown"),
    "nested secret": (
        {"model": {"pricing": {"inputPerMTok": 1, "outputPerMTok": 2, "token": KEY}}},
        "model.pricing.token: unknown key (its value is not shown",
    ),
    "key as a figure": ({"model": {"contextWindow": KEY}}, 'model.contextWindow = "[redacted]"'),
    "password in a URL": (
        {"model": {"provider": "openai", "baseUrl": f"ftp://admin:{KEY}@gw.example/v1"}},
        "model.baseUrl = ",
    ),
    "environment value": ({"compaction": {"auto": ENV_VALUE}}, 'compaction.auto = "[redacted]"'),
    "secret under a known section": ({"notebook": {"secret": KEY}}, "notebook.secret: unknown key"),
    "key in apiKeyEnv": ({"model": {"apiKeyEnv": KEY}}, "model.apiKeyEnv (value not shown): must be the name"),
    "underscored key in apiKeyEnv": ({"model": {"apiKeyEnv": STRIPE_LIKE}}, "model.apiKeyEnv (value not shown)"),
    "unprefixed key in apiKeyEnv": ({"model": {"apiKeyEnv": GOOGLE_LIKE}}, "model.apiKeyEnv (value not shown)"),
}


def write(nb_dir, layer) -> None:
    (nb_dir / "soba.json").write_text(json.dumps(layer), encoding="utf-8")


@pytest.mark.parametrize("kind", LAYERS)
def test_a_configuration_error_shows_the_key_not_the_secret(ip, nb_dir, llm_server, capsys, monkeypatch, kind):
    monkeypatch.setenv(ENV_NAME, ENV_VALUE)
    layer, expected = LAYERS[kind]
    write(nb_dir, layer)
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("soba", "hello")
    message = str(raised.value)
    assert "\n" not in message and expected in message and "soba.json" in message
    assert not [secret for secret in SECRETS if secret in message]
    ip.run_cell("%soba hello")  # as a user types it: the cell's output is what the notebook keeps
    shown = capsys.readouterr()
    assert expected in shown.err
    assert not [secret for secret in SECRETS if secret in shown.out + shown.err]
    assert not llm_server.requests


def test_soba_nb_doctor_names_the_key_and_hides_the_secret(nb_dir, monkeypatch):
    write(nb_dir, LAYERS["apiKey"][0])
    done = subprocess.run(
        [sys.executable, "-m", "soba_nb.cli", "doctor", str(nb_dir)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert "model.apiKey: unknown key" in done.stdout + done.stderr
    assert KEY not in done.stdout + done.stderr and KEY[:12] not in done.stdout + done.stderr


def test_a_variable_set_to_a_secret_is_not_echoed(ip, nb_dir, monkeypatch):
    monkeypatch.setenv("SOBA_MODEL_CONTEXT_WINDOW", KEY)
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("budget", "")
    message = str(raised.value)
    assert "SOBA_MODEL_CONTEXT_WINDOW" in message and KEY not in message and KEY[:12] not in message


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "TEAM_LLM_KEY", "TeamKey2", "vllm_key", ""])
def test_a_variables_name_is_still_a_name(nb_dir, name):
    from soba_nb.config import load_config

    write(nb_dir, {"model": {"apiKeyEnv": name}})
    assert load_config(nb_dir).model.api_key_env == name


def test_a_key_that_reached_apikeyenv_anyway_is_not_named_when_it_is_missing():
    """Defence in depth: settings built without validation (`model_construct`) still never put
    the key in the missing-key error."""
    from soba_nb.providers.errors import MissingApiKeyError
    from soba_nb.providers.keys import read_api_key

    for value in (KEY, STRIPE_LIKE, GOOGLE_LIKE):
        with pytest.raises(MissingApiKeyError) as raised:
            read_api_key(value, "https://api.example.com/v1")
        assert "model.apiKeyEnv must be the name" in str(raised.value)
        assert not [secret for secret in SECRETS if secret in str(raised.value)]
