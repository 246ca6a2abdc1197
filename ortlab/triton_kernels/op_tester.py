"""op_test: an OpTester in Python. One op, run by ORT (every available provider), by ortlab's
Triton kernel and by its numpy reference, compared output by output; with cuda_cpp=True also by
ortlab's CUDA C++ kernel of the op (ortlab.cuda.op_kernels, on the CPU runner without a GPU).

Mirrors onnxruntime/test/providers/op_tester.h and base_tester.cc: AddInput/AddOutput/
AddAttribute build a one-node model, Run() executes it on each execution provider and checks
the outputs with a tolerance (ORT's default for float on CPU is 1e-4 absolute and relative;
a kernel that sums many terms may declare a larger `atol`). Random kernels (Dropout) are compared
through their invariant, since ORT's random generator is not Triton's.
"""
from dataclasses import dataclass, field

import numpy as np

from ortlab.cuda import op_kernels
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.onnx_defs import one_node_model, op_name
from ortlab.triton_kernels.executor import bind, run
from ortlab.triton_kernels.kernel_def import KernelInputError


class OpTestFailure(OrtlabError):
    """ortlab's kernel disagrees with ORT or with its numpy reference."""


@dataclass
class OpTestResult:
    """The comparison table: one row per (implementation compared, output)."""

    op: str
    shapes: list
    rows: list = field(default_factory=list)

    @property
    def ok(self):
        return all(r["ok"] for r in self.rows)

    def failures(self):
        return [r for r in self.rows if not r["ok"]]

    def summary(self):
        """Rows for a table, with the differences rounded up to a power of ten (stable across
        machines, whose BLAS and SIMD paths differ in the last bits)."""
        rows = []
        for r in self.rows:
            detail = r["detail"]
            if detail.startswith("max |diff|"):
                diff = float(detail.split()[2])
                detail = "exact" if diff == 0 else f"|diff| < 1e{int(np.floor(np.log10(diff))) + 1}"
            rows.append({"compared with": r["against"], "output": r["output"],
                         "shape": str(r["shape"]), "result": detail,
                         "ok": "yes" if r["ok"] else "NO"})
        return rows

    def __repr__(self):
        head = f"op_test {self.op} on inputs {', '.join(map(str, self.shapes))}"
        lines = [f"{r['against']:<26} {r['output']:<12} {str(r['shape']):<14} {r['detail']}"
                 for r in self.rows]
        return "\n".join([head] + lines + [f"-> {'PASS' if self.ok else 'FAIL'}"])


def op_model(kernel, arrays, n_outputs):
    """The one-node model of a kernel's op (every declared attribute set, defaults included, as
    an ORT schema may require one the call left out, e.g. BiasSoftmax's is_inner_broadcast; None
    means "not set"), and its feeds. Trailing absent optional inputs are left off."""
    while arrays and arrays[-1] is None:
        arrays = arrays[:-1]
    attributes = {k: getattr(kernel, k) for k in kernel.attributes if getattr(kernel, k) is not None}
    model = one_node_model(kernel.op_type, arrays, attributes, kernel.domain, outputs=n_outputs,
                           prefixes=("input", "output"), name=f"op_test_{kernel.op_type}")
    return model, {f"input{i}": a for i, a in enumerate(arrays) if a is not None}


def run_in_ort(model, feeds, provider):
    """Outputs of the one-node model in ORT on one provider, or the error ORT gave."""
    from ortlab.session import run_model  # lazy: ortlab.session imports onnxruntime (2 s)

    try:
        return list(run_model(model, feeds, (provider,)).values()), None
    except Exception as error:  # SessionError, or ORT's own exception classes
        text = str(error).strip()
        return None, text.splitlines()[0] if text else type(error).__name__


# What ORT says when no kernel of an EP implements a node (onnxruntime/core/framework/
# session_state.cc and kernel_registry.cc: a NOT_IMPLEMENTED status, "Could not find an
# implementation for ..."). Only this error means "ORT has no kernel for this op here".
NOT_IMPLEMENTED = ("NOT_IMPLEMENTED", "Could not find an implementation for")


def is_not_implemented(error):
    return any(marker in error for marker in NOT_IMPLEMENTED)


def compare(kernel, expected, got, against):
    """Rows comparing each output of `got` (ortlab) with `expected`."""
    rows = []
    for i, (e, g) in enumerate(zip(expected, got)):
        name = kernel.outputs[i].name if i < len(kernel.outputs) else f"output{i}"
        e, g = np.asarray(e), np.asarray(g)
        row = {"against": against, "output": name, "shape": g.shape}
        if e.shape != g.shape or e.dtype != g.dtype:
            row.update(ok=False, detail=f"shape/dtype {g.shape} {g.dtype.name}, expected "
                                        f"{e.shape} {e.dtype.name}")
        elif kernel.random or e.dtype == bool or e.size == 0:
            same = e.dtype != bool or kernel.random or np.array_equal(e, g)
            row.update(ok=same, detail="checked by invariant" if kernel.random else
                       ("equal" if same else f"{int((e != g).sum())} elements differ"))
        else:
            row.update(worst(kernel, e, g))
        rows.append(row)
    return rows


def worst(kernel, expected, got):
    """Elementwise comparison within atol + rtol * |expected|. NaN in the same place on both sides
    and equal infinities count as equal (ORT's OpTester compares NaN positions the same way,
    onnxruntime/test/providers/checkers.cc); a NaN or inf on one side only is a mismatch."""
    e, g = expected.astype(np.float64), got.astype(np.float64)
    same = (e == g) | (np.isnan(e) & np.isnan(g))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(e - g))
    allowed = kernel.atol + kernel.rtol * np.abs(np.where(np.isfinite(e), e, 0.0))
    bad = ~same & ~(diff <= allowed)  # NaN (on one side only) counts as bad
    if not bad.any():
        return {"ok": True, "detail": f"max |diff| {diff.max():.1e} <= atol {kernel.atol:g}"}
    index = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1))),
                             diff.shape)
    return {"ok": False, "detail": f"{int(bad.sum())} of {diff.size} elements off; worst at index "
                                   f"{tuple(int(i) for i in index)}: got {got[index]!r}, "
                                   f"expected {expected[index]!r}"}


def op_test(op_type, inputs, attributes=None, domain="", providers=None, cuda_cpp=False):
    """Run one op in ORT (each provider), in ortlab's Triton kernel and in its numpy reference,
    and compare. cuda_cpp: also run ortlab's CUDA C++ kernel of the op and compare it with the same
    outputs, at the Triton kernel's tolerance (a kernel that declines these inputs is a row saying why).
    Returns an OpTestResult; raises OpTestFailure naming the op, the inputs' shapes and the worst
    element when any comparison fails.
    """
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, dict):
        raise KernelInputError(f"op_test: attributes must be a dict {{name: value}}, not "
                               f"{type(attributes).__name__}")
    if not isinstance(inputs, (list, tuple)):
        raise KernelInputError(f"op_test: inputs must be a list of arrays (None for an absent optional "
                               f"input), not {type(inputs).__name__}")
    kernel, arrays = bind(op_type, inputs, domain, **attributes)
    attributes = dict(kernel.given)  # checked, numpy scalars made Python ones
    ours = run(op_type, *arrays, domain=domain, **attributes)
    result = OpTestResult(op_name(kernel.op_type, kernel.domain),
                          [None if a is None else tuple(a.shape) for a in arrays])
    result.rows += check_random(kernel, arrays, ours, "invariant (ortlab)")
    reference = kernel.reference(*arrays)
    result.rows += check_random(kernel, arrays, reference, "invariant (numpy reference)")
    result.rows += compare(kernel, reference, ours, "numpy reference")
    model, feeds = op_model(kernel, arrays, len(ours))
    ort = quiet_import("onnxruntime")
    cuda = cuda_outputs(kernel, arrays, attributes) if cuda_cpp else None
    if isinstance(cuda, dict):
        result.rows.append(cuda)
        cuda = None
    if cuda is not None:
        result.rows += check_random(kernel, arrays, cuda, "invariant (CUDA C++)")
        result.rows += compare(kernel, reference, cuda, "numpy reference, CUDA C++")
    for provider in providers or ort.get_available_providers():
        if provider not in ("CPUExecutionProvider", "CUDAExecutionProvider"):
            continue
        outputs, error = run_in_ort(model, feeds, provider)
        label = f"ORT {provider.replace('ExecutionProvider', '')}"
        if error is not None:
            known = (not kernel.ort_cpu and provider == "CPUExecutionProvider"
                     and is_not_implemented(error))
            result.rows.append({"against": label, "output": "-", "shape": "-", "ok": known,
                                "detail": ("no CPU kernel in ORT (CUDA only)" if known
                                           else f"ORT failed: {error[:300]}")})
            continue
        result.rows += check_random(kernel, arrays, outputs, f"invariant ({label})")
        result.rows += compare(kernel, outputs, ours, label)
        if cuda is not None:
            result.rows += compare(kernel, outputs, cuda, f"{label}, CUDA C++")
    if not result.ok:
        raise OpTestFailure(failure_message(result))
    return result


def cuda_outputs(kernel, arrays, attributes):
    """The outputs of ortlab's CUDA C++ kernel of the op (ortlab.cuda.op_kernels), or a result row saying
    that there is none or that it declines these inputs."""
    row = {"against": "CUDA C++ kernel", "output": "-", "shape": "-", "ok": False}
    if op_kernels.registered(kernel.op_type, kernel.domain) is None:
        return {**row, "detail": "op_test(cuda_cpp=True): ortlab.cuda.op_kernels has no kernel for this op"}
    try:
        return op_kernels.run_op(kernel.op_type, kernel.domain, attributes, list(arrays))
    except op_kernels.CudaOpError as error:
        return {**row, "ok": True, "detail": f"declined: {error}"}


def check_random(kernel, inputs, outputs, against):
    if not kernel.random:
        return []
    problems = kernel.invariant(inputs, outputs)
    return [{"against": against, "output": "all", "shape": "-", "ok": not problems,
             "detail": "; ".join(problems) or "holds"}]


def failure_message(result):
    lines = [f"{r['against']}, output '{r['output']}': {r['detail']}" for r in result.failures()]
    return (f"{result.op} on inputs of shapes {', '.join(map(str, result.shapes))} does not match:\n  "
            + "\n  ".join(lines))
