"""Local users for the team tests (SPEC §13), made and always removed, and this Python
reachable by them.

`team_accounts` makes a group and local users (`useradd`, homes in a folder of the test's,
members of the group) and always removes them: their processes are ended by process id first,
then `userdel --remove`, `groupdel`. `python_reachable_by` lets that group reach this Python
and the soba_nb under test where a folder on the way is closed to others (CI's and these
machines' Python is under /root, mode 0700): a POSIX ACL entry giving the group search
permission (x: pass through, not list) — and read, on a folder that is itself on the import
path — and nothing else, on those folders only, taken back afterwards: nobody else gains
anything, and nothing is installed or copied.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from jupyter_support import REPO_ROOT

ACCOUNT_TOOLS = ("useradd", "userdel", "groupadd", "groupdel")
ACL_ACCESS = "system.posix_acl_access"
ACL_VERSION = 2
ACL_USER_OBJ, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 0x01, 0x04, 0x08, 0x10, 0x20
ACL_GROUP_CLASS = (ACL_GROUP_OBJ, ACL_GROUP, 0x02)  # 0x02: a named user
ACL_NO_ID = 0xFFFFFFFF
ACL_SEARCH, ACL_READ = 1, 4
ACL_ENTRY = struct.Struct("<HHI")
"""Linux's POSIX ACL extended attribute: a little-endian version, then (tag, perm, id)."""


# -- accounts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    home: Path


@dataclass(frozen=True)
class Team:
    group: str
    gid: int
    accounts: dict[str, Account]
    """By the name the test gave (e.g. "alice"): the account's own name has a suffix."""


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def team_accounts(homes: Path, names: Iterable[str]) -> Iterator[Team]:
    """A group `soba-team-<random>` and one user per name (`<name>-<random>`: runs at the same
    time never meet), homes under `homes`, members of the group; on exit their processes are
    ended (by process id), then the users, their homes and the group are removed."""
    import grp
    import pwd

    suffix = secrets.token_hex(3)
    group = f"soba-team-{suffix}"
    made: list[str] = []
    _run("groupadd", group)
    try:
        for name in names:
            account = f"{name}-{suffix}"
            _run("useradd", "--create-home", "--home-dir", str(homes / account), "--groups", group,
                 "--shell", "/bin/bash", account)
            made.append(account)
        accounts = {}
        for account in made:
            entry = pwd.getpwnam(account)
            accounts[account.removesuffix(f"-{suffix}")] = Account(account, entry.pw_uid, Path(entry.pw_dir))
        yield Team(group, grp.getgrnam(group).gr_gid, accounts)
    finally:
        for account in made:
            end_processes_of(pwd.getpwnam(account).pw_uid)
            subprocess.run(["userdel", "--remove", account], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


def processes_of(uid: int) -> list[int]:
    """The ids of the processes running as `uid` (real user id)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    if int(line.split()[1]) == uid:
                        found.append(int(entry.name))
                    break
    return found


def end_processes_of(uid: int) -> None:
    """Kill every process of a user the test made (its servers and kernels, if the hub left
    any), by process id."""
    for _attempt in range(20):
        pids = processes_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


# -- the interpreter, reachable by the team --------------------------------------------------

AclEntry = tuple[int, int, int]
"""(tag, permissions, id) of one POSIX ACL entry."""


def folders_closed_to_others(paths: Iterable[Path]) -> list[Path]:
    """The folders on the way to `paths` (each included) that others may not search."""
    closed: dict[Path, None] = {}
    for path in paths:
        for folder in [*reversed(path.resolve().parents), path.resolve()]:
            if folder.is_dir() and not folder.stat().st_mode & stat.S_IXOTH:
                closed[folder] = None
    return list(closed)


def _acl(folder: Path) -> list[AclEntry]:
    """The folder's access ACL without its mask: the extended attribute's entries, or the
    three its mode bits make."""
    try:
        data = os.getxattr(folder, ACL_ACCESS)
    except OSError:
        mode = folder.stat().st_mode
        return [
            (ACL_USER_OBJ, (mode >> 6) & 7, ACL_NO_ID),
            (ACL_GROUP_OBJ, (mode >> 3) & 7, ACL_NO_ID),
            (ACL_OTHER, mode & 7, ACL_NO_ID),
        ]
    return [(tag, perm, id_) for tag, perm, id_ in ACL_ENTRY.iter_unpack(data[4:]) if tag != ACL_MASK]


def _set_acl(folder: Path, entries: list[AclEntry]) -> None:
    """Write `entries` (no mask: it is computed): as mode bits alone when they are only the
    owner, group and others, else as the extended attribute."""
    perms = {tag: perm for tag, perm, _id in entries}
    if set(perms) == {ACL_USER_OBJ, ACL_GROUP_OBJ, ACL_OTHER}:
        with contextlib.suppress(OSError):
            os.removexattr(folder, ACL_ACCESS)
        special = stat.S_IMODE(folder.stat().st_mode) & ~0o777
        os.chmod(folder, special | perms[ACL_USER_OBJ] << 6 | perms[ACL_GROUP_OBJ] << 3 | perms[ACL_OTHER])
        return
    mask = 0
    for tag, perm, _id in entries:
        if tag in ACL_GROUP_CLASS:
            mask |= perm
    ordered = sorted([*entries, (ACL_MASK, mask, ACL_NO_ID)], key=lambda entry: (entry[0], entry[2]))
    os.setxattr(folder, ACL_ACCESS, struct.pack("<I", ACL_VERSION) + b"".join(ACL_ENTRY.pack(*e) for e in ordered))


def fresh_python_path() -> list[Path]:
    """The folders a new interpreter of this Python imports from (the standard library,
    site-packages, what their .pth files add) with the soba_nb under test first, as the
    users' servers and kernels have them; not this test run's own additions."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    shown = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
        env=env, cwd="/", capture_output=True, text=True, check=True,
    )
    return [Path(entry) for entry in json.loads(shown.stdout) if entry and Path(entry).is_dir()]


@contextlib.contextmanager
def python_reachable_by(gid: int) -> Iterator[list[Path]]:
    """Let members of `gid` search (x: pass through, not list) the folders closed to others
    on the way to this Python, its packages and the soba_nb under test, and read (list) the
    ones that are import path entries themselves (Python lists a path entry to find a module
    in it: a clone in `mktemp -d`, mode 0700, was searchable and still imported nothing): one
    ACL entry for the group on each; on exit that entry, and only it, is taken away again
    (another run's stays). Yields the folders. Skips the test where the file system has no ACLs."""
    import_path = [REPO_ROOT, *fresh_python_path()]
    entries = {path.resolve() for path in import_path}
    granted: list[tuple[Path, AclEntry]] = []
    try:
        for folder in folders_closed_to_others([Path(sys.executable).parent, *import_path]):
            ours = (ACL_GROUP, ACL_SEARCH | (ACL_READ if folder in entries else 0), gid)
            try:
                _set_acl(folder, [*_acl(folder), ours])
            except OSError as exc:
                pytest.skip(f"the test's users cannot reach this Python ({folder} is closed to others) and ACLs fail there: {exc}")
            granted.append((folder, ours))
        yield [folder for folder, _ in granted]
    finally:
        for folder, ours in granted:
            _set_acl(folder, [entry for entry in _acl(folder) if entry != ours])
