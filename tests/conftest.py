import os
import shutil
import sys

import pytest

from repo_paths import FIXTURES, ROOT, TESTS  # noqa: F401 (FIXTURES: also imported from here)

# Each folder of tests/ on sys.path, as tests/ itself is (pytest puts it there for this file): a test imports the
# helpers beside this file, and what another test module shares (test_engine's ZOO, test_browser's fixtures), by
# bare name, from any folder. That is why no two test files anywhere under tests/ may share a name.
for _folder in sorted({p.parent for p in TESTS.glob("*/test_*.py")}):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))


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
