"""The reaper: a small process between the `shell` tool and the command, so nothing outlives a call.

The tool starts `python -I -S reaper.py <tool pid> <command>`; this program then

1. makes itself a *child subreaper* (`prctl(PR_SET_CHILD_SUBREAPER)`): a process the command
   starts that escapes its session and process group (`setsid`, `(cmd &)`, `nohup … &`,
   `setsid -f`) is re-parented to the reaper when its parent exits, never to init;
2. asks for `SIGTERM` when the tool's process dies (`PR_SET_PDEATHSIG`), so a crashed kernel
   cannot leave the command running, and checks that its parent is still the tool;
3. runs `/bin/sh -c <command>` in a process group of its own, with stdin, stdout and stderr as
   the tool set them, and waits for it, reaping orphans as they arrive;
4. when the shell exits, or on `SIGTERM` from the tool (timeout, cancel, output limit,
   KeyboardInterrupt), kills what is left with `SIGKILL` (cannot be trapped): the shell's
   process group, then its direct children listed in `/proc/<pid>/task/<pid>/children` (or
   the `/proc/*/stat` parent fields), repeatedly, since killing a child re-parents its own
   children to the reaper; when it has no children it has no descendants;
5. exits with the shell's status: the same exit code, or killed by the same signal (so
   `Popen.returncode` is what running the shell directly would give).

Why a separate process: the notebook kernel must not become a subreaper (it belongs to the
user, and would inherit every stray process), and a forked copy of the multi-threaded kernel
cannot safely run Python. Why Python: prctl needs a system call that `/bin/sh` cannot make.
Why not a cgroup: a writable, delegated cgroup v2 is rare for a Jupyter kernel, and a PID
namespace needs privileges; the subreaper works for any unprivileged Linux process.
`-I -S` keeps start-up at about 10 ms: no site packages, and no project file (the working
directory is the project folder) can shadow a standard module. Only the built-in `_ctypes`
and `_signal` are imported (`ctypes` and `signal` would add 4 and 2 ms).

Elsewhere (no prctl, no /proc) the reaper still kills the shell's process group, as before.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # importing typing or collections.abc would cost 2 ms at start-up
if TYPE_CHECKING:
    from collections.abc import Callable

    Prctl = Callable[[int, int, int, int, int], int]

try:
    import _signal as signal  # the built-in half of `signal`, without its enum import
except ImportError:  # pragma: no cover - another Python implementation
    import signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
RTLD_NOW = 2
SHELL = "/bin/sh"
CANNOT_START_EXIT_CODE = 127
"""What a shell reports for a command it cannot run; used when `/bin/sh` cannot start."""
STOPPED_EXIT_CODE = 128 + 15
"""Our exit code when stopped by the tool (which then reports why it stopped us)."""
RESET_IN_COMMAND = ("SIGPIPE", "SIGXFSZ")
"""Signals Python ignores at start-up; the command gets their defaults (`yes | head` relies on SIGPIPE)."""


class Stop(Exception):
    """Raised by the SIGTERM handler: the tool asked us to stop the command."""


def _on_stop(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one Stop only: cleanup must not be cut short
    raise Stop


def _load_prctl() -> Prctl | None:
    """libc's prctl, or None (not Linux).

    Built from `_ctypes` the way `ctypes.CDLL` builds its functions: importing `ctypes` itself
    costs about 4 ms, a third of the reaper's start-up. The public route is the fallback.
    """
    try:
        import _ctypes

        class Int(_ctypes._SimpleCData[int]):
            _type_ = "i"

        class Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = Int

        class Library:
            _handle = _ctypes.dlopen(None, RTLD_NOW)  # type: ignore[arg-type]  # the program

        return Function(("prctl", Library()))  # type: ignore[arg-type]  # CDLL duck type
    except (ImportError, AttributeError, TypeError, OSError):
        pass
    try:
        import ctypes

        return ctypes.CDLL(None).prctl
    except (ImportError, AttributeError, OSError):
        return None


def _set(prctl: Prctl | None, option: int, value: int) -> None:
    if prctl is not None:
        prctl(option, value, 0, 0, 0)


def _children() -> list[int] | None:
    """The reaper's direct children (zombies included), or None without /proc."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as listing:
            return [int(pid) for pid in listing.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: read the parent fields
        pass
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    children = []
    for name in names:
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()  # the name may hold spaces
            parent = int(fields[1])
        except (OSError, IndexError, ValueError):  # exited meanwhile
            continue
        if parent == me:
            children.append(int(name))
    return children


def _kill(kill: Callable[[int, int], None], target: int) -> None:
    """SIGKILL a process or a process group that may be gone already."""
    try:  # noqa: SIM105 - contextlib.suppress would add 4 ms to every command's start-up
        kill(target, signal.SIGKILL)
    except OSError:
        pass


def _reap(pid: int) -> None:
    try:  # noqa: SIM105 - as in _kill
        os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already
        pass


def _kill_descendants(shell: int) -> None:
    """SIGKILL every process the command started, and reap them all."""
    _kill(os.killpg, shell)
    while children := _children():
        for pid in children:
            _kill(os.kill, pid)
        for pid in children:  # once a child is reaped, its own children are ours
            _reap(pid)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:  # without /proc: whatever is left to reap
            pass
    except ChildProcessError:
        pass


def _wait_for(shell: int) -> int:
    """Wait for the shell, reaping orphans that exit meanwhile; return its wait status."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == shell:
            return status


def _exit_like(status: int | None, prctl: Prctl | None) -> None:
    if status is None:
        os._exit(STOPPED_EXIT_CODE)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    _set(prctl, PR_SET_DUMPABLE, 0)  # re-raising SIGSEGV or SIGABRT must not write a core file
    if -code != signal.SIGKILL:  # the one terminating signal without a handler to reset
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    os._exit(128 - code)  # only if the signal did not end us


def main(tool_pid: int, command: str) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # no stop before we can clean up
    signal.signal(signal.SIGTERM, _on_stop)
    prctl = _load_prctl()
    _set(prctl, PR_SET_CHILD_SUBREAPER, 1)
    _set(prctl, PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != tool_pid:  # the tool died before PR_SET_PDEATHSIG was in place
        os._exit(STOPPED_EXIT_CODE)
    try:
        shell = os.posix_spawn(
            SHELL,
            [SHELL, "-c", command],
            os.environ,
            setpgroup=0,
            setsigmask=(),
            setsigdef=[getattr(signal, name) for name in RESET_IN_COMMAND],
        )
    except OSError as error:
        os.write(2, f"cannot start {SHELL}: {error}\n".encode())
        os._exit(CANNOT_START_EXIT_CODE)
    status = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        status = _wait_for(shell)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except Stop:
        pass
    _kill_descendants(shell)
    _exit_like(status, prctl)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
