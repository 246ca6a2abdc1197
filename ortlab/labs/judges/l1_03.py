"""The checks of L1_03's exercises (run where the learner's code cannot reach them).

'binding_outcomes' runs each scenario on onnxruntime 1.19.2 itself: the reasons below are read in
onnxruntime/core/session/IOBinding.cc and inference_session.cc (a binding's outputs are passed as the run's fetches,
so a buffer left there is pre-allocated for the next run), onnxruntime_pybind_iobinding.cc and
onnxruntime_pybind_mlvalue.cc (a numpy input that is not C-contiguous is copied when bound) and
core/framework/execution_frame.cc and utils.cc (a pre-allocated fetch must have the output's type and shape).
'bind_torch' compares what the learner's binding left in the torch tensor with ORT's own run of each batch.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, same_keys
from ortlab.labs.l1_03 import (GUARD, LABELS, bind_torch_batches, predicted_outcomes, scenario_outcome,
                               torch_bound_runs)

WHY = {
    "kept_get_outputs": "Y was bound to a device with no buffer, so run 1 allocated it and the binding keeps that "
                        "buffer as its output; run 2 gets it back as a pre-allocated fetch and writes over it, and "
                        ".numpy() is a view of that buffer, not a copy",
    "kept_copy": "copy_outputs_to_cpu() returns new numpy arrays: run 2 writes over the binding's buffer, not the copy",
    "strided_input": "a numpy array that is not C-contiguous (every other column) is copied into a dense buffer "
                     "when it is bound, so the run reads that copy, made before the values were doubled",
    "ortvalue_input": "ortvalue_from_numpy wraps a dense array without a copy, and bind_ortvalue_input binds that "
                      "OrtValue itself: the run reads the caller's memory as it is when the run starts",
    "float64_buffer": "a buffer bound to an output is handed to the run as a pre-allocated fetch, which must have the "
                      "output's type: ORT refuses a float64 buffer for float32 Y ('Unexpected output data type')",
    "batch_grows": "run 1's buffer for Y stays bound as a pre-allocated fetch of shape {4,8}; with 6 rows Relu asks "
                   "for {6,8} and the frame refuses ('OrtValue shape verification failed'); clear_binding_outputs() "
                   "and bind_output('Y') again would let the run allocate",
    "rebound_by_device": "binding Y again replaces what the binding held for it: bind_output('Y', 'cpu') leaves no "
                         "buffer, so run 2 allocates a new one and out keeps run 1's values",
}


def _said(value):
    return repr(value) if value == "error" else str(value)


def binding_outcomes(remote, fn):
    got = remote.call(predicted_outcomes, fn)
    same_keys(got, LABELS, "scenario", "True, False or 'error'")
    for label in LABELS:
        truth = scenario_outcome(label)
        if got[label] != truth:
            outcome = "raises" if truth == "error" else f"sets answer = {truth}"
            raise CheckFailed(f"{label}: on ORT 1.19.2 the scenario {outcome}, you said {_said(got[label])}: "
                              f"{WHY[label]}")
    return None


def _ort_y(batch):
    from ortlab import session  # lazy: loaded when the check runs (every judge is imported before a learner's cell)
    from ortlab.walkthroughs import iobinding_dlpack as bv  # lazy: loaded only when this runs

    return session.run_model(bv.mlp_model(), {"X": batch})["Y"]


ROWS = (3, 5)  # batch sizes the notebook never shows, so a shape copied from it fails


def bind_torch(remote, fn):
    for rows in ROWS:
        batches = bind_torch_batches(rows, runs=2, seed=rows)
        runs = remote.call(torch_bound_runs, fn, batches)
        for k, (batch, run) in enumerate(zip(batches, runs)):
            where = f"batch of {rows} rows, run {k + 1}"
            if "error" in run:
                text = run["error"]
                if "shape verification failed" in text or "Got invalid dimensions" in text:
                    raise CheckFailed(f"{where}: ORT refused the run ({_short(text)}): a buffer bound with a shape "
                                      f"other than the tensor's; take the shape from the tensor, list(t.shape), "
                                      f"never from the notebook's batch of 4")
                raise CheckFailed(f"{where}: ORT refused the run: {_short(text)}")
            want = _ort_y(batch)
            t_y, after = run["t_y"], run["after"]
            if not np.all(after == GUARD):
                raise CheckFailed(f"{where}: ORT wrote past the end of t_y ({rows} rows): Y was bound with more rows "
                                  f"than t_y has; take the shape from the tensor, list(t_y.shape), never from the "
                                  f"notebook's batch of 4")
            if np.allclose(t_y, want, rtol=1e-5, atol=1e-5):
                continue
            if np.all(t_y == GUARD):
                raise CheckFailed(f"{where}: t_y was not written: ORT wrote Y into a buffer of its own "
                                  "(bind_output(name, 'cpu') leaves the allocation to the run); bind t_y's memory "
                                  "as Y, by an OrtValue over it (dlpack) or by its address")
            if k and np.allclose(t_y, _ort_y(batches[0]), rtol=1e-5, atol=1e-5):
                raise CheckFailed(f"{where}: t_y holds the first batch's Y again: the run read X from a copy of t_x "
                                  "made when you bound it, not t_x's memory, where the new batch was written; bind "
                                  "t_x itself (a dlpack OrtValue over it, its address, or t_x.numpy(), a view)")
            diff = float(np.abs(t_y - want).max())
            raise CheckFailed(f"{where}: t_y does not hold ORT's Y for the batch in t_x (largest difference "
                              f"{diff:.3g}): did X read t_x's memory, and Y write t_y's?")
    return None


def _short(text):
    for marker in ("OrtValue shape verification failed", "Status Message:", "Error in execution:"):
        if marker in text:
            text = text[text.index(marker):]
            break
    return text.splitlines()[0][:200]
