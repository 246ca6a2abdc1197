"""The checks of L0_04's exercises (run where the learner's code cannot reach them).

'reshape_shape' compares with the shape of what ORT's CPU Reshape kernel returns (a one-node model:
session.run_node; ReshapeHelper in onnxruntime/core/providers/cpu/tensor/reshape_helper.h) on cases the notebook
never shows. 'function_op' loads the learner's model into an ORT session, which inlines the model's functions
(onnxruntime/core/graph/function_utils.cc), explains ORT's refusal when there is one, then runs the model and
compares with x · sigmoid(x) computed in numpy.
"""
import math

import numpy as np

from ortlab import session
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l0_04 import model_of, reshape_shapes

CPU = ["CPUExecutionProvider"]

# (input shape, target, allowzero): only targets ORT accepts (an invalid one makes ORT log an error)
RESHAPE_CASES = [([2, 3, 4], [0, -1], 0), ([2, 3, 4], [4, 0, -1], 0), ([6, 1, 4], [-1, 0, 2], 0),
                 ([2, 3, 4], [0, 0, 2, 2], 0), ([1, 12], [3, -1], 0), ([2, 3, 4], [-1], 0),
                 ([2, 0, 3], [0, -1], 0), ([2, 0, 3], [0, 6], 1), ([2, 3, 4], [4, 6], 1)]


def ort_reshape(input_shape, target, allowzero):
    """The shape of what ORT's Reshape returns for an input of `input_shape`."""
    data = np.zeros(input_shape, np.float32)
    (out,) = session.run_node("Reshape", [data, np.array(target, np.int64)], {"allowzero": allowzero})
    return list(out.shape)


def reshape_shape(remote, fn):
    got_all = remote.call(reshape_shapes, fn, RESHAPE_CASES)
    for (shape, target, allowzero), got in zip(RESHAPE_CASES, got_all):
        truth = ort_reshape(shape, target, allowzero)
        if got == truth:
            continue
        case = f"input {shape}, target {target}, allowzero={allowzero}"
        if len(got) != len(truth):
            raise CheckFailed(f"{case}: you returned {got}; the output has one dimension per entry of the target "
                              f"({len(target)}): ORT returns {truth}")
        i = next(k for k, (g, t) in enumerate(zip(got, truth)) if g != t)
        if target[i] == 0 and not allowzero:
            raise CheckFailed(f"{case}: at index {i} you gave {got[i]}; a 0 in the target copies the input's "
                              f"dimension at the same index ({shape[i]}) when allowzero=0, the default: ORT "
                              f"returns {truth}")
        if target[i] == 0:
            raise CheckFailed(f"{case}: at index {i} you gave {got[i]}; with allowzero=1 a 0 in the target is a "
                              f"dimension of size 0 (for empty tensors), not a copy of the input's: ORT returns "
                              f"{truth}")
        if target[i] == -1:
            rest = [truth[k] for k in range(len(truth)) if k != i]
            raise CheckFailed(f"{case}: at index {i} you gave {got[i]}; the -1 takes what is left: the input's "
                              f"{math.prod(shape)} elements divided by the product of every other output dimension, "
                              f"the copied ones included ({' * '.join(map(str, rest)) or '1'}), so ORT returns "
                              f"{truth}")
        raise CheckFailed(f"{case}: at index {i} you gave {got[i]}; a positive entry of the target is that output "
                          f"dimension as it is: ORT returns {truth}")
    return None


LOAD_ERRORS = [  # (words of ORT's refusal, what it means for the learner's model)
    ("No opset import for domain 'lab'",
     "ORT refused the model: \"No opset import for domain 'lab'\". The node's domain must be imported by the model "
     "like any other: opset_imports=[helper.make_opsetid('', 17), helper.make_opsetid('lab', 1)]"),
    ("Opset 22 is under development",
     "ORT refused the model: it imports ai.onnx opset 22. helper.make_model without opset_imports stamps the "
     "newest opset onnx 1.17 knows (22), and ORT 1.19.2 supports ai.onnx up to opset 21: pass opset_imports, "
     "e.g. helper.make_opsetid('', 17), and the 'lab' domain"),
    ("in function opset imports",
     "ORT refused the model: 'No opset registered for domain in function opset imports'. A function resolves "
     "the ops of its body through its own opset_imports, not the model's: give helper.make_function "
     "[helper.make_opsetid('', 17)]"),
    ("No Op registered for Swish",
     "ORT refused the model: 'No Op registered for Swish' in the ONNX domain. The node must say domain='lab' "
     "(helper.make_node(..., domain='lab')) so that ORT looks it up among the model's functions"),
    ("expected to have type but instead is null",
     "ORT refused the model: a node of the body reads a name that is neither a function input nor the output of "
     "an earlier body node. Inside the function, names are its own (its input X, not the graph's x)"),
    ("failed validating the check",
     "ORT refused the model: the body must write the function's output, under the name given to "
     "helper.make_function's outputs"),
    ("Unsupported model IR version",
     "ORT refused the model's ir_version: ORT 1.19.2 reads models up to IR version 10"),
]


def _swish(x):
    return x / (1 + np.exp(-x))


def function_op(remote, fn):
    model = remote.call(model_of, fn)
    nodes = list(model.graph.node)
    if len(nodes) != 1 or nodes[0].op_type != "Swish":
        shown = ", ".join(f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in nodes) or "none"
        raise CheckFailed(f"the graph's nodes are {shown}; it holds one node, a Swish whose maths lives in the "
                          "model's function (ORT inlines its body when it loads the model)")
    if not any(f.domain == "lab" and f.name == "Swish" for f in model.functions):
        found = ", ".join(f"{f.domain}.{f.name}" for f in model.functions) or "no function"
        raise CheckFailed(f"model.functions holds {found}: define the op as helper.make_function('lab', 'Swish', "
                          "...) and pass it as helper.make_model(..., functions=[...])")
    try:
        ort_session = session.create(model, providers=CPU)
    except session.SessionError as exc:
        text = str(exc)
        for words, why in LOAD_ERRORS:
            if words in text:
                raise CheckFailed(why) from None
        raise CheckFailed(f"ORT could not load your model: {text[:300]}") from None
    inputs, outputs = ort_session.get_inputs(), ort_session.get_outputs()
    if len(inputs) != 1 or len(outputs) != 1:
        raise CheckFailed(f"the graph has {len(inputs)} input(s) and {len(outputs)} output(s); give it one of each, "
                          "x and y")
    rng = np.random.default_rng(3)
    for batch in (3, 1):
        x = rng.standard_normal((batch, 4)).astype(np.float32) * 3
        try:
            (y,) = ort_session.run(None, {inputs[0].name: x})
        except Exception as exc:
            if "dimensions" in str(exc):
                raise CheckFailed(f"ORT refused x of shape [{batch}, 4]: declare x as [batch, 4], its first "
                                  "dimension a name (a str in make_tensor_value_info) so any batch size fits") from None
            raise CheckFailed(f"ORT could not run your model on x of shape [{batch}, 4]: "
                              f"{str(exc).splitlines()[0][:200]}") from None
        want = _swish(x.astype(np.float64))
        if y.shape != want.shape:
            raise CheckFailed(f"for x of shape [{batch}, 4] your model returns shape {list(y.shape)}; Swish works "
                              "element by element")
        if not np.allclose(y, want, rtol=1e-4, atol=1e-5):
            if np.allclose(y, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-4, atol=1e-5):
                raise CheckFailed("your model returns Sigmoid(x); Swish multiplies it by x: x · Sigmoid(x)")
            at = np.unravel_index(int(np.argmax(np.abs(y - want))), want.shape)
            raise CheckFailed(f"for x = {x[at]:.4f} your model returns {y[at]:.4f}; x · Sigmoid(x) is {want[at]:.4f}")
    return None
