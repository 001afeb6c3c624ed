"""A transcript damaged in the middle, opened by `%soba`: the one-line error names the line
and the way back (`soba-nb verify … --repair`) and around it (`--new`) — issue 26."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

HEADER = '{"type":"session","id":"a1","parentId":null,"timestamp":"2026-12-04T00:00:00.000Z"}'
LATER = '{"type":"message","id":"a2","parentId":"a1","timestamp":"2026-12-04T00:00:01.000Z","role":"user","content":"x"}'


def test_the_error_names_the_line_and_the_repair(ip, nb_dir):
    folder = nb_dir / "analysis.soba"
    folder.mkdir()
    damaged = folder / "20261204T000000Z-abcd.jsonl"
    damaged.write_text(f"{HEADER}\ngarbage in the middle\n{LATER}\n")
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("soba", "hello")
    message = str(raised.value)
    assert message.startswith(f"{damaged}:2: not valid JSON")
    assert f"soba-nb verify {damaged} --repair" in message and "%soba --new" in message
    assert "\n" not in message
