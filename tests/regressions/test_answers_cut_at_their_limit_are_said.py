"""Issue 41 item 3 (SPEC §17 "Streams are stopped by tokens"): an answer cut at
`maxOutputTokens` is said in the cell, and a tool call whose arguments were cut is never run on
half its arguments nor dropped silently: the model is told, in the call's result, and the turn
goes on so it can make smaller calls.

Found: a tool call whose arguments passed 64 KB was dropped silently — "completed · 1 step"
with an empty answer; the model never knew its file was not written.
"""

from __future__ import annotations

import json
from typing import Any

from IPython.utils.capture import capture_output
from llm_server import endless, text, tool_calls

from soba_nb.transcript.entries import MessageEntry, ToolCallEntry, ToolResultEntry
from soba_nb.transcript.store import Transcript

BIG = "row,value\n" + "".join(f"{n},{n * 7 % 101}\n" for n in range(9000))
"""About 80 KB: a file the model tries to write in one call."""


def agent(ip: Any) -> Any:
    return ip.magics_manager.registry["SobaMagics"].agent


def entries(ip: Any) -> list[Any]:
    return list(Transcript.load(agent(ip).file).entries)


def run(ip: Any, prompt: str) -> str:
    with capture_output() as out:
        ip.run_line_magic("soba", prompt)
    return out.stdout + out.stderr


def test_a_call_cut_by_the_servers_own_limit_is_told_to_the_model(ip, nb_dir, scripted):
    cut = json.dumps({"path": "data.csv", "content": BIG})[:600]  # what came before max_tokens (500)
    scripted.script(
        tool_calls(("write_file", cut), finish="length"),
        tool_calls(("write_file", {"path": "data.csv", "content": "row,value\n0,0\n"})),
        text("Wrote the first rows; the rest follows with edit_file."),
    )
    shown = run(ip, "write the readings to data.csv")
    limit = agent(ip).limits.max_output_tokens
    assert f"the answer reached model.maxOutputTokens ({limit:,} tokens) and was cut there" in shown
    assert (
        f"write_file was not run: its arguments passed model.maxOutputTokens ({limit:,} tokens) and were cut off "
        "after 600 characters; the model is told to make smaller calls"
    ) in shown
    assert "completed" in shown and "Wrote the first rows" in shown  # the turn went on
    assert (nb_dir / "data.csv").read_text() == "row,value\n0,0\n"  # only the whole call ran
    found = entries(ip)
    [first_call, second_call] = [e for e in found if isinstance(e, ToolCallEntry)]
    recorded = json.loads(first_call.arguments)
    assert recorded["cut_off_after_chars"] == 600 and recorded["head"].startswith('{"path": "data.csv"')
    results = [e for e in found if isinstance(e, ToolResultEntry)]
    assert results[0].is_error and results[0].call_id == first_call.call_id
    assert "[not run: this call's arguments were cut off at model.maxOutputTokens" in results[0].content
    assert "build long content with code in the python tool" in results[0].content
    # What the model read next: its cut call and the reason it did not run.
    [after] = [r for r in scripted.inference_requests()][1:2]
    messages = after.body["messages"]
    assert any("not run: this call's arguments were cut off" in str(m.get("content")) for m in messages)
    assert len(json.dumps(messages)) < 20_000


def test_an_answer_cut_by_the_server_says_so(ip, nb_dir, scripted):
    scripted.script(text("The three steps are: first, load the data; second,", finish="length"))
    shown = run(ip, "explain the steps")
    assert "and was cut there" in shown
    [answer] = [e for e in entries(ip) if isinstance(e, MessageEntry) and e.role == "assistant"]
    assert answer.content.endswith("second,")


def test_a_whole_answer_says_nothing_of_the_limit(ip, nb_dir, scripted):
    scripted.script(text("All done."))
    shown = run(ip, "hello")
    assert "maxOutputTokens" not in shown



def test_an_endless_stream_is_stopped_and_said(ip, nb_dir, scripted):
    scripted.script(endless("la ", interval_s=0.0005))
    shown = run(ip, "sing")
    limit = agent(ip).limits.max_output_tokens
    assert f"the server streamed on past model.maxOutputTokens ({limit:,} tokens): soba stopped the answer there" in shown


def test_a_runaway_tool_call_is_stopped_in_tokens_and_told_to_the_model(ip, nb_dir, scripted):
    """A server that streams a call's arguments on past the limit (a 80 KB file in one
    write_file): stopped there, the call kept cut, told to the model — never 'completed · 1 step'
    with an empty answer."""
    scripted.script(
        tool_calls(("write_file", {"path": "data.csv", "content": BIG}), argument_deltas=400),
        text("I will write it in parts."),
    )
    shown = run(ip, "write the readings to data.csv")
    limit = agent(ip).limits.max_output_tokens
    assert f"the server streamed on past model.maxOutputTokens ({limit:,} tokens): soba stopped the answer there" in shown
    assert "write_file was not run: its arguments passed model.maxOutputTokens" in shown
    assert "[write_file · arguments cut off at the output limit · error" in shown  # the receipt says why
    assert "I will write it in parts." in shown and not (nb_dir / "data.csv").exists()
    [result] = [e for e in entries(ip) if isinstance(e, ToolResultEntry)]
    assert result.is_error and "not run: this call's arguments were cut off" in result.content
