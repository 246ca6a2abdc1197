"""The checks of L1_08's exercises (run where the learner's code cannot reach them).

'overlap' reads the log of the runtime model (ortlab.cuda.runtime: the ordering rules of the CUDA C++
Programming Guide, "Asynchronous Concurrent Execution", "Streams", "Events", and the Runtime API's "API
synchronization behavior") the learner's host code produced: every chunk's copy in, kernel and copy out must
follow each other in time (work in two streams is not ordered unless an event orders it), the host must be back
only once the results are in host_out, and the copies must overlap the kernels (all done by TARGET model ms).

'row_sum_fix' takes the learner's CUDA C++ text (screened as lab10 screens it), compiles it with NVRTC + ptxas
for sm_80 and sm_90, runs it on the CPU runner in a process of its own (ortlab.labs.cpu_runner, through lab10's
judge) with the threads first to last and last to first, and compares with ORT 1.19.2's ReduceSum over each row.
"""
import numpy as np

from ortlab.labs import cpu_runner
from ortlab.labs.checks import CheckFailed, compare
from ortlab.labs.l1_08 import (CHUNKS, COPY_IN, COPY_OUT, HIDDEN_ROWS, KERNEL, ROW_SUM, SEEN_ROWS, TARGET,
                               pipeline_log, row_sum_input)

EPS = 1e-9


# --- 'overlap' -------------------------------------------------------------------------------------------------

def _at(t):
    return f"{t:g}"


def _one(calls, what, how):
    """The one call of `calls`, or CheckFailed saying what is missing or doubled."""
    if len(calls) != 1:
        found = "none" if not calls else f"{len(calls)} of them"
        raise CheckFailed(f"{what}: found {found}; {how}")
    return calls[0]


def _chunk(calls, pointers, i):
    """(copy in, kernel, copy out) of chunk i, each checked to be there once with its duration."""
    buf, src, dst = pointers["buffers"][i], pointers["host_in"][i], pointers["host_out"][i]
    copies = [c for c in calls if c["call"] != "launch"]
    cin = _one([c for c in copies if c["dst"] == buf and c["src"] == src], f"chunk {i}'s copy of host_in[{i}] into "
               f"buffers[{i}]", f"copy it once with device.memcpy_async(buffers[{i}], host_in[{i}], l1_08.COPY_IN, "
               "stream)")
    kernel = _one([c for c in calls if c["call"] == "launch" and c["name"] == f"kernel {i}"],
                  f"chunk {i}'s kernel", f"launch it once: device.launch(\"kernel {i}\", l1_08.KERNEL, stream)")
    cout = _one([c for c in copies if c["dst"] == dst and c["src"] == buf], f"chunk {i}'s copy of buffers[{i}] back "
                f"into host_out[{i}]", f"copy it once with device.memcpy_async(host_out[{i}], buffers[{i}], "
                "l1_08.COPY_OUT, stream)")
    for call, what, duration, name in ((cin, "the copy in", COPY_IN, "COPY_IN"),
                                       (kernel, "the kernel", KERNEL, "KERNEL"),
                                       (cout, "the copy out", COPY_OUT, "COPY_OUT")):
        if abs(call["duration"] - duration) > EPS:
            raise CheckFailed(f"chunk {i}: {what} was given {_at(call['duration'])} model ms; it takes "
                              f"l1_08.{name} = {_at(duration)}")
    return cin, kernel, cout


def _before(first, then, i, what_first, what_then, buffer):
    if then["start"] + EPS < first["end"]:
        raise CheckFailed(f"chunk {i}: {what_then} ran from {_at(then['start'])} to {_at(then['end'])} model ms on "
                          f"{then['stream']!r}, before {what_first} (on {first['stream']!r}) ended at "
                          f"{_at(first['end'])}: it would use {buffer} half written. Work in two streams is not "
                          "ordered: keep a chunk's copies and kernel in one stream, or record an event after the "
                          "first (event_record) and make the second's stream wait for it (stream_wait_event)")


def _what(call, pointers):
    """'kernel 2', 'the copy into buffers[1]' or 'the copy back of chunk 3'."""
    if call["call"] == "launch":
        return call["name"]
    if call["dst"] in pointers["buffers"]:
        return f"the copy into buffers[{pointers['buffers'].index(call['dst'])}]"
    if call["src"] in pointers["buffers"]:
        return f"the copy back of chunk {pointers['buffers'].index(call['src'])}"
    return "a copy"


def _waited(calls, pointers, chunks):
    """'kernel 0 waited until 6 behind the copy into buffers[2] in stream 'A' (it could start at 2). ' for the
    first step that waited behind another chunk's different step in its own stream, or ''."""
    steps = []
    for i, (cin, kernel, cout) in enumerate(chunks):
        steps += [(cin, i, None), (kernel, i, cin["end"]), (cout, i, kernel["end"])]
    chunk_of = {id(call): i for call, i, _ in steps}
    kind = {id(call): k % 3 for k, (call, _, _) in enumerate(steps)}
    for step, i, ready in sorted(steps, key=lambda s: s[0]["start"]):
        if ready is not None and step["start"] <= ready + EPS:
            continue
        for other, j, _ in steps:
            if (j != i and other["stream"] == step["stream"] and abs(other["end"] - step["start"]) < EPS
                    and kind[id(other)] != kind[id(step)] and chunk_of[id(other)] != i):
                could = "" if ready is None else f" (it could start at {_at(ready)})"
                what = _what(step, pointers)
                return (f"{what[0].upper()}{what[1:]} waited until {_at(step['start'])} behind "
                        f"{_what(other, pointers)} in stream {step['stream']!r}{could}. ")
    return ""


def overlap(remote, fn):
    log = remote.call(pipeline_log, fn)
    calls, pointers = log["calls"], log["pointers"]
    legacy = [c for c in calls if c["call"] == "cudaMemcpy"]
    if legacy:
        raise CheckFailed("your copies use cudaMemcpy (device.memcpy): it runs on the legacy default stream, which "
                          "waits for the work of every other stream and holds theirs back, and the host waits until "
                          "it is done, so nothing can overlap. Use cudaMemcpyAsync on a stream: "
                          "device.memcpy_async(dst, src, duration, stream)")
    chunks = [_chunk(calls, pointers, i) for i in range(CHUNKS)]
    for i, (cin, kernel, cout) in enumerate(chunks):
        _before(cin, kernel, i, f"the copy into buffers[{i}]", f"kernel {i}", f"buffers[{i}]")
        _before(kernel, cout, i, f"kernel {i}", f"the copy back into host_out[{i}]", f"buffers[{i}]")
    last = max(cout["end"] for _, _, cout in chunks)
    returned = log["returned_at"]
    if returned + EPS < last:
        late = max(range(CHUNKS), key=lambda i: chunks[i][2]["end"])
        raise CheckFailed(f"your function returned at {_at(returned)} model ms, before the last result reached "
                          f"host_out (host_out[{late}] at {_at(last)}): the copies are asynchronous, so the host must "
                          "wait for them (device_synchronize, or stream_synchronize on each stream) before it reads "
                          "host_out")
    done = max(last, returned)
    if done > TARGET + EPS:
        streams = sorted({c["stream"] for c in calls})
        if len(streams) == 1:
            raise CheckFailed(f"all the work went to one stream ({streams[0]!r}), which runs it in issue order: "
                              f"nothing overlapped, and everything was done at {_at(done)} model ms. Give the chunks "
                              "streams of their own (device.create_stream), so that one chunk's copies run while "
                              f"another's kernel does: {_at(TARGET)} is reachable")
        raise CheckFailed(f"everything was done at {_at(done)} model ms; {_at(TARGET)} is reachable. "
                          f"{_waited(calls, pointers, chunks)}A stream runs its work in issue order, so a step issued "
                          "behind another chunk's steps in the same stream waits for them: issue each chunk's copy "
                          "in, kernel and copy out together, alternating streams, or give each chunk its own "
                          "stream (a copy in queued behind a copy out waits for it too)")
    return None


# --- 'row_sum_fix' ---------------------------------------------------------------------------------------------

def ort_row_sums(x):
    """ORT's ReduceSum (opset 13) over axis 1, keepdims=0."""
    from ortlab.session import run_node  # heavy: onnxruntime ('overlap', in the same notebook, needs none)

    return run_node("ReduceSum", [x, np.array([1], np.int64)], {"keepdims": 0}, opset=13)[0]


def _answer(result, rows, label):
    if isinstance(result, str):
        raise CheckFailed(f"{label}: {result}")
    if not isinstance(result, np.ndarray) or result.shape != (rows,):
        raise CheckFailed(f"{label}: the CPU runner's process gave a malformed answer")
    return result


def row_sum_fix(remote, fn):
    from ortlab.labs.judges.lab10 import learner_source, on_cpu_runner, prepared  # heavy: onnxruntime, as above

    source = learner_source(remote, fn, "my_row_sum_source()")
    prepared(source, ROW_SUM)  # the signature, and NVRTC + ptxas compile it for sm_80 and sm_90
    cases = SEEN_ROWS + HIDDEN_ROWS
    runs = []
    for rows, cols, block in cases:
        x = row_sum_input(rows, cols)
        for schedule in ("forward", "reverse"):
            runs.append(cpu_runner.Launch(rows, block, (x, np.zeros(rows, np.float32), cols), out=1,
                                          schedule=schedule))
    results = on_cpu_runner(source, ROW_SUM, runs)
    for k, (rows, cols, block) in enumerate(cases):
        label = (f"for {rows} row(s) of {cols} with {block} threads per block"
                 f"{' (a shape the notebook does not show)' if (rows, cols, block) not in SEEN_ROWS else ''}")
        forward, reverse = (_answer(r, rows, label) for r in results[2 * k:2 * k + 2])
        if not np.allclose(forward, reverse, rtol=1e-5, atol=1e-4, equal_nan=True):
            r = int(np.argmax(~np.isclose(forward, reverse, rtol=1e-5, atol=1e-4, equal_nan=True)))
            raise CheckFailed(f"{label}: a race: out changes with the order the threads run between barriers (row "
                              f"{r}: {forward[r]:.6g} with thread 0 first, {reverse[r]:.6g} with the last thread "
                              "first). A thread reads a slot of `partial` that another has not written yet, or has "
                              "already changed: every thread must pass a __syncthreads() after writing its slot and "
                              "before the tree reads it, and another after each level of the tree")
        x = row_sum_input(rows, cols)
        truth = ort_row_sums(x)
        reason = compare(forward, truth, rtol=1e-4, atol=1e-3, what="out")
        if reason is None:
            continue
        if cols > block and compare(forward, x[:, :block].sum(axis=1), rtol=1e-4, atol=1e-3) is None:
            raise CheckFailed(f"{label}: out holds the sum of each row's first {block} columns only: a block has "
                              f"{block} threads for {cols} columns, so each thread adds every blockDim.x-th element "
                              "(for (int c = t; c < cols; c += blockDim.x))")
        raise CheckFailed(f"{label}, compared with ORT's ReduceSum over each row: {reason}")
    return None
