"""The Jupyter server extension (SPEC §18) in a real jupyter_server process: steer and edit
decisions into the session folder's inbox, the queue, the conversation read back from a real
session's transcript; the token required, paths confined to the server root, a full disk
answered in one line with nothing half-written."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib
from conftest import TEST_KEY_ENV, TEST_KEY_VALUE, write_soba_json
from disk_support import small_disk
from jupyter_support import (
    REPO_ROOT,
    JupyterServer,
    isolated_env,
    jupyter_server,
    write_code_notebook,
)
from llm_server import LLMServer, text, tool_calls

from soba_nb.inbox import Edit, Steer, inbox_for, take

ENABLED = "--ServerApp.jpserver_extensions={'soba_nb': True}"
"""Enabled on the command line too, so the test does not depend on how this machine installed soba_nb."""
NOTEBOOK = "analysis.ipynb"
ROUTES = (("POST", "inbox"), ("GET", "queue"), ("POST", "queue"), ("PUT", "queue"), ("DELETE", "queue"),
          ("POST", "queue/next"), ("GET", "conversation"))


def call(
    server: JupyterServer, method: str, route: str, body: Any = None, *, token: bool = True, **query: str
) -> tuple[int, Any]:
    """(status, JSON answer) of one request to the server."""
    url = f"{server.base_url}/soba/api/{route}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"token {server.token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, raw.decode(errors="replace")


def one_line(answer: Any) -> str:
    message = answer["message"]
    assert isinstance(message, str) and message and "\n" not in message and "Traceback" not in message
    return message


def start(tmp: Path, root: Path) -> Any:
    return jupyter_server("jupyter_server", tmp / "jupyter", root, isolated_env(tmp / "jupyter", {}), [ENABLED])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    tmp = tmp_path_factory.mktemp("soba-server")
    root = tmp / "root"
    (root / "sub").mkdir(parents=True)
    write_code_notebook(root / NOTEBOOK, ["1 + 1"])
    write_code_notebook(root / "sub" / "deeper.ipynb", ["2"])
    with start(tmp, root) as server:
        yield server


def inbox_of(server: JupyterServer, notebook: str = NOTEBOOK) -> Path:
    path = server.root / notebook
    return path.parent / f"{path.stem}.soba" / "inbox"


# -- the inbox ------------------------------------------------------------------------------


def test_a_steer_posted_is_a_message_file_in_the_notebook_s_inbox(served):
    status, answer = call(served, "POST", "inbox", {"path": NOTEBOOK, "message": {"kind": "steer", "text": "use the region column"}})
    assert status == 201
    assert (inbox_of(served) / answer["id"]).is_file()
    [message] = take(inbox_of(served)).messages
    assert isinstance(message, Steer) and message.text == "use the region column"
    assert message.sent.endswith("Z")  # stamped by the server

    decision = {"kind": "edit", "call": "call_3", "executionCount": 4, "decision": "accepted", "sent": "then"}
    status, _ = call(served, "POST", "inbox", {"path": "sub/deeper.ipynb", "message": decision})
    assert status == 201
    assert take(inbox_of(served, "sub/deeper.ipynb")).messages == [
        Edit(call="call_3", execution_count=4, decision="accepted", sent="then")
    ]


def test_a_bad_message_is_refused_in_one_line_and_nothing_is_written(served):
    for body, says in [
        ({"path": NOTEBOOK, "message": {"kind": "steer", "text": ""}}, "text"),
        ({"path": NOTEBOOK, "message": {"kind": "steer"}}, "text"),
        ({"path": NOTEBOOK, "message": {"kind": "edit", "call": "c", "executionCount": 2, "decision": "maybe"}}, "decision"),
        ({"path": NOTEBOOK, "message": {"kind": "shout", "text": "x"}}, "kind"),
        ({"path": NOTEBOOK, "message": "steer"}, "message"),
        ({"path": NOTEBOOK}, "message"),
        (b"{not json", "body: not JSON"),
        ([1, 2], "body"),
    ]:
        status, answer = call(served, "POST", "inbox", body)
        assert status == 400, (body, answer)
        assert says in one_line(answer), (body, answer)
    assert not inbox_of(served).exists() or os.listdir(inbox_of(served)) == []


# -- the queue ------------------------------------------------------------------------------


def test_the_queue_keeps_requests_in_order_and_next_claims_each_once(served):
    path = "sub/deeper.ipynb"
    assert call(served, "GET", "queue", path=path) == (200, {"items": []})
    status, first = call(served, "POST", "queue", {"path": path, "text": "plot it"})
    assert status == 201 and first["text"] == "plot it"
    _, second = call(served, "POST", "queue", {"path": path, "text": "then the table"})
    assert call(served, "GET", "queue", path=path) == (200, {"items": [first, second]})

    status, changed = call(served, "PUT", "queue", {"path": path, "id": first["id"], "text": "plot it by month"})
    assert status == 200 and changed == {"id": first["id"], "text": "plot it by month"}
    stored = json.loads((served.root / "sub" / "deeper.soba" / "queue.json").read_text())
    assert stored == {"items": [changed, second]}  # survives a page reload: it is a file

    _, third = call(served, "POST", "queue", {"path": path, "text": "and save it"})
    assert call(served, "DELETE", "queue", path=path, id=second["id"]) == (200, second)
    assert call(served, "POST", "queue/next", {"path": path}) == (200, {"item": changed})
    assert call(served, "POST", "queue/next", {"path": path}) == (200, {"item": third})
    assert call(served, "POST", "queue/next", {"path": path}) == (200, {"item": None})

    status, answer = call(served, "PUT", "queue", {"path": path, "id": second["id"], "text": "x"})
    assert status == 404 and "no such queued item" in one_line(answer)
    status, answer = call(served, "DELETE", "queue", path=path, id="nope")
    assert status == 404 and "'nope'" in one_line(answer)
    for body, says in [({"path": path, "text": ""}, "text"), ({"path": path, "text": 3}, "text"), ({"path": path, "id": 1, "text": "x"}, "id")]:
        status, answer = call(served, "PUT" if "id" in body else "POST", "queue", body)
        assert status == 400 and says in one_line(answer)


# -- who may ask, and about what -----------------------------------------------------------


def test_every_route_needs_the_token(served):
    for method, route in ROUTES:
        body = {"path": NOTEBOOK, "text": "x", "id": "x", "message": {"kind": "steer", "text": "x"}} if method in ("POST", "PUT") else None
        status, _ = call(served, method, route, body, token=False, path=NOTEBOOK, id="x")
        assert status == 403, (method, route, status)
    assert not inbox_of(served).exists() or os.listdir(inbox_of(served)) == []
    assert not (served.root / "analysis.soba" / "queue.json").exists()


def test_paths_out_of_the_root_are_refused_in_one_line(served, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write_code_notebook(outside / "theirs.ipynb", ["3"])
    root = served.root
    (root / "linked.ipynb").symlink_to(outside / "theirs.ipynb")
    (root / "away").symlink_to(outside)
    write_code_notebook(root / "planted.ipynb", ["4"])
    (root / "planted.soba").symlink_to(outside)  # a session folder that leads out
    write_code_notebook(root / "inboxed.ipynb", ["5"])
    (root / "inboxed.soba").mkdir()
    (root / "inboxed.soba" / "inbox").symlink_to(outside)
    (root / "notes.txt").write_text("x")
    cases = {
        "../outside/theirs.ipynb": "goes up (..)",
        "sub/../../outside/theirs.ipynb": "goes up (..)",
        str(outside / "theirs.ipynb"): "absolute",
        "linked.ipynb": "leads out of the server root through a link",
        "away/theirs.ipynb": "leads out of the server root through a link",
        "planted.ipynb": "session folder planted.soba is a link",
        "inboxed.ipynb": "session folder inboxed.soba/inbox is a link",
        "notes.txt": "not a notebook (.ipynb)",
        "missing.ipynb": "no such notebook",
        "": "give the notebook's path",
    }
    for path, says in cases.items():
        for method, route in ROUTES:
            body = {"path": path, "text": "x", "id": "x", "message": {"kind": "steer", "text": "x"}}
            if method in ("POST", "PUT"):
                status, answer = call(served, method, route, body)
            else:
                status, answer = call(served, method, route, path=path, id="x")
            assert status == 400, (path, method, route, answer)
            assert says in one_line(answer), (path, route, answer)
    assert sorted(p.name for p in outside.iterdir()) == ["theirs.ipynb"]  # nothing written out there
    assert not (root / "inboxed.soba" / "queue.json").exists()


def test_the_install_enables_the_extension():
    """`pip install` puts the config file where every Jupyter server reads it."""
    shared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    source = "jupyter-config/jupyter_server_config.d/soba_nb.json"
    assert shared[source] == "etc/jupyter/jupyter_server_config.d/soba_nb.json"
    assert json.loads((REPO_ROOT / source).read_text()) == {"ServerApp": {"jpserver_extensions": {"soba_nb": True}}}
    import soba_nb

    assert soba_nb._jupyter_server_extension_points() == [{"module": "soba_nb.server"}]


# -- a full disk ----------------------------------------------------------------------------


def test_a_full_disk_is_said_in_one_line_and_nothing_is_half_written(tmp_path):
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        root = disk / "root"
        root.mkdir()
        write_code_notebook(root / NOTEBOOK, ["1"])
        with start(tmp_path, root) as server:
            assert call(server, "POST", "queue", {"path": NOTEBOOK, "text": "kept"})[0] == 201
            before = (root / "analysis.soba" / "queue.json").read_bytes()
            with open(disk / "filler", "wb", buffering=0) as out:  # fill the disk
                try:
                    while True:
                        out.write(b"x" * 4096)
                except OSError:
                    pass
            status, answer = call(server, "POST", "inbox", {"path": NOTEBOOK, "message": {"kind": "steer", "text": "y" * 50_000}})
            assert status == 507 and one_line(answer).startswith("not written: No space left on device")
            assert os.listdir(root / "analysis.soba" / "inbox") == []  # no half-written message, no temporary
            status, answer = call(server, "POST", "queue", {"path": NOTEBOOK, "text": "z" * 50_000})
            assert status == 507 and "nothing was changed" in one_line(answer)
            assert (root / "analysis.soba" / "queue.json").read_bytes() == before
            assert sorted(os.listdir(root / "analysis.soba")) == ["inbox", "queue.json"]


# -- the conversation -----------------------------------------------------------------------


def test_the_conversation_of_a_real_session_comes_back_from_its_transcript(ip, nb_dir, scripted, tmp_path):
    long_answer = "The data has many columns worth describing. " * 45
    write_code_notebook(nb_dir / NOTEBOOK, ["1 + 1"])
    inbox = inbox_for(nb_dir / NOTEBOOK)
    code = f"from pathlib import Path\nfrom soba_nb.inbox import Steer, post\npost(Path({str(inbox)!r}), Steer(text='by region'))\nprint(42)"
    ip.run_line_magic("auto_compact", "off")
    scripted.script(tool_calls(("python", {"code": code})), text("There are **42** orders."))
    ip.run_line_magic("soba", f"count the orders; my key is {TEST_KEY_VALUE}")
    for index in range(6):  # enough to compact
        scripted.script(text(f"Answer {index}. {long_answer}"))
        ip.run_line_magic("soba", f"question {index}")
    ip.run_line_magic("compact", "")
    agent = ip.magics_manager.registry["SobaMagics"].agent

    with start(tmp_path, nb_dir) as server:
        status, answer = call(server, "GET", "conversation", path=NOTEBOOK)
    assert status == 200 and answer["session"] == agent.session_id and answer["omitted"] == 0
    assert TEST_KEY_VALUE not in json.dumps(answer)  # transcripts are redacted
    items = answer["messages"]
    user, tool, steer, reply = items[:4]
    assert user["kind"] == "message" and user["role"] == "user" and user["text"].startswith("count the orders; my key is ")
    assert user["steer"] is False
    assert tool["kind"] == "tool" and tool["isError"] is False
    assert tool["line"].startswith("python: from pathlib import Path") and " · ok · " in tool["line"]
    assert steer == {"kind": "message", "role": "user", "text": "by region", "steer": True}
    assert reply == {"kind": "message", "role": "assistant", "text": "There are **42** orders.", "steer": False}
    [capsule] = [item for item in items if item["kind"] == "capsule"]
    assert capsule["line"].startswith("Compacted (user) · ") and " tokens · ck_" in capsule["line"]
    assert items.index(capsule) == len(items) - 1
    assert [i["text"] for i in items if i["kind"] == "message" and i["role"] == "user"][-1] == "question 5"


# -- a real kernel, steered through the server ---------------------------------------------


@pytest.mark.timeout(240)
def test_a_steer_posted_to_the_server_reaches_a_real_kernel_s_running_turn(tmp_path):
    """A `%soba` cell in a real kernel whose `python` call sleeps; meanwhile the steer is
    POSTed to the server extension. The next request carries it after the call's result, the
    call ran to its end, the cell says `steer: …`."""
    from jupyter_client.manager import start_new_kernel

    steer = "use the region column, not the city"
    project = tmp_path / "project"
    project.mkdir()
    write_code_notebook(project / NOTEBOOK, ["%load_ext soba_nb"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOBA_")}
    env.update({
        TEST_KEY_ENV: TEST_KEY_VALUE, "HOME": str(tmp_path), "JPY_SESSION_NAME": str(project / NOTEBOOK),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    })
    with LLMServer() as llm, start(tmp_path, project) as server:
        write_soba_json(project, llm.url)
        code = "import time\ntime.sleep(3)\nprint('slept')"
        llm.script(tool_calls(("python", {"code": code})), text("By region, then."))
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(project), env=env)
        try:
            client.execute_interactive("%load_ext soba_nb", timeout=60)
            outputs: list[str] = []
            running = client.execute("%soba count the orders by city")
            deadline = time.monotonic() + 60
            while not [r for r in llm.requests if r.operation == "inference"] and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the python call sleeps now
            status, answer = call(server, "POST", "inbox", {"path": NOTEBOOK, "message": {"kind": "steer", "text": steer}})
            assert status == 201, answer
            while True:
                message = client.get_iopub_msg(timeout=120)
                if message["parent_header"].get("msg_id") != running:
                    continue
                content = message["content"]
                outputs += [content.get("text", ""), str(content.get("data", {}).get("text/plain", ""))]
                if message["msg_type"] == "status" and content["execution_state"] == "idle":
                    break
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    first, second = [r for r in llm.requests if r.operation == "inference"]
    messages = second["messages"]
    assert [m["role"] for m in messages[-3:]] == ["assistant", "tool", "user"]
    assert messages[-2]["content"].strip().endswith("slept")  # not interrupted
    assert messages[-1]["content"] == steer and steer not in json.dumps(first.body)
    assert any(f"steer: {steer}" in output for output in outputs), outputs
    transcripts = list((project / "analysis.soba").glob("*.jsonl"))
    lines = [json.loads(line) for path in transcripts for line in path.read_text().splitlines()]
    assert [line["content"] for line in lines if line.get("steer") is True] == [steer]
