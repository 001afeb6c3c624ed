"""SPEC §8: secrets are redacted from what leaves the session.

Fake keys are assembled at run time with the real shapes (prefix, length, alphabet), so no
key-looking literal sits in the repository.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soba_nb.capsule_files.file import CapsuleFile, CapsuleMetadata, render_capsule_file
from soba_nb.compaction.capsule import Capsule, render_capsule
from soba_nb.redact import (
    REDACTED,
    could_be_secret,
    is_secret_name,
    redact,
    redact_data,
    redact_file_name,
)

ALNUM = "aB3dE5fG7hJ9kL2mN4pQ6rS8tU0vW1xY"


def fake(prefix: str, length: int, alphabet: str = ALNUM) -> str:
    body = (alphabet * (length // len(alphabet) + 1))[:length]
    return prefix + body


OPENAI_LEGACY = fake("sk-", 48)
OPENAI_PROJECT = fake("sk-proj-", 156, ALNUM + "_-")
OPENAI_SERVICE = fake("sk-svcacct-", 100, ALNUM + "_-")
ANTHROPIC = fake("sk-ant-api03-", 93, ALNUM + "_-") + "AA"
GITHUB_CLASSIC = fake("ghp_", 36)
GITHUB_OAUTH = fake("gho_", 36)
GITHUB_FINE_GRAINED = fake("github_pat_", 22) + "_" + fake("", 59)
AWS_ACCESS_KEY_ID = fake("AKIA", 16, "Z7Q2X9W4V1")
AWS_SESSION_KEY_ID = fake("ASIA", 16, "Z7Q2X9W4V1")
SLACK_BOT = "xoxb-" + "1234567890123-1234567890123-" + fake("", 24)
SLACK_USER = "xoxp-" + "1234567890-1234567890-" + fake("", 32)
GOOGLE = fake("AIza", 35, ALNUM + "_-")
HUGGING_FACE = fake("hf_", 34)
DEEPSEEK = fake("sk-", 32, "0123456789abcdef")
"""`sk-` and 32 lowercase hex digits (DeepSeek and other OpenAI-compatible servers)."""
JWT = ".".join(["eyJhbGciOiJIUzI1NiJ9", "eyJzdWIiOiIxMjM0NTY3ODkwIn0", fake("", 43, ALNUM + "_-")])

KEY_SHAPES = {
    "openai legacy": OPENAI_LEGACY,
    "openai project": OPENAI_PROJECT,
    "openai service account": OPENAI_SERVICE,
    "anthropic": ANTHROPIC,
    "github classic": GITHUB_CLASSIC,
    "github oauth": GITHUB_OAUTH,
    "github fine-grained": GITHUB_FINE_GRAINED,
    "aws access key id": AWS_ACCESS_KEY_ID,
    "aws session key id": AWS_SESSION_KEY_ID,
    "slack bot": SLACK_BOT,
    "slack user": SLACK_USER,
    "google": GOOGLE,
    "hugging face": HUGGING_FACE,
    "sk- and hex": DEEPSEEK,
    "jwt": JWT,
}


@pytest.mark.parametrize("key", KEY_SHAPES.values(), ids=KEY_SHAPES.keys())
@pytest.mark.parametrize(
    "template",
    [
        "key {key} in prose.",
        "`{key}`",
        "client = Client('{key}')",
        '{{"k": "{key}"}}',
        "(see {key})",
        "{key}",
    ],
)
def test_api_key_shapes_are_redacted_wherever_they_appear(key: str, template: str) -> None:
    text = template.format(key=key)
    out = redact(text, {})
    assert key not in out
    assert out == template.format(key=REDACTED)


def test_a_key_after_an_escaped_newline_in_json_output_is_redacted() -> None:
    text = '{"stdout": "loaded config\\n' + OPENAI_PROJECT + '\\n"}'
    assert redact(text, {}) == '{"stdout": "loaded config\\n[redacted]\\n"}'


def test_a_pem_private_key_block_is_redacted_whole() -> None:
    block = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n"
        + fake("", 70)
        + "\n"
        + fake("", 70)
        + "\n-----END OPENSSH PRIVATE KEY-----"
    )
    assert redact(f"found:\n{block}\nend", {}) == f"found:\n{REDACTED}\nend"


# --- credentials in context ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "curl -H 'Authorization: Bearer abc123def456ghi789' https://api",
            "curl -H 'Authorization: Bearer [redacted]' https://api",
        ),
        (
            'headers = {"Authorization": "Bearer abc123def456ghi789"}',
            'headers = {"Authorization": "Bearer [redacted]"}',
        ),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [redacted]"),
        ("authorization: token 0a1b2c3d4e5f", "authorization: token [redacted]"),
        ("Authorization: 9f8e7d6c5b4a3210", "Authorization: [redacted]"),
        ("sent bearer eyJhbGciOi.x1y2z3w4v5 to the server", "sent bearer [redacted] to the server"),
        (
            'client = OpenAI(api_key="not-a-real-shape-123")',
            'client = OpenAI(api_key="[redacted]")',
        ),
        ("api_key=plainvalue42", "api_key=[redacted]"),
        ('{"apiKey": "x7y8z9w0v1"}', '{"apiKey": "[redacted]"}'),
        ("password: hunter2", "password: [redacted]"),
        ("DB_PASSWORD='correct horse battery staple'", "DB_PASSWORD='[redacted]'"),
        ("x-api-key: 0123abcd", "x-api-key: [redacted]"),
        ("client_secret = 's3cr3t-value'", "client_secret = '[redacted]'"),
        ("settings.access_token: qwerty123", "settings.access_token: [redacted]"),
        ("HF_TOKEN=abcdefgh12", "HF_TOKEN=[redacted]"),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY",
            "aws_secret_access_key = [redacted]",
        ),
        (
            "postgresql://analyst:pa55word@db.internal:5432/sales",
            "postgresql://analyst:[redacted]@db.internal:5432/sales",
        ),
    ],
)
def test_credentials_in_context(text: str, expected: str) -> None:
    assert redact(text, {}) == expected


# --- environment variables -------------------------------------------------------------------


def test_values_of_secret_environment_variables_are_redacted() -> None:
    environ = {
        "WAREHOUSE_PASSWORD": "Tr0ub4dor&3-long",
        "internal_service_token": "plain words but secret",
        "MY_SECRET": "0123456789",
        "OPENAI_API_KEY": "local-dev-key-1",
        "HOME": "/home/ana",
    }
    text = (
        "Tried Tr0ub4dor&3-long on the warehouse; the token is plain words but secret; "
        "0123456789; key local-dev-key-1; home /home/ana"
    )
    assert redact(text, environ) == (
        "Tried [redacted] on the warehouse; the token is [redacted]; [redacted]; key [redacted]; home /home/ana"
    )


def test_short_values_and_non_secret_names_are_kept() -> None:
    environ = {
        "TOKENIZERS_PARALLELISM": "false",
        "KEYTIMEOUT": "1",
        "API_KEY": "short",
        "PATH": "/usr/local/bin:/usr/bin",
        "USER": "analyst-with-a-long-name",
    }
    text = "false 1 short /usr/local/bin:/usr/bin analyst-with-a-long-name"
    assert redact(text, environ) == text


def test_eight_characters_make_a_secret_environment_value() -> None:
    """SPEC §16: a value shorter than 8 characters, or a common word, is never a secret."""
    environ = {"DB_PASSWORD": "q7w8e9r0", "API_KEY": "q7w8e9r", "KEY_ROLE": "assistant", "WIFI_PASSWORD": "correcthorsebatterystaple"}
    assert redact("q7w8e9r0 q7w8e9r assistant correcthorsebatterystaple", environ) == f"{REDACTED} q7w8e9r assistant {REDACTED}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("curl -H 'Bearer qwertyuiopAsdfghJklzxcvbnm' x", f"curl -H 'Bearer {REDACTED}' x"),
        ("sent bearer abcdefghijklmnopqrstuvwxyz", f"sent bearer {REDACTED}"),
    ],
)
def test_bearer_tokens_without_digits_are_redacted(text: str, expected: str) -> None:
    assert redact(text, {}) == expected


def test_file_names_lose_secrets_in_any_case() -> None:
    """`%capsule create "handoff <key>"` once made `handoff-sk-….capsule.md`."""
    environ = {"ACME_SERVICE_TOKEN": "zqXvTpLmRwNs"}
    for name in (f"handoff-{OPENAI_PROJECT}.capsule.md", f"handoff-{OPENAI_PROJECT.lower()}.capsule.md"):
        assert redact_file_name(name, environ) == "handoff-redacted.capsule.md"
    assert redact_file_name("notes-zqxvtplmrwns.capsule.md", environ) == "notes-redacted.capsule.md"
    assert redact_file_name("sales-2024-q3.capsule.md", environ) == "sales-2024-q3.capsule.md"


def test_the_longest_value_wins_when_one_contains_another() -> None:
    environ = {"A_TOKEN": "abcdefgh", "B_TOKEN": "abcdefgh-ijklmnop"}
    assert redact("x abcdefgh-ijklmnop y", environ) == f"x {REDACTED} y"


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOBA_TEST_SECRET", "zq-value-from-env-81")
    assert redact("found zq-value-from-env-81") == f"found {REDACTED}"


# --- what must survive -----------------------------------------------------------------------

SURVIVORS = [
    "checkpoint ck_1a2b3c4d rolled up ck_00ff00ff",
    "entry 1a2b3c4d follows 9f8e7d6c; operation op_load_0a1b2c3d4e5f",
    "sha256 446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "tokens: 1234",
    "max_tokens = 4000",
    "token_count: 5",
    "tokenizer: o200k_base",
    "tokensBefore: 48000, tokensAfter: 9000",
    "sort key: date",
    "the task-scheduler-service-deployment-name",
    "sk-learn-style-long-hyphenated-name",
    "wrote 15 bytes to sk-learn-pipeline-2024-01-15.py",
    "sk-2024-release-notes-v3-final-draft.md",
    "uses Bearer authentication",
    "Authorization: handled by the proxy",
    'api_key=os.environ["OPENAI_API_KEY"]',
    "api_key = os.getenv('OPENAI_API_KEY')",
    "password: None",
    'api_key=""',
    "token: ${GITHUB_TOKEN}",
    "- df: DataFrame 120000×14",
    "`pytest -q` → exit status 0",
    "https://example.com/path?page=2",
    "Keys: region, month. Secrets are never printed.",
]


@pytest.mark.parametrize("text", SURVIVORS)
def test_ordinary_text_and_ids_survive(text: str) -> None:
    assert redact(text, {"HOME": "/home/ana"}) == text


def test_a_rendered_capsule_file_without_secrets_is_unchanged() -> None:
    body = render_capsule(
        Capsule(
            goal_and_constraints="Model churn; keep the tokens budget under 20000.",
            decisions="- key: customer_id, because it is unique",
            verification="- shell `pytest -q` → exit status 0",
        )
    )
    cf = CapsuleFile(
        metadata=CapsuleMetadata(
            title="Churn handoff",
            checkpoint="ck_1a2b3c4d",
            source_notebook="/work/churn.ipynb",
            source_session="20261202T143700Z-1a2b",
            quality="full",
            tokens=812,
            trigger="user",
        ),
        body=body,
    )
    text = render_capsule_file(cf)
    assert redact(text, {}) == text


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("apiKey", True),
        ("APIKey", True),
        ("x-api-key", True),
        ("db-password", True),
        ("passwd", True),
        ("access_token", True),
        ("GITHUB_TOKEN", True),
        ("client_secret", True),
        ("private_key", True),
        ("aws_secret_access_key", True),
        ("tokens", False),
        ("max_tokens", False),
        ("token_count", False),
        ("key", False),
        ("sort_key", False),
        ("tokenizer", False),
        ("sha256", False),
        ("keyboard", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


# --- properties ------------------------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    [
        *KEY_SHAPES.values(),
        "Bearer ",
        "Authorization: ",
        "api_key=",
        '"apiKey": "',
        "password: ",
        " ",
        "\n",
        "'",
        '"',
        "=",
        ":",
        "x1y2z3w4",
        "[redacted]",
        "https://u:p4ss@h/",
        "token",
        ".",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=8)), max_size=12).map(" ".join))
def test_redaction_is_idempotent_and_removes_every_key(text: str) -> None:
    once = redact(text, {})
    assert redact(once, {}) == once
    for key in KEY_SHAPES.values():
        assert key not in once


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            _FRAGMENTS,
            st.sampled_from(["\\n", "\\t", "gh", "p_", "AK", "IA", "AS", "-----BEGIN ", "PRIVATE KEY-----", "sk", "-"]),
            st.text(alphabet=ALNUM + "_-.", max_size=40),
        ),
        max_size=12,
    ).map("".join)
)
def test_a_key_shape_is_looked_for_only_where_its_substring_is(text: str) -> None:
    """`redact` runs (and compiles) a key shape only when one of its substrings is in the
    text: every match of the shape must contain one, or a key would be kept."""
    from soba_nb.redact import _KEY_SHAPES

    for needles, shape in _KEY_SHAPES:
        for match in shape().finditer(text):
            assert any(needle in match[0] for needle in needles), (needles, match[0])


def test_the_environment_is_read_again_when_it_changes(monkeypatch) -> None:
    """The secret-named variables are remembered between calls (a write redacts several
    strings), but a variable set or changed just before a write is still caught."""
    monkeypatch.setenv("SOBA_TEST_FIRST_TOKEN", "first-value-123")
    assert redact("a first-value-123 b") == f"a {REDACTED} b"
    monkeypatch.setenv("SOBA_TEST_SECOND_SECRET", "second-value-456")  # a new name
    assert redact("c second-value-456 d") == f"c {REDACTED} d"
    monkeypatch.setenv("SOBA_TEST_FIRST_TOKEN", "changed-value-789")  # same name, new value
    assert redact("e changed-value-789 f") == f"e {REDACTED} f"
    monkeypatch.delenv("SOBA_TEST_SECOND_SECRET")
    assert redact("g second-value-456 h") == "g second-value-456 h"


def test_a_secret_renamed_between_two_writes_is_caught_at_once(monkeypatch) -> None:
    """One variable removed and another added: the environment has as many names as before,
    and the new secret is still redacted on the very next write."""
    monkeypatch.setenv("SOBA_TEST_OLD_TOKEN", "old-value-1234")
    assert redact("old-value-1234") == REDACTED
    monkeypatch.delenv("SOBA_TEST_OLD_TOKEN")
    monkeypatch.setenv("SOBA_TEST_NEW_TOKEN", "new-value-5678")
    assert redact("x new-value-5678 y") == f"x {REDACTED} y"




@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.one_of(_FRAGMENTS, st.sampled_from(["secretoken=", "passkey:", "Token", "KEY", "İ", "myToken=", "MY_TOKEN:", "token_count=",
                            "tokens=", "token.=", "secret_token_count=", "api_key_id=", "x_token_2=", "TOKENs=",
                            "access__key=", "api.key:", "privateKey=", "APIKey=", "api_v2_key=", "key_count=",
                            "monkey=", "apikey=", "my_api_key_id=", "Api-Key:", "secret_key=", "rapi_key=",
                            "ACCESS_KEY_ID=", "private--key", "passes=", "pass_rate:", "PassWord=", "dbPassword=",
                            "PASSWD:", "pass_phrase=", "passphrase=", "bypass=", "passwordless"]), st.text(max_size=8)),
        max_size=12,
    ).map("".join)
)
def test_hints_found_one_word_at_a_time_redact_what_the_alternation_found(text: str) -> None:
    # The secret-name hints are searched for one literal word at a time (fast); assignments
    # come out as when one alternation was tried at every position.
    from soba_nb import redact as module

    # (A "token" with more words after it is no hint: it cannot make a name secret.)
    new = list(module._hints(text))
    assert new == sorted(new)
    saved = module._hints
    try:
        module._hints = lambda t, lowered=None: (m.start() for m in module._NAME_HINT().finditer(t))
        expected = module._assignments(text)
    finally:
        module._hints = saved
    assert module._assignments(text) == expected
    assert module._assignments(text, text.lower()) == expected


def test_a_name_ending_in_the_word_token_is_a_secret_one_with_words_after_it_is_not() -> None:
    text = "access_token=abc123def456 token_count=5 myToken: 'xyz789xyz' tokens=9 MY_TOKEN=q1w2e3r4 token_2=7"
    assert redact(text, {}) == (
        f"access_token={REDACTED} token_count=5 myToken: '{REDACTED}' tokens=9 MY_TOKEN={REDACTED} token_2=7"
    )


def test_a_name_with_the_word_key_is_a_secret_only_after_api_private_access_or_secret() -> None:
    text = "api_key=k1k2k3k4 privateKey: 'p9p8p7p6' ACCESS__KEY_ID=a1a2a3a4 key_count=3 monkey=5 keys=7"
    assert redact(text, {}) == (
        f"api_key={REDACTED} privateKey: '{REDACTED}' ACCESS__KEY_ID={REDACTED} key_count=3 monkey=5 keys=7"
    )


def test_structured_data_is_redacted_in_lists_tuples_and_dict_values() -> None:
    key = "sk-proj-" + "a1B2" * 10
    data = {"runs": [("shell", f"curl -H 'Authorization: Bearer {key}'", 3)], "note": [key], "n": 1}
    redacted = redact_data(data)
    assert key not in repr(redacted)
    assert redacted["runs"][0][2] == 3 and redacted["n"] == 1


def test_a_name_with_pass_is_a_secret_only_as_password_passwd_or_passphrase() -> None:
    text = "dbPassword=s3cr3tpw PASSWD: 'q1w2e3r4' passphrase=h0rse-battery passes=3 pass_rate=0.9 bypass=on"
    assert redact(text, {}) == (
        f"dbPassword={REDACTED} PASSWD: '{REDACTED}' passphrase={REDACTED} passes=3 pass_rate=0.9 bypass=on"
    )


# -- every written form of a secret (SPEC §12) -------------------------------------------------

_SECRET_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\\\"'\n\t"), min_size=8, max_size=24
).filter(lambda value: sum(c.isalnum() for c in value) >= 6 and could_be_secret(value))


def _forms(value: str) -> list[str]:
    import json

    once = [value, json.dumps(value), json.dumps(value, ensure_ascii=False), repr(value), ascii(value),
            repr(value.encode("utf-8")), repr([value, '"'])]
    return once + [json.dumps(form) for form in once] + [repr(form) for form in once]


@settings(max_examples=150, deadline=None)
@given(_SECRET_TEXT)
def test_an_environment_secret_is_redacted_however_it_is_escaped(value: str) -> None:
    environ = {"ACME_DB_PASSWORD": value}
    for form in _forms(value):
        text = f"before {form} after"
        redacted = redact(text, environ)
        assert value not in redacted
        assert REDACTED in redacted, form


def test_the_forms_seen_under_attack() -> None:
    import json

    value = 'Pa\\ss"w0rd!Xy9'
    environ = {"DB_PASSWORD": value, "MY_SECRET": "päss-wört-123"}
    dumped = json.dumps(environ)
    assert "w0rd" not in redact(dumped, environ) and "wört" not in redact(dumped, environ)
    assert redact(str("päss-wört-123".encode()), environ) == f"b'{REDACTED}'"
    assert redact(repr(environ), environ) == f"{{'DB_PASSWORD': '{REDACTED}', 'MY_SECRET': '{REDACTED}'}}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('password = "ab\\"cd" ok', f'password = "{REDACTED}" ok'),  # an escaped quote inside
        ("password = 'it\"s' ok", f"password = '{REDACTED}' ok"),  # the other quote inside
        ('{\\"password\\": \\"hunter22x\\"}', f'{{\\"password\\": \\"{REDACTED}\\"}}'),  # JSON in JSON
        ('api_key: "a\\\\b\\"c"', f'api_key: "{REDACTED}"'),
    ],
)
def test_a_literal_secret_is_redacted_whole(text: str, expected: str) -> None:
    assert redact(text, {}) == expected
    assert redact(expected, {}) == expected  # idempotent
