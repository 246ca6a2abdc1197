"""Helpers that ask the real ONNX Runtime, for tests to compare ortlab against.

Always on the CPU EP: the expected behaviour is the CPU build's, and on a GPU machine the
CUDA EP would add Memcpy nodes and fusions of its own.
"""
import numpy as np

from ortlab import session


CPU = ["CPUExecutionProvider"]


def run(model, feeds, optimize=False):
    """Outputs of `model` in ORT on the CPU, without graph optimizations unless asked."""
    return list(session.run_model(model, feeds, CPU, "all" if optimize else "disable").values())


def random_feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    init = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value or 2 for d in t.shape.dim]
        dtype = {1: np.float32, 7: np.int64, 11: np.float64}[t.elem_type]
        feeds[vi.name] = (rng.standard_normal(shape) if dtype != np.int64
                          else rng.integers(0, 4, shape)).astype(dtype)
    return feeds


def clean_export(name, training, **kwargs):
    """models.export of a zoo model in a fresh process, with its example inputs as numpy arrays.

    ORTModule, once imported by another test in this process, registers export symbolics
    (embedding -> org.pytorch.aten ATen) that change what torch.onnx.export produces.
    """
    import pickle
    import subprocess
    import sys
    import tempfile

    script = (
        "import pickle, sys, warnings; warnings.filterwarnings('ignore')\n"
        "from ortlab import models\n"
        f"m = models.get({name!r}, **{kwargs!r}); x, y = m.example_inputs()\n"
        f"onx = models.export(m, (x, y), training={training!r})\n"
        "pickle.dump((onx.SerializeToString(), x.numpy(), y.numpy()), open(sys.argv[1], 'wb'))\n")
    with tempfile.NamedTemporaryFile(suffix=".pkl") as out:
        subprocess.run([sys.executable, "-c", script, out.name], check=True)
        data, x, y = pickle.load(open(out.name, "rb"))
    import onnx
    return onnx.load_from_string(data), x, y
