"""The checks of L0_01's exercises (run where the learner's code cannot reach them).

Both read the truth from onnxruntime.InferenceSession itself: 'needed_inputs' from get_inputs() and
get_overridable_initializers() (InferenceSession::GetModelInputs / GetOverridableInitializers,
onnxruntime/core/session/inference_session.cc: a graph input with an initializer is overridable, every other
graph input is required, read by a node or not), 'output_shapes' from what run(None, feeds) returns.
"""
from ortlab import session
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l0_01 import inputs_model, predicted, predicted_shapes, shapes_feeds, shapes_model

CPU = ["CPUExecutionProvider"]


def ort_inputs(model):
    s = session.create(model, providers=CPU)
    return {"inputs": [i.name for i in s.get_inputs()],
            "overridable": [i.name for i in s.get_overridable_initializers()]}


def _why(name, model, listed):
    """Why ORT lists `name` where it does: from what the model declares."""
    graph_inputs = [i.name for i in model.graph.input]
    initializers = [t.name for t in model.graph.initializer]
    readers = [n.name for n in model.graph.node if name in n.input]
    if name in graph_inputs and name in initializers:
        return (f"{name!r} is a graph input that also has an initializer: the initializer is a default a feed may "
                "replace, so ORT lists it in get_overridable_initializers(), not get_inputs()")
    if name in initializers:
        return (f"{name!r} is an initializer that is not a graph input: it is part of the model and cannot be fed, "
                "so neither list names it")
    if name in graph_inputs and not readers:
        return (f"{name!r} is a graph input without an initializer: no node reads it, but ORT still requires a feed "
                "for it (run says 'Required inputs ... are missing from input feed')")
    if name in graph_inputs:
        return f"{name!r} is a graph input without an initializer, which every run must feed"
    return f"{name!r} is not a name the model declares as an input or an initializer"


def needed_inputs(remote, fn):
    got = remote.call(predicted, fn)
    model = inputs_model()
    truth = ort_inputs(model)
    for key in ("inputs", "overridable"):
        if not isinstance(got.get(key), list):
            raise CheckFailed(f"your dict needs a list under {key!r}: {{'inputs': [...], 'overridable': [...]}}")
    for key, method in (("inputs", "get_inputs()"), ("overridable", "get_overridable_initializers()")):
        extra = [n for n in got[key] if n not in truth[key]]
        missing = [n for n in truth[key] if n not in got[key]]
        for name, verb in [(n, "does not list") for n in extra] + [(n, "lists") for n in missing]:
            raise CheckFailed(f"{method} {verb} {name!r}: {_why(name, model, key)}")
    return None


HINTS = {"r": "a -1 in Reshape's target takes whatever is left: 5 * 6 values / (2 * 3) = 5",
         "t": "Transpose with perm [0, 2, 1] swaps the last two axes of r",
         "summed": "ReduceSum over axis 1 of t with keepdims=0 drops that axis",
         "best": "ArgMax keeps the reduced axis as a 1 unless keepdims=0, and its default is keepdims=1; its "
                 "indices are int64",
         "shape": "Shape returns one int64 per axis of its input",
         "projected": "MatMul of [5, 6] by w [6, 4]"}


def output_shapes(remote, fn):
    got = remote.call(predicted_shapes, fn)
    model = shapes_model()
    s = session.create(model, providers=CPU)
    names = [o.name for o in s.get_outputs()]
    truth = {name: (list(v.shape), v.dtype.name) for name, v in zip(names, s.run(None, shapes_feeds()))}
    missing = [n for n in names if n not in got]
    if missing:
        raise CheckFailed(f"{missing[0]!r} is missing: run(None, feeds) returns every graph output, {len(names)} "
                          f"here ({', '.join(names)})")
    extra = [n for n in got if n not in truth]
    if extra:
        raise CheckFailed(f"{extra[0]!r} is no graph output: run(None, feeds) returns only {', '.join(names)}")
    for name in names:
        (shape, dtype), (want_shape, want_dtype) = got[name], truth[name]
        if shape != want_shape:
            raise CheckFailed(f"{name!r}: you said shape {tuple(shape)}, ORT returns {tuple(want_shape)}: "
                              f"{HINTS[name]}")
        if dtype != want_dtype:
            raise CheckFailed(f"{name!r}: you said {dtype}, ORT returns {want_dtype}: {HINTS[name]}")
    return None

