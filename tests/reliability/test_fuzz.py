"""Fuzzing the parsers of everything that comes from outside: transcripts, capsule files,
configuration, server-sent events. Each must answer garbage with its own clear error, never
crash with anything else. The figure counts the examples run and the crashes (0)."""

from __future__ import annotations

import contextlib
import json
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soba_nb.capsule_files.file import CapsuleFileError, parse_capsule_file, render_capsule_file
from soba_nb.config import ConfigError, build_config
from soba_nb.providers.anthropic import AnthropicProvider
from soba_nb.providers.errors import ProviderError
from soba_nb.providers.http import TextSink
from soba_nb.providers.openai import OpenAIProvider
from soba_nb.providers.sse import iter_sse_events
from soba_nb.transcript.store import TornLineWarning, Transcript, TranscriptError

EXAMPLES = 400
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
COUNTS: dict[str, int] = {}

_JSON_SCALARS = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | st.text(max_size=20)
_JSON = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def _count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


def _sample_transcript_lines() -> list[str]:
    return [
        '{"type":"session","id":"h","parentId":null,"timestamp":"t","version":1}',
        '{"type":"message","id":"m","parentId":"h","timestamp":"t","role":"user","content":"hi"}',
        '{"type":"leaf","id":"l","parentId":"m","timestamp":"t","targetId":"h"}',
    ]


@FUZZ
@given(
    lines=st.lists(st.sampled_from(_sample_transcript_lines()) | st.text(max_size=80) | _JSON.map(json.dumps), max_size=8),
    cut=st.integers(0, 400),
    terminated=st.booleans(),
)
def _fuzz_transcript(lines: list[str], cut: int, terminated: bool) -> None:
    _count("JSONL loader")
    raw = ("\n".join(lines) + ("\n" if terminated else "")).encode("utf-8", "replace")
    raw = raw[: len(raw) - cut % (len(raw) + 1)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s.jsonl"
        path.write_bytes(raw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornLineWarning)
            with contextlib.suppress(TranscriptError):
                Transcript.load(path)


def _valid_capsule_text() -> str:
    from soba_nb.capsule_files.file import CapsuleFile, CapsuleMetadata
    from soba_nb.compaction.capsule import SECTION_HEADINGS

    body = "\n\n".join(f"## {h}\n\n(none)" for h in SECTION_HEADINGS) + "\n"
    meta = CapsuleMetadata(title="T", checkpoint="ck_1a2b3c4d", quality="full", tokens=1, trigger="user")
    return render_capsule_file(CapsuleFile(metadata=meta, body=body))


@FUZZ
@given(st.data())
def _fuzz_capsule_file(data: st.DataObject) -> None:
    _count(".capsule.md parser")
    base = _valid_capsule_text()
    choice = data.draw(st.integers(0, 2))
    if choice == 0:
        text = data.draw(st.text(max_size=400))
    elif choice == 1:
        at = data.draw(st.integers(0, len(base)))
        text = base[:at] + data.draw(st.text(max_size=20)) + base[at + data.draw(st.integers(0, 20)) :]
    else:
        text = base[: data.draw(st.integers(0, len(base)))]
    with contextlib.suppress(CapsuleFileError):
        parse_capsule_file(text, source="fuzz.capsule.md")


@FUZZ
@given(layers=st.lists(st.tuples(st.text(max_size=8), st.dictionaries(st.sampled_from(["model", "compaction", "x"]), _JSON, max_size=3)), max_size=3))
def _fuzz_config(layers: list[tuple[str, dict[str, object]]]) -> None:
    _count("config loader")
    try:
        build_config(layers)
    except ConfigError as error:
        assert "\n" not in str(error)


_SSE_LINE = (
    st.sampled_from(["", ": ping", "data: [DONE]", "event: message_stop", 'data: {"choices": []}', 'data: {"type": "message_start"}'])
    | st.text(max_size=60).map(lambda t: "data: " + t)
    | _JSON.map(lambda v: "data: " + json.dumps(v))
    | st.text(max_size=40)
)


@FUZZ
@given(lines=st.lists(_SSE_LINE, max_size=12), wire=st.sampled_from(["openai", "anthropic"]))
def _fuzz_sse(lines: list[str], wire: str) -> None:
    _count("SSE parser")
    from soba_nb.config import ModelSettings

    provider_class = OpenAIProvider if wire == "openai" else AnthropicProvider
    settings = ModelSettings(provider=wire, base_url="http://127.0.0.1:9")  # type: ignore[arg-type]
    with provider_class(settings) as provider, contextlib.suppress(ProviderError):
        provider.parse_stream(iter_sse_events(lines), TextSink(None))


def test_parsers_never_crash_on_garbage(figures):
    crashes = []
    for name, fuzz in (
        ("JSONL loader", _fuzz_transcript),
        (".capsule.md parser", _fuzz_capsule_file),
        ("config loader", _fuzz_config),
        ("SSE parser", _fuzz_sse),
    ):
        try:
            fuzz()
        except Exception as exc:  # a crash: anything but the parser's own error
            crashes.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    runs = ", ".join(f"{name} {COUNTS.get(name, 0)}" for name in ("JSONL loader", ".capsule.md parser", "config loader", "SSE parser"))
    figures.add("fuzzing (hypothesis)", f"examples run: {runs} · crashes {len(crashes)}")
    assert crashes == []
