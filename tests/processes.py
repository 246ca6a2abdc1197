"""Stopping what a test started, for certain, and looking only at what it started.

A server a test starts (JupyterLab, TensorBoard) runs in a session of its own; `stop_group`
asks the whole group to stop, waits, then kills it. "Nothing is left" checks compare this
process's children against a snapshot taken before, so another test's leftover never fails them.
"""
import os
import signal
import subprocess
import time


def stop_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the process group of `proc` (started with start_new_session=True), SIGKILL it
    after `grace` seconds, and reap `proc`. Never raises for a group that is already gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if not group_alive(proc.pid, timeout=wait):
            return
    raise AssertionError(f"process group {proc.pid} survived SIGKILL")


def group_alive(pgid: int, timeout: float = 0.0) -> bool:
    """Whether a process of group `pgid` still runs (zombies do not count), waiting up to
    `timeout` s for the group to end."""
    deadline = time.monotonic() + timeout
    while any(state != "Z" for state in _group_states(pgid)):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)
    return False


def _stats():
    """(pid, fields after the command name) of every process readable in /proc."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    yield int(entry), f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue


def _group_states(pgid):
    return [fields[0] for _, fields in _stats() if int(fields[2]) == pgid]


def children(exclude=()) -> set:
    """Process ids whose parent is this process (zombies included), minus `exclude`."""
    return {pid for pid, fields in _stats() if int(fields[1]) == os.getpid()} - set(exclude)
