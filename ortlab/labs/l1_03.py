"""Exercises of the walkthrough L1_03_iobinding_dlpack: what a binding does across runs, and binding torch tensors
so that a session reads and writes them in place.

The scenarios the first exercise is about are written here, so the notebook can show them; the checks live in
ortlab.labs.judges.l1_03, which runs each scenario on onnxruntime 1.19.2 itself (onnxruntime/core/session/
IOBinding.cc, onnxruntime_pybind_iobinding.cc, core/framework/execution_frame.cc) and compares what a torch-bound
session wrote with ORT's own run, and the reference answers in solutions/walkthroughs/L1_03_iobinding_dlpack.py,
outside the package.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe

SETUP = ("sess = bv.ort_session(bv.mlp_model())  # a new ORT session for each scenario\n"
         "x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)\n"
         "def y_of(batch): return bv.mlp_reference(batch)[0]  # numpy's Y for a batch")

# (label, code): each scenario sets `answer`; a scenario whose code raises has the outcome "error"
SCENARIOS = [
    ("kept_get_outputs", '''
b = sess.io_binding()
b.bind_cpu_input("X", x)
b.bind_output("Y", "cpu")
sess.run_with_iobinding(b)
kept = b.get_outputs()[0].numpy()
b.bind_cpu_input("X", 2 * x)
sess.run_with_iobinding(b)
answer = np.allclose(kept, y_of(x))  # does kept still hold run 1's Y?
'''),
    ("kept_copy", '''
b = sess.io_binding()
b.bind_cpu_input("X", x)
b.bind_output("Y", "cpu")
sess.run_with_iobinding(b)
kept = b.copy_outputs_to_cpu()[0]
b.bind_cpu_input("X", 2 * x)
sess.run_with_iobinding(b)
answer = np.allclose(kept, y_of(x))  # does kept still hold run 1's Y?
'''),
    ("strided_input", '''
wide = np.repeat(x, 2, axis=1)  # [4, 16]: each column of x twice
b = sess.io_binding()
b.bind_cpu_input("X", wide[:, ::2])  # every other column: x's values, in a strided view
b.bind_output("Y", "cpu")
wide *= 2  # after the bind, before the run
sess.run_with_iobinding(b)
answer = np.allclose(b.copy_outputs_to_cpu()[0], y_of(2 * x))  # did the run read the doubled values?
'''),
    ("ortvalue_input", '''
batch = x.copy()
b = sess.io_binding()
b.bind_ortvalue_input("X", ort.OrtValue.ortvalue_from_numpy(batch))
b.bind_output("Y", "cpu")
batch *= 2  # after the bind, before the run
sess.run_with_iobinding(b)
answer = np.allclose(b.copy_outputs_to_cpu()[0], y_of(2 * x))  # did the run read the doubled values?
'''),
    ("float64_buffer", '''
out = np.zeros((4, 8), np.float64)
b = sess.io_binding()
b.bind_cpu_input("X", x)
b.bind_output("Y", "cpu", 0, np.float64, [4, 8], out.ctypes.data)
sess.run_with_iobinding(b)
answer = np.allclose(out, y_of(x))  # did ORT fill the float64 buffer?
'''),
    ("batch_grows", '''
b = sess.io_binding()
b.bind_cpu_input("X", x)
b.bind_output("Y", "cpu")
sess.run_with_iobinding(b)
b.bind_cpu_input("X", np.concatenate([x, x[:2]]))  # 6 rows now
sess.run_with_iobinding(b)
answer = np.allclose(b.copy_outputs_to_cpu()[0], y_of(np.concatenate([x, x[:2]])))  # Y of the 6 rows?
'''),
    ("rebound_by_device", '''
out = np.zeros((4, 8), np.float32)
b = sess.io_binding()
b.bind_cpu_input("X", x)
b.bind_output("Y", "cpu", 0, np.float32, [4, 8], out.ctypes.data)
sess.run_with_iobinding(b)
b.bind_output("Y", "cpu")  # Y bound again, by device only
b.bind_cpu_input("X", 2 * x)
sess.run_with_iobinding(b)
answer = np.allclose(out, y_of(2 * x))  # did run 2 write its Y into out?
'''),
]
LABELS = [label for label, _ in SCENARIOS]


def show_scenarios():
    """The setup and every scenario, as code."""
    parts = [f"# setup, before each scenario\n{SETUP}"]
    parts += [f"# --- {label} ---{code.rstrip()}" for label, code in SCENARIOS]
    return "\n\n".join(parts)


def scenario_outcome(label, session_factory=None):
    """Run scenario `label` on a new session (ORT's by default; `session_factory(model)` for another runtime) and
    return its outcome: `answer` (True or False), or "error" when the code raised."""
    import onnxruntime as ort  # heavy: onnxruntime

    from ortlab.walkthroughs import iobinding_dlpack as bv  # lazy: loaded only when this runs

    namespace = {"np": np, "bv": bv, "ort": ort}
    exec(SETUP, namespace)  # noqa: S102 - the scenario code above
    if session_factory is not None:
        namespace["sess"] = session_factory(bv.mlp_model())
    try:
        exec(dict(SCENARIOS)[label], namespace)  # noqa: S102
    except Exception:  # noqa: BLE001 - any refusal is the outcome "error"
        return "error"
    return bool(namespace["answer"])


@probe
def predicted_outcomes(fn):
    """The learner's fn(), as {label: True, False or "error"}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{scenario label: True, False or 'error'}}, not {type(found).__name__}")
    out = {}
    for label, value in found.items():
        if isinstance(value, (bool, np.bool_)):
            out[str(label)] = bool(value)
        elif value == "error":
            out[str(label)] = "error"
        else:
            raise CheckFailed(f"for {label!r}: say True, False or 'error' (when the scenario raises), not {value!r}")
    return out


def check_binding_outcomes(fn):
    """Exercise 'binding_outcomes': fn() -> {label: outcome} for each scenario of SCENARIOS, checked by running
    each scenario on onnxruntime 1.19.2."""
    judge("binding_outcomes", "l1_03.binding_outcomes", learner(fn))


# --- exercise 'bind_torch' ---------------------------------------------------------------------------------
GUARD = -7.0  # what t_y and the rows after it hold before a run


@probe
def torch_bound_runs(fn, batches):
    """Bind with the learner's fn(sess, t_x, t_y) on a new ORT session of bv.mlp_model(), then run once per batch,
    writing each batch into t_x in place. t_x and t_y are the first rows of larger tensors, so that a binding of
    the wrong shape reads and writes memory this probe owns. Returns one dict per run: what t_y and the rows after
    it hold, or the run's error."""
    import onnxruntime as ort  # heavy: onnxruntime
    import torch  # heavy: torch

    from ortlab.walkthroughs import iobinding_dlpack as bv  # lazy: loaded only when this runs

    sess = bv.ort_session(bv.mlp_model())
    rows = batches[0].shape[0]
    x_block = torch.zeros(rows + 4, 8)
    y_block = torch.full((rows + 4, 8), GUARD)
    t_x, t_y = x_block[:rows], y_block[:rows]
    t_x.copy_(torch.from_numpy(batches[0]))
    try:
        binding = fn(sess, t_x, t_y)
    except AttributeError as exc:
        if "_ortvalue" in str(exc):
            raise CheckFailed("bind_ortvalue_input and bind_ortvalue_output take an onnxruntime.OrtValue, and "
                              "_ortvalue_from_torch_tensor returns the C-level value (C.OrtValue): wrap it, "
                              "ort.OrtValue(c_value)") from None
        raise
    if not isinstance(binding, ort.IOBinding):
        raise CheckFailed(f"return the binding itself (sess.io_binding(), with X and Y bound), not "
                          f"{type(binding).__name__}")
    runs = []
    for k, batch in enumerate(batches):
        if k:
            t_x.copy_(torch.from_numpy(batch))  # the next batch, written into t_x's memory
        try:
            sess.run_with_iobinding(binding)
        except Exception as exc:  # noqa: BLE001 - ORT's refusal is what the check explains
            runs.append({"error": str(exc)[:600]})
            break
        runs.append({"t_y": t_y.numpy().copy(), "after": y_block[rows:].numpy().copy()})
    return runs


def bind_torch_batches(rows, runs=2, seed=0):
    """The batches the check feeds: `runs` float32 [rows, 8] arrays."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rows, 8)).astype(np.float32) for _ in range(runs)]


def check_bind_torch(fn):
    """Exercise 'bind_torch': fn(sess, t_x, t_y) -> an IOBinding of ORT session `sess` that reads X from torch
    tensor t_x and writes Y into torch tensor t_y; checked over several runs and batch sizes against ORT's run."""
    judge("bind_torch", "l1_03.bind_torch", learner(fn))
