"""The checks of D_03's exercises (run where the learner's code cannot reach them).

'nan_birth' builds each case's I/O dump from ORT 1.19.2's own values (d_03.io_dump: every value made a graph
output) and finds where the first non-finite value is born: the first node, in graph order, that writes a NaN or
an inf from finite inputs, or the feed or initializer that already held one. 'plan_bytes' reads ORT's profiler:
the output_size of each node's kernel_time event in one run at level 'extended' (ortlab.profiling.plan_table).
"""
import numpy as np

from ortlab.labs.checks import CheckFailed
from ortlab.labs.d_03 import (BYTES_LEVEL, NAN_CASES, birth_named, bytes_feeds, bytes_model, io_dump, nan_case,
                              predicted_bytes)


def _finite(value):
    value = np.asarray(value)
    return value.dtype.kind not in "fc" or bool(np.all(np.isfinite(value)))


def _kind(value):
    value = np.asarray(value)
    if np.any(np.isnan(value)):
        return "a NaN"
    return "an inf" if np.any(np.isposinf(value)) else "a -inf"


def birth(dump):
    """(name, what) where the first non-finite value of `dump` is born, or (None, None)."""
    made = set()
    for node in dump:
        for name, value in node.inputs.items():
            if name not in made and not _finite(value):
                return name, _kind(value)
        bad = [v for v in node.outputs.values() if not _finite(v)]
        if bad:
            return node.name, _kind(bad[0])
        made.update(node.outputs)
    return None, None


def _first_nan(dump):
    """The first node that writes a NaN (what a search for NaN alone finds)."""
    return next((n.name for n in dump if any(np.asarray(v).dtype.kind == "f" and np.any(np.isnan(v))
                                             for v in n.outputs.values())), None)


def nan_birth(remote, fn):
    for case in NAN_CASES:
        dump = io_dump(*nan_case(case))
        truth, what = birth(dump)
        got = remote.call(birth_named, fn, dump)
        if got == truth:
            continue
        where = f"case {case!r}"
        nodes = {n.name: n for n in dump}
        producer = next((n.name for n in dump if got in n.outputs), None)
        if truth is None:
            raise CheckFailed(f"{where}: every value of this dump is finite, so nothing is born: return None "
                              f"(you said {got!r})")
        if got is None:
            raise CheckFailed(f"{where}: {truth!r} holds {what}, yet you found nothing: a NaN is not the only "
                              "non-finite value (np.isfinite, not np.isnan), and a feed can hold one too")
        if producer is not None:
            also = "" if producer == truth else f" (and the first non-finite value is born at {truth!r})"
            raise CheckFailed(f"{where}: {got!r} is a value; name the node that wrote it, {producer!r}{also}")
        if got not in nodes and truth not in nodes:
            raise CheckFailed(f"{where}: the non-finite value is born at {truth!r}, which holds {what} before any "
                              "node runs")
        if got in nodes and truth not in nodes:
            raise CheckFailed(f"{where}: {got!r} read {what} it did not make: {truth!r}, a feed or initializer, "
                              "already held it before any node ran; name it")
        if got not in nodes:
            raise CheckFailed(f"{where}: {got!r} is no node, feed or initializer of this dump that holds a non-finite "
                              f"value; the first one is born at {truth!r}")
        order = [n.name for n in dump]
        if got == _first_nan(dump) and "inf" in what:
            raise CheckFailed(f"{where}: {got!r} writes the first NaN, but {truth!r} wrote {what} before it: an "
                              "inf is not finite either (test with np.isfinite, not np.isnan)")
        if order.index(got) > order.index(truth):
            raise CheckFailed(f"{where}: {got!r} only passes on a non-finite value it read; the first node that "
                              f"writes one from finite inputs is {truth!r} ({what}): where it is born, not where it "
                              "ends up")
        raise CheckFailed(f"{where}: every value {got!r} reads and writes is finite; the first non-finite value is "
                          f"born at {truth!r} ({what})")
    return None


def ort_output_bytes():
    """{node name: output bytes} of one profiled run of bytes_model() at BYTES_LEVEL, in execution order."""
    from ortlab import profiling  # lazy: loaded when the check runs (every judge is imported before a learner's cell)

    profile = profiling.profile_model(bytes_model(), bytes_feeds(), runs=1, level=BYTES_LEVEL)
    return {row[0]: int(row[3]) for row in profiling.plan_table(profile).rows}


WHY = {
    "matmul": "[4, 16] @ [16, 8] gives [4, 8] float32: 32 values of 4 bytes",
    "to_half": "float16 takes 2 bytes: 32 values",
    "argmax": "ArgMax keeps the reduced axis (keepdims defaults to 1) and returns int64 indices, 8 bytes each: "
              "[4, 1]",
    "rowsum": "ReduceSum over axis 1 with keepdims 0 gives [4] float32",
    "positive": "a comparison returns bool, 1 byte per value: [4, 8]",
    "flatten": "Reshape to [-1] gives [32] float32: the profiler counts the bytes of the tensor the node outputs",
    "transpose": "Transpose gives [8, 4] float32",
}


def plan_bytes(remote, fn):
    got = remote.call(predicted_bytes, fn)
    truth = ort_output_bytes()
    nodes = [n.name for n in bytes_model().graph.node]
    for name in got:
        if name not in nodes:
            raise CheckFailed(f"{name!r} is not a node of the model; its nodes are {', '.join(nodes)}")
        if name not in truth:
            raise CheckFailed(f"{name!r} does not run, so the profile has no event for it: the shape of h is known "
                              f"([4, 8]) before any run, and at level '{BYTES_LEVEL}' constant folding replaces "
                              "Shape(h) by an initializer; leave it out")
    for name, bytes_ in truth.items():
        if name not in got:
            raise CheckFailed(f"{name!r} is missing: it runs, and its event records {bytes_} bytes of output")
        if got[name] != bytes_:
            rounded = " (the profiler records the raw bytes, not the arena's 256-byte rounding)" \
                if got[name] % 256 == 0 and bytes_ % 256 else ""
            raise CheckFailed(f"{name!r}: ORT's profile records {bytes_} bytes, you said {got[name]}: "
                              f"{WHY[name]}{rounded}")
    return None
