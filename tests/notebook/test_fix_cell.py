"""`%soba /fix [--cell N]` asks the model for `edit_cell` on the failed cell (SPEC §10, §18), read
from the request bodies the loopback server received: the latest cell that raised, or the recorded
cell In [N] (the sidebar's Fix button sends `%%soba` with `/fix --cell N`); a cell that was not
recorded, or did not raise, is refused in one line and nothing is sent."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from llm_server import text, tool_calls

from soba_nb.transcript.entries import MessageEntry

DEFINE = "sales = {'amount': [120, 80, 45]}"
FAILING = "revenue = sum(sales['revenue'])"
FIXED = "revenue = sum(sales['amount'])"
OTHER_FAILURE = "1 / 0"
ASKED_FOR_EDIT = "propose the corrected source of In [{n}] with edit_cell (not a copy with add_cell)"


def run_cell(ip: Any, source: str) -> Any:
    return ip.run_cell(source, store_history=True)


def last_user_message(request: Any) -> str:
    return [m["content"] for m in request["messages"] if m["role"] == "user"][-1]


def typed_requests(ip: Any) -> list[str | None]:
    agent = ip.magics_manager.registry["SobaMagics"].agent
    return [e.typed for e in agent.transcript.path() if isinstance(e, MessageEntry) and e.role == "user"]


def two_failures(ip: Any) -> None:
    """In [1] defines, In [2] fails on a key, In [3] fails on a division (the latest error)."""
    assert run_cell(ip, DEFINE).success
    assert not run_cell(ip, FAILING).success
    assert not run_cell(ip, OTHER_FAILURE).success


def test_fix_cell_n_asks_for_edit_cell_on_that_cell_and_the_edit_is_placed(ip, scripted):
    two_failures(ip)
    scripted.script(tool_calls(("edit_cell", {"execution_count": 2, "source": FIXED})), text("The key is 'amount'."))
    with capture_output() as shown:
        run_cell(ip, "%soba /fix --cell 2 keep the sum")

    first, second = scripted.inference_requests()
    request = last_user_message(first)
    assert request.startswith("Fix the notebook cell In [2] above, which failed.")  # not In [3], the latest error
    assert ASKED_FOR_EDIT.format(n=2) in request and "Also: keep the sum" in request
    assert "edit_cell" in [t["function"]["name"] for t in first["tools"]]
    assert typed_requests(ip) == ["/fix --cell 2 keep the sum"]
    [result] = [m["content"] for m in second["messages"] if m["role"] == "tool"]
    assert result.startswith("proposed a new source for In [2] (1 line), not applied:")
    # No labextension here: the diff in the output, the new source below (not run).
    assert f"-{FAILING}\n+{FIXED}" in shown.stdout and ip.rl_next_input == FIXED
    assert "revenue" not in ip.user_ns


def test_fix_without_a_cell_is_about_the_latest_error_and_asks_for_edit_cell_too(ip, scripted):
    two_failures(ip)
    scripted.script(text("Division by zero."))
    with capture_output():
        run_cell(ip, "%soba /fix")
    request = last_user_message(scripted.inference_requests()[0])
    assert request.startswith("Fix the notebook cell In [3] above, which failed.")
    assert ASKED_FOR_EDIT.format(n=3) in request and "propose the corrected cell with add_cell" not in request
    assert typed_requests(ip) == ["/fix"]


def test_the_fix_buttons_cell_magic_form_is_typed_as_sent(ip, scripted):
    two_failures(ip)
    scripted.script(text("Fixed."))
    with capture_output():
        run_cell(ip, "%%soba\n/fix --cell 2")  # what the sidebar's Fix button runs
    assert last_user_message(scripted.inference_requests()[0]).startswith("Fix the notebook cell In [2] above")
    assert typed_requests(ip) == ["/fix --cell 2"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("/fix --cell 9", "%soba /fix --cell 9: no cell In [9] was recorded in this kernel (only cells run after %load_ext soba_nb are)"),
        ("/fix --cell 1", "%soba /fix --cell 1: In [1] ran without an error; ask about it with %soba"),
        ("/fix --cell two", "%soba /fix --cell: give the number of a cell that failed, e.g. /fix --cell 4"),
        ("/fix --cell", "%soba /fix --cell: give the number of a cell that failed, e.g. /fix --cell 4"),
    ],
)
def test_a_cell_that_was_not_recorded_or_did_not_raise_is_refused_in_one_line(ip, scripted, line, problem):
    two_failures(ip)
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("soba", line)
    assert str(refused.value) == problem
    assert scripted.server.requests == []
