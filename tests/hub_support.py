"""A real JupyterHub on 127.0.0.1, for the team tests (SPEC §13); its users come from
`local_users`.

`jupyterhub` starts the hub (`python -m jupyterhub`, LocalProcessSpawner, NullAuthenticator:
the test speaks to it with API tokens only) behind `configurable-http-proxy` on free loopback
ports, with a service token that may start servers and issue user tokens, and always stops
it, the proxy and the users' servers. `UserServer` speaks to one user's single-user server
through the proxy with that user's token, as a frontend does: contents, sessions, and a
kernel's websocket channels (`KernelChannels`).

`require_hub` skips a test, with the reason, where any part is missing: root, `useradd`,
`jupyterhub`, `configurable-http-proxy` (on PATH, or installed by `.ci/run` with `npm install
--prefix ~/.cache/soba-chp configurable-http-proxy@4`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from child_processes import stop_process_group, tied_to_this_process
from jupyter_support import REPO_ROOT, free_port
from local_users import ACCOUNT_TOOLS

CHP_NAME = "configurable-http-proxy"
CHP_INSTALLED = Path.home() / ".cache" / "soba-chp" / "node_modules" / ".bin" / CHP_NAME
"""Where `.ci/run` installs the proxy (npm, outside the repository)."""
HUB_START_TIMEOUT_S = 60
SERVER_START_TIMEOUT_S = 90
HUB_STOP_TIMEOUT_S = 30
REQUEST_TIMEOUT_S = 30
POLL_INTERVAL_S = 0.25
EXECUTE_TIMEOUT_S = 120


# -- skip rules ----------------------------------------------------------------------------


def chp_command() -> str | None:
    """The configurable-http-proxy to run: on PATH, else where `.ci/run` installs it."""
    found = shutil.which(CHP_NAME)
    if found:
        return found
    return str(CHP_INSTALLED) if CHP_INSTALLED.is_file() else None


def require_hub() -> str:
    """Skip the test, with the reason, unless a hub with local users can run here; the
    proxy's command when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root: the hub runs each user's server as that user, and the test makes the users")
    missing = [tool for tool in ACCOUNT_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing: the test makes its own local users (Debian: passwd)")
    pytest.importorskip("jupyterhub", reason="jupyterhub is missing (pip install -e '.[hub]')")
    chp = chp_command()
    if chp is None:
        pytest.skip(f"{CHP_NAME} is missing (npm install --prefix ~/.cache/soba-chp {CHP_NAME}@4)")
    return chp


# -- the hub -------------------------------------------------------------------------------

HUB_CONFIG = '''\
"""A test's JupyterHub (tests/hub_support.py). No secret is written here: the users' gateway
keys, the team's capsule key and the test's service token come from the hub's environment,
as from a secret store, and the spawner hands each user their own (docs/teams.md)."""
import json
import os

SECRETS = json.loads(os.environ.pop("SOBA_HUB_TEST_SECRETS"))
SETTINGS = json.loads({settings!r})

c = get_config()  # noqa: F821
c.JupyterHub.bind_url = SETTINGS["bind_url"]
c.JupyterHub.hub_bind_url = SETTINGS["hub_bind_url"]
c.ConfigurableHTTPProxy.api_url = SETTINGS["proxy_api_url"]
c.ConfigurableHTTPProxy.command = [SETTINGS["chp"]]
c.ConfigurableHTTPProxy.pid_file = SETTINGS["proxy_pid_file"]
c.JupyterHub.pid_file = SETTINGS["hub_pid_file"]
c.JupyterHub.db_url = "sqlite:///" + SETTINGS["db"]
c.JupyterHub.cookie_secret_file = SETTINGS["cookie_secret_file"]
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True
c.JupyterHub.authenticator_class = "null"
c.Authenticator.allowed_users = set(SETTINGS["users"])
c.JupyterHub.services = [{{"name": "soba-test", "api_token": SECRETS["service"]}}]
c.JupyterHub.load_roles = [
    {{
        "name": "soba-test",
        "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"],
        "services": ["soba-test"],
    }}
]
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = SETTINGS["singleuser"]
c.Spawner.args = SETTINGS["singleuser_args"]
c.Spawner.start_timeout = SETTINGS["start_timeout"]
c.Spawner.http_timeout = SETTINGS["start_timeout"]
c.Spawner.environment = SETTINGS["environment"]


def give_keys(spawner):
    """Each user's own gateway key, and the team's capsule key (docs/teams.md, section 3)."""
    own = {{variable: keys[spawner.user.name] for variable, keys in SECRETS["per_user"].items()}}
    spawner.environment = {{**spawner.environment, **own, **SECRETS["team"]}}


c.Spawner.pre_spawn_hook = give_keys
'''


def _request(url: str, token: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"token {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, raw.decode(errors="replace")


@dataclass
class Hub:
    url: str
    """The proxy's public URL: everything goes through it, as a browser's requests do."""
    token: str
    """The test service's token (admin of users and servers, may issue user tokens)."""
    folder: Path
    log: Path

    def api(self, method: str, path: str, body: Any = None, expect: Iterable[int] = (200, 201)) -> Any:
        status, answer = _request(f"{self.url}/hub/api{path}", self.token, method, body)
        if status not in set(expect):
            pytest.fail(f"hub {method} {path}: HTTP {status} {answer}\n{self.log_tail()}")
        return answer

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start_server(self, user: str) -> UserServer:
        """Start `user`'s single-user server, wait until it is ready, and give a handle on it
        holding a token of that user's (which may reach their own server only)."""
        self.api("POST", f"/users/{user}/server", expect=(201, 202, 400))  # 400: already running
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            server = (self.api("GET", f"/users/{user}").get("servers") or {}).get("")
            if server and server.get("ready"):
                break
            if not server:
                pytest.fail(f"{user}'s server stopped while starting:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{user}'s server is not ready after {SERVER_START_TIMEOUT_S} s:\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)
        token = self.api(
            "POST", f"/users/{user}/tokens",
            {"scopes": [f"access:servers!user={user}"], "note": "soba team test", "expires_in": 3600},
        )["token"]
        return UserServer(self, user, f"{self.url}{server['url'].rstrip('/')}", token)


@contextlib.contextmanager
def jupyterhub(
    folder: Path,
    *,
    chp: str,
    users: Iterable[str],
    environment: Mapping[str, str],
    per_user: Mapping[str, Mapping[str, str]],
    team: Mapping[str, str],
    umask: int = 0o027,
) -> Iterator[Hub]:
    """A hub serving `users`, its state and log in `folder` (private to root). Each user's
    server gets `environment`, its own value of each variable of `per_user` (variable → user →
    value) and `team`; the secrets reach the hub through its environment only. The hub, and so
    the servers it starts, runs with `umask`. Always stopped: the hub (which stops the users'
    servers and the proxy), then the proxy by its process id if it outlived the hub."""
    folder.mkdir(mode=0o700, parents=True)
    service_token = secrets.token_hex(32)
    proxy_port = free_port()
    settings = {
        "bind_url": f"http://127.0.0.1:{proxy_port}",
        "hub_bind_url": f"http://127.0.0.1:{free_port()}",
        "proxy_api_url": f"http://127.0.0.1:{free_port()}",
        "chp": chp,
        "proxy_pid_file": str(folder / "proxy.pid"),
        "hub_pid_file": str(folder / "hub.pid"),
        "db": str(folder / "jupyterhub.sqlite"),
        "cookie_secret_file": str(folder / "cookie_secret"),
        "users": sorted(users),
        # This Python, not a `jupyterhub-singleuser` found on PATH (pyenv's shims read files
        # under /root a user cannot).
        "singleuser": [sys.executable, "-m", "jupyterhub.singleuser"],
        "singleuser_args": ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        "start_timeout": SERVER_START_TIMEOUT_S,
        "environment": {
            # The soba_nb under test, first (as tests/jupyter_support.py's servers have it).
            "PYTHONPATH": str(REPO_ROOT),
            **environment,
        },
    }
    config = folder / "jupyterhub_config.py"
    config.write_text(HUB_CONFIG.format(settings=json.dumps(settings)), encoding="utf-8")
    secrets_json = json.dumps({"service": service_token, "per_user": per_user, "team": dict(team)})
    env = {
        name: value for name, value in os.environ.items()
        if not name.startswith(("SOBA_", "JUPYTERHUB_", "JPY_")) and name != "PYTHONPATH"
    }
    # env_keep hands PATH to the users' servers: this Python's folder first, no pyenv shims.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(Path(chp).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    env["SOBA_HUB_TEST_SECRETS"] = secrets_json
    log = folder / "jupyterhub.log"
    hub = Hub(settings["bind_url"], service_token, folder, log)
    with log.open("wb") as output:
        process = subprocess.Popen(
            tied_to_this_process([sys.executable, "-m", "jupyterhub", "-f", str(config)]),
            cwd=folder, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True, umask=umask,
        )
    try:
        _wait_for_hub(process, hub)
        yield hub
    finally:
        _stop_hub(process, folder / "proxy.pid")


def _wait_for_hub(process: subprocess.Popen[bytes], hub: Hub) -> None:
    deadline = time.monotonic() + HUB_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"jupyterhub exited with {process.returncode}:\n{hub.log_tail()}")
        with contextlib.suppress(OSError):
            status, _ = _request(f"{hub.url}/hub/api/", hub.token)
            if status == 200:
                return
        time.sleep(POLL_INTERVAL_S)
    pytest.fail(f"jupyterhub is not ready after {HUB_START_TIMEOUT_S} s:\n{hub.log_tail()}")


def _stop_hub(process: subprocess.Popen[bytes], proxy_pid_file: Path) -> None:
    """SIGTERM: the hub stops the users' servers (cleanup_servers) and the proxy; then
    whatever of its own process group is left, and the proxy if it is still there."""
    proxy_pid = None
    with contextlib.suppress(OSError, ValueError):
        proxy_pid = int(proxy_pid_file.read_text().strip())
    stop_process_group(process, HUB_STOP_TIMEOUT_S)
    if proxy_pid is not None and CHP_NAME in _command_line(proxy_pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proxy_pid, signal.SIGKILL)


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# -- one user's server -----------------------------------------------------------------------


@dataclass
class UserServer:
    hub: Hub
    user: str
    url: str
    """`<proxy>/user/<name>`."""
    token: str
    """The user's own token: it reaches their server only."""

    def api(self, method: str, path: str, body: Any = None, expect: Iterable[int] = (200, 201)) -> Any:
        status, answer = _request(f"{self.url}/api{path}", self.token, method, body)
        if status not in set(expect):
            pytest.fail(f"{self.user}'s server {method} {path}: HTTP {status} {answer}\n{self.hub.log_tail()}")
        return answer

    def status_with(self, token: str, path: str = "/api/status") -> int:
        return _request(f"{self.url}{path}", token)[0]

    def write_notebook(self, path: str, sources: Iterable[str]) -> None:
        """Save a notebook of these code cells through the server (so the user owns it)."""
        cells = [
            {"cell_type": "code", "execution_count": None, "id": f"cell-{index}", "metadata": {},
             "outputs": [], "source": source}
            for index, source in enumerate(sources)
        ]
        content = {
            "cells": cells,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5,
        }
        self.api("PUT", f"/contents/{path}", {"type": "notebook", "format": "json", "content": content})

    @contextlib.contextmanager
    def notebook_kernel(self, path: str) -> Iterator[KernelChannels]:
        """A session for the notebook at `path` (its kernel knows its notebook: the server
        sets JPY_SESSION_NAME) and its channels; the session is deleted (the kernel shut
        down) on exit."""
        session = self.api(
            "POST", "/sessions",
            {"path": path, "name": Path(path).name, "type": "notebook", "kernel": {"name": "python3"}},
        )
        try:
            channels = KernelChannels.connect(self, session["kernel"]["id"])
            try:
                yield channels
            finally:
                channels.close()
        finally:
            self.api("DELETE", f"/sessions/{session['id']}", expect=(204, 404))


@dataclass
class Execution:
    """What one cell produced."""

    status: str = ""
    stdout: str = ""
    stderr: str = ""
    outputs: list[str] = field(default_factory=list)
    """Rich outputs (and their updates) in order, each as its Markdown, else plain text,
    else HTML."""
    error: str = ""

    @property
    def text(self) -> str:
        return "\n".join(filter(None, [self.stdout, self.stderr, *self.outputs, self.error]))


@dataclass
class KernelChannels:
    """A kernel's websocket (`/api/kernels/<id>/channels`, the JSON message format) through
    the proxy, with the user's token."""

    socket: Any
    session: str
    user: str

    @classmethod
    def connect(cls, server: UserServer, kernel_id: str) -> KernelChannels:
        import websocket

        session = uuid.uuid4().hex
        url = server.url.replace("http://", "ws://", 1) + f"/api/kernels/{kernel_id}/channels?session_id={session}"
        socket = websocket.create_connection(
            url, header=[f"Authorization: token {server.token}"], timeout=REQUEST_TIMEOUT_S
        )
        return cls(socket, session, server.user)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.socket.close()

    def execute(self, code: str, timeout_s: float = EXECUTE_TIMEOUT_S) -> Execution:
        """Run a cell; its outputs once the kernel is idle again and has replied."""
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id, "username": self.user, "session": self.session, "msg_type": "execute_request",
            "version": "5.3", "date": datetime.now(timezone.utc).isoformat(),
        }
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}
        self.socket.send(json.dumps(
            {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell", "buffers": []}
        ))
        result = Execution()
        idle = replied = False
        deadline = time.monotonic() + timeout_s
        while not (idle and replied):
            if time.monotonic() > deadline:
                pytest.fail(f"the cell {code!r} did not finish in {timeout_s} s; so far:\n{result.text}")
            self.socket.settimeout(max(0.1, deadline - time.monotonic()))
            frame = self.socket.recv()
            if not isinstance(frame, str):
                continue  # a binary frame (a comm's buffers): not a cell's output
            message = json.loads(frame)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, body = message["msg_type"], message["content"]
            if kind == "execute_reply":
                replied, result.status = True, body["status"]
            elif kind == "status":
                idle = body["execution_state"] == "idle"
            elif kind == "stream":
                setattr(result, body["name"], getattr(result, body["name"]) + body["text"])
            elif kind in ("display_data", "update_display_data", "execute_result"):
                data = body.get("data", {})
                shown = next((data[mime] for mime in ("text/markdown", "text/plain", "text/html") if mime in data), "")
                result.outputs.append(shown)
            elif kind == "error":
                result.error = f"{body['ename']}: {body['evalue']}"
        return result
