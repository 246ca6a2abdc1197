"""Real browser checks: Netron renders a served graph; JupyterLab opens the welcome notebook.

Headless Debian chromium through chromedriver. Where ORTLAB_REQUIRE_BROWSER=1
(as .ci/run sets) a missing browser fails these tests instead of skipping them.
"""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from conftest import ROOT, browser_or_skip
from ortlab import viz

ARTIFACTS = ROOT / "artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900"]


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = browser_or_skip()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


def wait_for(predicate, timeout=60, what="the page"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def screenshot(driver, name):
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / name))


def test_netron_renders_the_graph(browser):
    nodes = [helper.make_node("MatMul", ["X", "W"], ["H"], name="proj_matmul"),
             helper.make_node("Relu", ["H"], ["Y"], name="act_relu")]
    graph = helper.make_graph(nodes, "browser_check",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12)])
    view = viz.show(helper.make_model(graph))
    try:
        browser.get(view.url)
        accept = "const b = document.getElementById('message-button'); " \
                 "if (b && b.offsetParent !== null && b.innerText === 'Accept') { b.click(); return true; }"
        browser.execute_script(accept)  # Netron's first-visit consent screen, if shown
        svg_text = "return Array.from(document.querySelectorAll('svg text')).map(t => t.textContent)"

        def drawn():
            browser.execute_script(accept)
            labels = browser.execute_script(svg_text)
            return labels if "Relu" in labels else None
        labels = wait_for(drawn, what="Netron to draw the graph")
        ids = browser.execute_script(
            "return Array.from(document.querySelectorAll('svg [id]')).map(e => e.id).join(' ')")
        screenshot(browser, "netron.png")
    finally:
        view.stop()
    assert {"MatMul", "Relu", "X", "Y"} <= set(labels), labels
    assert "proj_matmul" in ids and "act_relu" in ids, ids


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab on 127.0.0.1 with a token, serving a copy of notebooks/ (never the originals)."""
    root = tmp_path / "root"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    log = open(tmp_path / "jupyter.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).status == 200
        except OSError:
            return proc.poll() is not None and pytest.fail((tmp_path / "jupyter.log").read_text())
    try:
        wait_for(up, timeout=90, what="JupyterLab to start")
        yield base, token
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_jupyterlab_opens_the_welcome_notebook(browser, jupyterlab):
    import nbformat

    base, token = jupyterlab
    nb = nbformat.read(ROOT / "notebooks" / "00_welcome.ipynb", as_version=4)
    first = next(c.source for c in nb.cells if c.cell_type == "markdown")
    heading = next(l for l in first.splitlines() if l.startswith("# "))[2:].strip()
    browser.get(f"{base}/lab/tree/notebooks/00_welcome.ipynb?token={token}")
    script = ("return Array.from(document.querySelectorAll('.jp-RenderedMarkdown h1'))"
              ".filter(h => h.offsetParent !== null).map(h => h.textContent)")
    shown = wait_for(lambda: browser.execute_script(script), timeout=120,
                     what="the notebook's first heading")
    screenshot(browser, "jupyterlab.png")
    assert any(h.replace("¶", "").strip() == heading for h in shown), shown
