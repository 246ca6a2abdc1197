"""The tests' own process helpers (tests/processes.py): a group that ignores SIGTERM is killed,
children started elsewhere are not counted."""
import subprocess
import sys

from processes import children, group_alive, stop_group


def test_a_group_that_ignores_sigterm_is_killed_with_its_grandchild():
    # a shell ignoring SIGTERM, with a grandchild that ignores it too: JupyterLab and its kernels
    script = "trap '' TERM; (trap '' TERM; sleep 300) & sleep 300"
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        assert group_alive(proc.pid, timeout=0)
        stop_group(proc, grace=0.5)
        assert proc.returncode is not None
        assert not group_alive(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_children_sees_what_this_process_started_and_excludes_the_rest():
    before = children()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert children(exclude=before) == {proc.pid}
        assert children(exclude=before | {proc.pid}) == set()
    finally:
        proc.kill()
        proc.wait()
    assert children(exclude=before) == set()
