"""TensorBoard: train(log_dir=...) logs what it returns; `make tensorboard` shows it on 127.0.0.1.

References: the losses a plain torch loop computes, lr schedules by arithmetic, TensorBoard's own
event reader, ORT 1.19.2's SummaryScalar kernel (the same Summary proto, byte for byte), and the
page TensorBoard serves, opened in headless Chromium (the fixtures of test_browser.py).
"""
import os
import struct
import subprocess
import urllib.request

import numpy as np
import psutil
import pytest
import torch

from repo_paths import ROOT
from processes import stop_group
from ortlab.training import tensorboard, train
from ortlab.training.tensorboard import (GRAD_NORM, LOSS, LR, TensorBoardError, log_run, open_writer,
                                         plot_scalars, read_scalars)
from test_browser import browser, free_port, screenshot, wait_for  # noqa: F401 (fixture)

STEPS = 6


def tiny_run(seed=0):
    """A linear regression the loop trains (the model returns its loss) and its batches."""
    torch.manual_seed(seed)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    return torch.nn.Linear(4, 1), [(x[:8], y[:8]), (x[8:], y[8:])]


def mse(model):
    return lambda x, y: torch.nn.functional.mse_loss(model(x), y)


def plain_torch_losses(seed=0, lr=0.1):
    """The same run as a textbook loop: zero_grad, forward, backward, step."""
    model, batches = tiny_run(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(STEPS):
        x, y = batches[step % len(batches)]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def trained(log_dir, **kwargs):
    model, batches = tiny_run()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return train(mse(model), batches, opt, STEPS, progress=False, log_dir=log_dir, **kwargs)


def values(points):
    return [v for _, v in points]


def test_logged_curves_read_back_equal_what_train_returned(tmp_path):
    history = trained(tmp_path / "run")
    scalars = read_scalars(tmp_path / "run")
    assert sorted(scalars) == [GRAD_NORM, LOSS, LR]
    assert [s for s, _ in scalars[LOSS]] == list(range(STEPS))
    # event files hold float32 (Summary.Value.simple_value): exactly float32 of each value
    np.testing.assert_array_equal(values(scalars[LOSS]), np.float32(history.losses))
    np.testing.assert_array_equal(values(scalars[GRAD_NORM]), np.float32(history.grad_norms))
    np.testing.assert_array_equal(values(scalars[LR]), np.float32([0.1] * STEPS))
    np.testing.assert_allclose(values(scalars[LOSS]), plain_torch_losses(), rtol=1e-6)


def test_logging_is_off_by_default_and_changes_no_result(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    quiet, logged = trained(None), trained(tmp_path / "run")
    assert os.listdir(tmp_path) == ["run"]  # the quiet run wrote nothing anywhere
    assert quiet.losses == logged.losses and quiet.grad_norms == logged.grad_norms


def test_the_logged_lr_is_the_one_each_step_used(tmp_path):
    model, batches = tiny_run()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(mse(model), batches, opt, STEPS, progress=False, log_dir=tmp_path,
          on_step=lambda step, history: schedule.step())
    expected = [0.1 * 0.5 ** (step // 2) for step in range(STEPS)]
    np.testing.assert_array_equal(values(read_scalars(tmp_path)[LR]), np.float32(expected))


def test_one_lr_curve_per_param_group(tmp_path):
    model, batches = tiny_run()
    opt = torch.optim.SGD([{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.01}])
    train(mse(model), batches, opt, 2, progress=False, log_dir=tmp_path)
    scalars = read_scalars(tmp_path)
    assert values(scalars[f"{LR}/group0"]) == pytest.approx([0.1, 0.1])
    assert values(scalars[f"{LR}/group1"]) == pytest.approx([0.01, 0.01])


def test_a_rerun_into_the_same_folder_replaces_the_first(tmp_path):
    first = trained(tmp_path)
    model, batches = tiny_run(seed=1)
    second = train(mse(model), batches, torch.optim.SGD(model.parameters(), lr=0.1), 3, progress=False,
                   log_dir=tmp_path)
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    np.testing.assert_array_equal(values(read_scalars(tmp_path)[LOSS]), np.float32(second.losses))
    assert first.losses[:3] != second.losses


def test_log_run_writes_a_finished_history(tmp_path):
    history = trained(None)
    lrs = [0.1 / (1 + step) for step in range(STEPS)]
    log_run(history, tmp_path, lrs=lrs)
    scalars = read_scalars(tmp_path)
    np.testing.assert_array_equal(values(scalars[LOSS]), np.float32(history.losses))
    np.testing.assert_array_equal(values(scalars[LR]), np.float32(lrs))
    with pytest.raises(TensorBoardError, match="one per step"):
        log_run(history, tmp_path, lrs=lrs[:2])


def test_log_run_takes_the_losses_of_a_loop_of_ones_own(tmp_path):
    losses = [2.5, 1.25, 0.1]
    log_run(losses, tmp_path / "mine")
    assert read_scalars(tmp_path / "mine")[LOSS] == [(i, float(np.float32(v))) for i, v in enumerate(losses)]
    for bad in ([torch.tensor(1.0)], ["1.0"], [True], {"loss": 1.0}, 3):
        with pytest.raises(TensorBoardError, match="list of losses"):
            log_run(bad, tmp_path / "bad")


def test_errors_say_what_to_pass(tmp_path):
    trained(tmp_path / "runs" / "a")
    with pytest.raises(TensorBoardError, match="not its parent"):
        read_scalars(tmp_path / "runs")
    (tmp_path / "file").write_text("")
    with pytest.raises(TensorBoardError, match="is a file"):
        open_writer(tmp_path / "file")
    with pytest.raises(TensorBoardError, match="the run has"):
        plot_scalars(read_scalars(tmp_path / "runs" / "a"), tags=["eval/loss"])
    with pytest.raises(TensorBoardError, match="is not a folder"):
        read_scalars(tmp_path / "missing")
    with pytest.raises(TensorBoardError, match="takes a run's folder"):
        read_scalars(3)


def test_run_folder_is_runs_at_the_top_of_the_checkout_wherever_the_notebook_runs(tmp_path, monkeypatch):
    root = ROOT
    monkeypatch.chdir(tmp_path)  # as a notebook runs in notebooks/
    assert tensorboard.run_folder("lab08") == root / "runs" / "lab08"
    assert tensorboard.run_folder("D_01/adam") == root / "runs" / "D_01" / "adam"
    assert (root / ".gitignore").read_text().splitlines().count("/runs/") == 1  # never committed
    for bad in ("", "/tmp/x", "../x", 3, None):
        with pytest.raises(TensorBoardError, match="relative name"):
            tensorboard.run_folder(bad)


def test_plot_scalars_draws_one_chart_per_tag(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = trained(tmp_path)
    plt.close("all")
    plot_scalars(tmp_path, tags=[LOSS, LR])
    axes = plt.gcf().axes
    assert [a.get_title() for a in axes] == [LOSS, LR]
    steps, losses = axes[0].lines[0].get_data()
    assert list(steps) == list(range(STEPS))
    np.testing.assert_array_equal(losses, np.float32(history.losses))
    plt.close("all")


def ascii_float(text):
    """A float32 whose 4 bytes are the ASCII text: ORT's Python layer decodes a string output as
    UTF-8, so the Summary bytes SummaryScalar returns must be valid UTF-8 to reach Python at all."""
    return struct.unpack("<f", text.encode())[0]


def test_ort_summary_scalar_writes_the_summary_our_event_files_hold(tmp_path):
    """ORT's training build has TensorBoard ops (orttraining/training_ops/cpu/tensorboard/summary_op.cc):
    SummaryScalar serializes a tensorboard Summary proto. Its bytes equal the summary of our event."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    points = [ascii_float("1@?>"), ascii_float("zz(?")]  # about 0.186 and 0.659
    node = helper.make_node("SummaryScalar", ["x"], ["summary"], domain="com.microsoft", tags=[LOSS])
    graph = helper.make_graph([node], "summary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("summary", TensorProto.STRING, [])])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17),
                                                                  helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from_ort = [session.run(None, {"x": np.float32([v])})[0].item().encode() for v in points]

    history = trained(None)
    history.losses[:2] = points
    log_run(history, tmp_path)
    events = [e for f in sorted(tmp_path.glob("events.out.tfevents.*"))
              for e in LegacyEventFileLoader(str(f)).Load() if e.HasField("summary")]
    ours = [e.summary.SerializeToString() for e in events  # as written (no migration to tensors)
            if e.summary.value[0].tag == LOSS and e.step < 2]
    assert ours == from_ort


# --- the launcher, in a browser ---------------------------------------------------------------

def listening(pid):
    """(address, port) of every listening TCP socket of a process and its children."""
    procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    return sorted({(c.laddr.ip, c.laddr.port) for p in procs for c in p.net_connections("inet")
                   if c.status == psutil.CONN_LISTEN})


@pytest.fixture
def tensorboard_server(tmp_path):
    """tools/tensorboard.sh (what `make tensorboard` runs) over tmp runs/ holding one trained run,
    on a free port; yields (url, pid, history); stops it and everything it started."""
    history = trained(tmp_path / "runs" / "tiny_regression")
    port = free_port()
    log_path = tmp_path / "tensorboard.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(["bash", str(ROOT / "tools" / "tensorboard.sh"), str(tmp_path / "runs")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, ORTLAB_TB_PORT=str(port)))
    url = f"http://127.0.0.1:{port}/"

    def up():
        if proc.poll() is not None:
            pytest.fail(f"tools/tensorboard.sh exited:\n{log_path.read_text()}")
        try:
            return urllib.request.urlopen(url + "data/runs", timeout=2).read()
        except OSError:
            return None
    family = []
    try:
        wait_for(up, timeout=60, what="TensorBoard to answer")
        family = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
        yield url, proc.pid, history
    finally:
        stop_group(proc)
        log.close()
        gone, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, f"left running: {alive}"


def test_make_tensorboard_shows_the_runs_scalars_on_loopback(browser, tensorboard_server):  # noqa: F811
    url, pid, history = tensorboard_server
    sockets = listening(pid)
    assert sockets and all(ip == "127.0.0.1" for ip, _ in sockets), sockets  # server and its data server
    assert ("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/"))) in sockets

    browser.get(url)
    card = ("const t = Array.from(document.querySelectorAll('.tag')).find(t => t.getAttribute('title') === "
            "arguments[0]); const c = t && t.closest('scalar-card-component'); return c && c.innerText")

    def loss_row():
        """The loss card's data table row for the run: run, smoothed, value, step (last step)."""
        words = (browser.execute_script(card, LOSS) or "").split()
        return "tiny_regression" in words and words[words.index("tiny_regression"):][:4]
    run, smoothed, value, step = wait_for(loss_row, timeout=60, what="the loss chart and its run")
    screenshot(browser, "tensorboard.png")
    assert browser.current_url.startswith(url), browser.current_url
    shown_tags = browser.execute_script("return Array.from(document.querySelectorAll('.tag'))"
                                        ".map(t => t.getAttribute('title'))")
    assert {LOSS, LR, GRAD_NORM} <= set(shown_tags), shown_tags
    assert int(step) == STEPS - 1
    assert float(value) == pytest.approx(history.losses[-1], rel=1e-3)  # shown to 4 significant digits
