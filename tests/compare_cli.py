"""`python -m ortlab compare` as the tests run it: in its own process, stopped after two minutes."""
import subprocess
import sys


def cli(*args):
    """The finished CLI run (exit code, stdout, stderr) of `python -m ortlab compare ARGS`."""
    return subprocess.run([sys.executable, "-m", "ortlab", "compare", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def one_line_exit_2(done):
    """Bad input: exit 2 and one line on stderr, no traceback; returns that line."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr
