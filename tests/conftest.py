import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def run_cli():
    """Run `python -m <module> args...` in the repo root; returns CompletedProcess."""
    import subprocess

    def run(module, *args, cwd=ROOT, timeout=300):
        return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
    return run


def browser_or_skip():
    """Path of chromium and chromedriver; a failure (not a skip) where ORTLAB_REQUIRE_BROWSER=1."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    message = "Debian's chromium and chromium-driver are needed (apt-get install chromium chromium-driver)"
    if os.environ.get("ORTLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module", autouse=True)
def _no_cuda_worker_left():
    """ortlab.cuda's CPU runner keeps one worker process for its timed launches, for the life of the process
    that started it. Stopped after each test module, so that no module finds another's child process (the
    launcher tests check that nothing is left running)."""
    yield
    cpu = sys.modules.get("ortlab.cuda.cpu")
    if cpu is not None:
        cpu.stop_worker()
