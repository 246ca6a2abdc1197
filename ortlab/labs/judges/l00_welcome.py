"""The checks of 00_welcome's exercises (run where the learner's code cannot reach them).

'relu' runs ORT's own Relu kernel (a one-node model in a CPU session: session.run_node) on each array it gives
the learner's function, and compares values, shape and element type; 'ort_ops' reads the graph ORT saves after
the optimizations an InferenceSession with default options applies (ORT_ENABLE_ALL:
SessionOptions.optimized_model_filepath), the nodes the session runs.
"""
import numpy as np

from ortlab import session
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l00_welcome import first_model, predicted_ops, relu_outputs

CPU = ["CPUExecutionProvider"]


def relu_cases():
    """The arrays the check feeds: float32 of two shapes, float64 and int32 (ORT's CPU Relu has kernels for each).
    No 0-d array: numpy computes np.maximum(x, 0) of one in float64 (a 0-d array and a Python int promote as two
    scalars), a numpy quirk this warm-up is not about."""
    rng = np.random.default_rng(7)
    return [rng.standard_normal((2, 3)).astype(np.float32),
            rng.standard_normal((3, 1, 4)).astype(np.float32),
            np.array([-2.5, 0.0, 1.5, -0.5], np.float64),
            np.array([-3, 0, 4, -1, 2], np.int32)]


def ort_relu(x):
    return session.run_node("Relu", [x])[0]


def relu(remote, fn):
    cases = relu_cases()
    try:
        answers = remote.call(relu_outputs, fn, cases)
    except (NotImplementedError, NameError, CheckFailed):
        raise
    except Exception as exc:
        if type(exc).__name__ == "ValueError" and "truth value of an array" in str(exc):
            raise CheckFailed("Python's max (or an `if x > 0`) asks whether a whole array is true and raises "
                              "'The truth value of an array ... is ambiguous'; compare element by element with "
                              "numpy: np.maximum or np.where") from None
        raise
    for x, (got, after) in zip(cases, answers):
        want = ort_relu(x)
        shown = f"{x.dtype}{list(x.shape)}"
        if not np.array_equal(after, x):
            raise CheckFailed(f"for the input {shown}, your relu changed the array it was given; ORT's kernel "
                              "writes its output into a new buffer and leaves its input as it was (another node, "
                              "or the caller, may still read it)")
        if got.shape != want.shape:
            raise CheckFailed(f"for the input {shown}, you returned shape {list(got.shape)}; ORT's Relu returns "
                              f"{list(want.shape)}: it works element by element and keeps the input's shape")
        if not np.allclose(got.astype(np.float64), want.astype(np.float64)):
            at = np.unravel_index(int(np.argmax(np.abs(got.astype(np.float64) - want))), want.shape)
            value = x[at]
            if np.allclose(got, np.abs(x)):
                why = "you returned |x|: Relu sets each negative value to 0 instead of flipping its sign"
            elif value < 0:
                why = "Relu sets a negative value to 0"
            else:
                why = "Relu keeps a positive value as it is"
            raise CheckFailed(f"for the input {shown}, at index {tuple(int(i) for i in at)} x = {value!r}: ORT's "
                              f"Relu gives {want[at]!r}, you gave {got[at]!r}; {why}")
        if got.dtype != want.dtype:
            raise CheckFailed(f"for the input {shown}, you returned {got.dtype}; ORT's Relu returns {want.dtype}: "
                              "its output has its input's element type (the schema's one type T for both), so "
                              "compare with 0 of that type (np.maximum(x, 0), not 0.0, which turns ints into "
                              "floats)")
    return None


def session_ops(model=None):
    """The op types of the nodes ORT's session runs for `model` (first_model()), in the saved graph's order."""
    optimized = session.optimized_model(first_model() if model is None else model, "all", providers=CPU)
    return [n.op_type for n in optimized.graph.node]


GELU_PATTERN = ("Div", "Erf", "Add", "Mul")


def ort_ops(remote, fn):
    got = [op.split(":")[-1].strip() for op in remote.call(predicted_ops, fn)]  # "com.microsoft:Gelu" is Gelu
    model = first_model()
    truth = session_ops(model)
    if got == truth:
        return None
    if "Constant" in got:
        raise CheckFailed("ORT runs no Constant node: when it loads a model it turns each Constant into an "
                          "initializer, a value the session holds, so the exporter's Constant nodes are gone "
                          "before the first run")
    if any(op in got for op in GELU_PATTERN):
        raise CheckFailed("Div, Erf, Add, Mul, Mul is torch's GELU written in ONNX ops, and an InferenceSession "
                          "with default options optimizes the graph when it is created: ORT's GeluFusion replaces "
                          "the whole pattern with one Gelu node (com.microsoft)")
    if [op.lower() for op in got] == [op.lower() for op in truth]:
        raise CheckFailed("op types are names, case and all, as ORT's graph writes them (e.g. 'Gelu', "
                          "not 'GELU')")
    if "Linear" in got or "MatMul" in got:
        raise CheckFailed("the exporter wrote each torch Linear as one Gemm node (x times the transposed weight, "
                          "plus the bias: the node table shows it), and ORT keeps it: there is no Linear or MatMul "
                          "op in the graph")
    if sorted(got) == sorted(truth):
        raise CheckFailed(f"the right ops in the wrong order ({', '.join(got)}): a session runs the nodes in an "
                          "order where each comes after the nodes whose outputs it reads, here the order data "
                          "flows from x to y")
    if "BiasGelu" in got:
        raise CheckFailed("BiasGeluFusion folds an Add (a bias) and the Gelu reading it into one BiasGelu; here each "
                          "bias is inside a Gemm, so no Add is left in front of the Gelu to fold")
    if len(got) == len(truth):
        k = next(i for i, (g, t) in enumerate(zip(got, truth)) if g != t)
        raise CheckFailed(f"the right number of nodes, but not {got[k]!r} at position {k}: what did the exporter "
                          "write for that layer of the torch model, and what did ORT make of it?")
    raise CheckFailed(f"you listed {len(got)} nodes ({', '.join(got) or 'none'}); ORT's session runs "
                      f"{len(truth)}: start from the node table above, then apply what the session does when it "
                      "is created")
