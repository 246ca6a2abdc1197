"""Exercises of the walkthrough 00_welcome: two warm-ups that show how an exercise is checked, each judged
against the real ONNX Runtime.

'relu' asks for Relu in numpy, checked against ORT's CPU Relu kernel (onnxruntime/core/providers/cpu/
activation/activations.h) on arrays the check chooses; 'ort_ops' asks which ops ORT's session runs for the
notebook's first graph, checked against the graph ORT saves after its optimizations
(SessionOptions.optimized_model_filepath). The checks live in ortlab.labs.judges.l00_welcome, the reference
answers in solutions/walkthroughs/00_welcome.py, outside the package.
"""
import io

import numpy as np
import onnx

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe


def first_model():
    """The notebook's first graph: torch's Sequential(Linear(4, 8), GELU(), Linear(8, 2)) exported to ONNX
    (opset 17) as section 3 of the notebook exports it, with the same weights (torch seeded with 0; the
    caller's random state is left as it was)."""
    import torch  # heavy: torch

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).eval()
        x = torch.randn(3, 4)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, input_names=["x"], output_names=["y"], opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


@probe
def relu_outputs(fn, cases):
    """The learner's fn on each array of `cases`: [(what it returned, the input after the call)]."""
    out = []
    for x in cases:
        given = x.copy()
        got = fn(given)
        if not isinstance(got, (np.ndarray, np.generic)):
            raise CheckFailed(f"return a numpy array (as ORT's run does), not {type(got).__name__}")
        out.append((np.asarray(got), given))
    return out


@probe
def predicted_ops(fn):
    """The learner's fn(), as a list of op type names."""
    found = fn()
    if isinstance(found, (str, bytes, dict)) or not isinstance(found, (list, tuple)):
        raise CheckFailed(f"return a list of op types in run order, e.g. ['MatMul', 'Relu'], not "
                          f"{type(found).__name__}")
    for item in found:
        if not isinstance(item, str):
            raise CheckFailed(f"each entry is an op type as a string, e.g. 'Gemm'; not {item!r}")
    return list(found)


def check_relu(fn):
    """Exercise 'relu': fn(x) -> Relu of the numpy array x, checked against ORT's Relu kernel on arrays the check
    chooses."""
    judge("relu", "l00_welcome.relu", learner(fn))


def check_ort_ops(fn):
    """Exercise 'ort_ops': fn() -> the op types of the nodes ORT's session runs for first_model(), in order,
    checked against the graph ORT saves after its default optimizations."""
    judge("ort_ops", "l00_welcome.ort_ops", learner(fn))
