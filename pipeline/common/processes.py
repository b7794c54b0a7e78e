"""Is the process that left something behind still running? (stale temp folders, RUNNING MLflow runs)

A process killed with SIGKILL (or by the OOM killer, or a lost machine) runs no cleanup: its
`.partial-<pid>` folders stay and its MLflow run stays RUNNING. A later stage cleans up after it,
but only after proving it dead: a pid alone may have been reused, so a run records the process's
identity — boot id, pid and the kernel's start time of the process — and it is dead when that
identity no longer matches a live process.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def host_name() -> str:
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """True unless no process has this pid (a reused pid counts as alive: never clean up wrongly)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _start_ticks(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None off Linux or if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count fields after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return "unknown-boot"


def process_identity(pid: int | None = None) -> str:
    """`<boot id>:<pid>:<start ticks>` of `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}:{pid}:{_start_ticks(pid) or 'unknown'}"


def identity_alive(identity: str) -> bool:
    """False only when the process named by `identity` (from `process_identity`) is surely gone."""
    try:
        boot, pid_text, ticks = identity.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return True  # not ours to judge
    if boot != _boot_id() and boot != "unknown-boot":
        return False  # the machine rebooted since: every process of that boot is gone
    if not pid_alive(pid):
        return False
    current = _start_ticks(pid)
    return current is None or ticks == "unknown" or current == ticks
