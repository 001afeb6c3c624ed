"""SPEC §13 on a real JupyterHub (issue 27): two users, one gateway, a signed handoff.

A real `jupyterhub` (PyPI) behind a real `configurable-http-proxy` (npm) on 127.0.0.1, with
LocalProcessSpawner: the test makes two local users, alice and bob (`useradd`, homes in a
folder of the test's, members of a new team group), and the hub runs each one's single-user
server, and so their kernels, as that user. Nothing of the machine is changed for good: the
users, their homes and the group are removed afterwards, and every process is ended (the hub
stops the servers and the proxy; whatever is left of the users' is killed by process id).

The users' kernels must run this Python, which lives under /root (mode 0700) here and in CI:
for the length of the test the team's group is given search permission (x: pass through, not
list) on the folders closed to others on the way to it and to the soba_nb under test — one
POSIX ACL entry each, nothing else changed, taken back afterwards
(`local_users.python_reachable_by`). No interpreter is copied or installed for them.

As docs/teams.md tells an admin: the single-user environment reads the admin's configuration
(SOBA_SYSTEM_CONFIG, set by the spawner, points at the file the test writes — the machine's
/etc/soba is not touched) naming the gateway (a loopback LLM server) and the variable that
holds each user's key; the spawner hands alice and bob their own gateway key and the team's
capsule key, from the hub's environment, never from a file.

The scenario, each step through the user's own server (a session for a notebook in their
home, its kernel driven over the websocket with the user's token):

- alice's notebook: `%load_ext soba_nb`, `!soba-nb doctor` (the provider from the admin's
  file, the key variable set, capsules signed), `%soba …` (each request carries alice's key),
  `%compact`, `%capsule export` into the shared folder (setgid, the team's group);
- the shared file: signed (`hmac`), `author` alice@<host>, the team's group, the hub's umask;
- bob's notebook: `%capsule load` of it says `signed`; his next `%soba` request carries its
  content and his own key; a copy an attacker edited (a word of the body changed, `sha256`
  computed again) is refused in one line;
- alice's transcripts are in her home, next to her notebook, hers, 0600; bob's home has none
  of hers; no key is in any file under the homes, the shared folder, the hub's folder or the
  admin's configuration.

Skipped, with the reason, without root, `useradd`, `jupyterhub` or `configurable-http-proxy`
(`.ci/run` installs both).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import socket
import stat
import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from compaction_support import good_summary
from hub_support import Execution, Hub, KernelChannels, jupyterhub, require_hub
from llm_server import OPENAI_PATH, LLMServer, RecordedRequest, Reply, text
from local_users import Account, Team, python_reachable_by, team_accounts

from soba_nb.capsule_files.file import read_capsule_file

pytestmark = pytest.mark.timeout(240)

KEY_VARIABLE = "TEAM_LLM_KEY"
"""The variable the admin's configuration names (`apiKeyEnv`); the spawner sets it per user."""
HUB_UMASK = 0o027
"""The hub's, and so the servers' and kernels': capsules readable by the team, nobody else."""
HANDOFF_GOAL = "Predict churn for the Q3 cohort; threshold 0.42 agreed with finance."
LONG_ANSWER = "The churn table has many columns worth describing. " * 40
"""About 400 tokens: six such turns leave something for `%compact` under the limits below
(tests/capsule_files/test_load.py), and stay under its soft limit."""
PARTS = range(1, 7)
ADMIN_CONFIG = {
    "model": {
        "provider": "openai",
        "name": "team-gpt",
        "apiKeyEnv": KEY_VARIABLE,
        "contextWindow": 6000,
        "maxOutputTokens": 500,
    },
    "compaction": {
        "minTokensForAutoCompact": 1500,
        "minReclaimableTokens": 500,
        "keepRecentTokens": 1000,
        "safetyReserveTokens": 500,
        "timeoutMs": 20000,
    },
}


class Gateway:
    """The team's model gateway: answers from a queue, summaries apart (requests say which)."""

    def __init__(self, server: LLMServer):
        self.server = server
        self.answers: deque[Reply] = deque()
        server.default_reply = self  # type: ignore[assignment]  # the server accepts callables

    def __call__(self, request: RecordedRequest) -> Reply:
        if request.operation == "compaction":
            return text(good_summary(HANDOFF_GOAL))
        return self.answers.popleft() if self.answers else text("ok")


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    with LLMServer() as server:
        yield Gateway(server)


@pytest.fixture
def place() -> Iterator[Path]:
    """The test's folder, outside pytest's own (0700): the users' homes, the shared folder,
    the admin's configuration and the hub's state."""
    folder = Path(tempfile.mkdtemp(prefix="soba-hub-"))
    folder.chmod(0o755)
    (folder / "home").mkdir(mode=0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def team(place: Path) -> Iterator[Team]:
    require_hub()
    with team_accounts(place / "home", ["alice", "bob"]) as made, python_reachable_by(made.gid):
        yield made


@pytest.fixture
def keys(team: Team) -> dict[str, str]:
    """Each user's gateway key, and the team's capsule key."""
    return {
        **{name: f"sk-{name}-{secrets.token_hex(16)}" for name in team.accounts},
        "team": secrets.token_hex(32),
    }


@pytest.fixture
def shared(place: Path, team: Team) -> Path:
    """The team's handoff folder: the team's group, setgid, no one else."""
    folder = place / "shared"
    folder.mkdir()
    shutil.chown(folder, group=team.gid)
    folder.chmod(0o2770)
    return folder


@pytest.fixture
def hub(place: Path, team: Team, keys: dict[str, str], gateway: Gateway) -> Iterator[Hub]:
    config = place / "etc-soba" / "config.json"
    config.parent.mkdir(mode=0o755)
    model = {**ADMIN_CONFIG["model"], "baseUrl": gateway.server.url}
    config.write_text(json.dumps({**ADMIN_CONFIG, "model": model}, indent=2), encoding="utf-8")
    config.chmod(0o644)
    with jupyterhub(
        place / "hub",
        chp=require_hub(),
        users=[account.name for account in team.accounts.values()],
        environment={"SOBA_SYSTEM_CONFIG": str(config)},
        per_user={KEY_VARIABLE: {account.name: keys[name] for name, account in team.accounts.items()}},
        team={"SOBA_CAPSULE_KEY": keys["team"]},
        umask=HUB_UMASK,
    ) as running:
        yield running


def run(kernel: KernelChannels, code: str) -> str:
    """Run a cell that must succeed; its text."""
    result = kernel.execute(code)
    assert result.status == "ok" and not result.error, f"{code!r} failed:\n{result.text}"
    return result.text


def authorizations(requests: list[RecordedRequest]) -> set[str | None]:
    return {request.headers.get("authorization") for request in requests}


def tamper(original: Path, copy: Path) -> None:
    """What an attacker without the team key can do: change a word of the body and compute
    `sha256` again over what it covers (every byte but the sha256 and hmac lines)."""
    edited = original.read_text(encoding="utf-8").replace("threshold 0.42", "threshold 0.24")
    assert edited != original.read_text(encoding="utf-8")
    covered = re.sub(r"^(sha256|hmac): .*\n", "", edited, count=2, flags=re.MULTILINE)
    edited = re.sub(
        r"^sha256: .*$", f'sha256: "{hashlib.sha256(covered.encode()).hexdigest()}"', edited, count=1, flags=re.MULTILINE
    )
    copy.write_text(edited, encoding="utf-8")
    shutil.chown(copy, group=original.stat().st_gid)
    copy.chmod(0o640)


def files_holding(root: Path, secret: str) -> list[Path]:
    needle = secret.encode()
    return [path for path in root.rglob("*") if path.is_file() and not path.is_symlink() and needle in path.read_bytes()]


def alice_hands_over(hub: Hub, alice: Account, gateway: Gateway, handoff: Path) -> list[str]:
    """alice's notebook, in her home, run through her server: soba's settings as her server
    sees them, six turns, `%compact`, the capsule exported to the shared folder. The cells'
    text."""
    server = hub.start_server(alice.name)
    cells = [
        "%load_ext soba_nb",
        "!soba-nb doctor",
        "%auto_compact off",
        *(f"%soba describe part {part} of the churn table" for part in PARTS),
        "%compact",
    ]
    server.write_notebook("churn.ipynb", cells)
    gateway.answers.extend(text(f"Part {part}. {LONG_ANSWER}") for part in PARTS)
    with server.notebook_kernel("churn.ipynb") as kernel:
        outputs = [run(kernel, cell) for cell in cells]
        compacted = re.search(r"^Compacted \(user\) · .* · (ck_[0-9a-f]{8})$", outputs[-1], re.MULTILINE)
        assert compacted, outputs[-1]
        outputs.append(run(kernel, f"%capsule export {compacted.group(1)} {handoff}"))
    assert outputs[-1].strip() == f"exported {compacted.group(1)} to {handoff}"
    return outputs


def bob_takes_over(hub: Hub, bob: Account, handoff: Path, tampered: Path) -> tuple[str, Execution]:
    """bob's notebook: load the handoff, ask on from it, then try the tampered copy. The
    load's text and the refused cell."""
    server = hub.start_server(bob.name)
    cells = ["%load_ext soba_nb", f"%capsule load {handoff}", "%soba carry on from alice's handoff"]
    server.write_notebook("review.ipynb", cells)
    with server.notebook_kernel("review.ipynb") as kernel:
        loaded = [run(kernel, cell) for cell in cells][1]
        refused = kernel.execute(f"%capsule load {tampered}")
    return loaded, refused


def test_a_signed_handoff_between_two_users_of_one_hub(
    hub: Hub, team: Team, keys: dict[str, str], gateway: Gateway, shared: Path, place: Path
) -> None:
    alice, bob = team.accounts["alice"], team.accounts["bob"]
    handoff, tampered = shared / "churn-handoff.capsule.md", shared / "churn-handoff-edited.capsule.md"

    outputs = alice_hands_over(hub, alice, gateway, handoff)
    doctor = outputs[1]
    assert f"provider   openai · provider 'openai' from {place / 'etc-soba' / 'config.json'}" in doctor, doctor
    assert f"api key    {KEY_VARIABLE} set" in doctor and "capsules   signed with the team key" in doctor, doctor
    alice_requests = list(gateway.server.requests)
    asked = [request.operation for request in alice_requests if request.path == OPENAI_PATH]
    assert asked == ["inference"] * len(PARTS) + ["compaction"]
    assert authorizations(alice_requests) == {f"Bearer {keys['alice']}"}  # her key, from her spawner

    # The shared file: signed with the team key, by alice, in the team's group, mode by umask.
    signed = read_capsule_file(handoff, key=keys["team"].encode())
    assert signed.metadata.author == f"{alice.name}@{socket.gethostname()}"
    assert HANDOFF_GOAL in signed.body and "\nhmac: " in handoff.read_text(encoding="utf-8")
    info = handoff.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (alice.uid, team.gid, 0o666 & ~HUB_UMASK)
    tamper(handoff, tampered)
    assert "threshold 0.24" in read_capsule_file(tampered).body  # whole, as far as sha256 can tell

    gateway.answers.append(text("Carrying on."))
    loaded, refused = bob_takes_over(hub, bob, handoff, tampered)
    assert re.match(
        rf"loaded '[^']+' from {re.escape(str(handoff))} as ck_[0-9a-f]{{8}} "
        r"\([\d,]+ tokens · quality full · signed\); the next turn starts from it$",
        loaded.splitlines()[0],
    ), loaded
    assert refused.status == "error" and refused.stdout == "" and refused.outputs == [], refused
    assert refused.stderr == (
        f"UsageError: %capsule load: {tampered}: hmac mismatch: not signed with this SOBA_CAPSULE_KEY, "
        "or edited after export; --untrusted reads it as unverified data\n"
    )
    bob_requests = gateway.server.requests[len(alice_requests) :]
    assert authorizations(bob_requests) == {f"Bearer {keys['bob']}"}
    [carry_on] = [request for request in bob_requests if request.operation == "inference"]
    sent = json.dumps(carry_on["messages"])
    assert HANDOFF_GOAL in sent and "threshold 0.24" not in sent

    # Transcripts: alice's next to her notebook, hers and private; none of hers in bob's home.
    alice_sessions = alice.home / "churn.soba"
    assert list(alice_sessions.glob("*.jsonl")), sorted(alice.home.rglob("*"))
    for path in alice_sessions.iterdir():
        info = path.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (alice.uid, 0o600), path
    assert sorted(path.name for path in bob.home.glob("*.soba")) == ["review.soba"]
    assert all(path.stat().st_uid == bob.uid for path in bob.home.rglob("*"))
    for path in (bob.home / "review.soba").glob("*.jsonl"):
        # The handoff, not her session: her answers are not there (her requests are, quoted
        # verbatim in the capsule she handed over: SPEC §14).
        assert LONG_ANSWER not in path.read_text(encoding="utf-8")

    # The keys were in the environment only.
    for name, key in keys.items():
        assert files_holding(place, key) == [], f"{name}'s key is in a file"
