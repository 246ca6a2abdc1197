"""op_test: an OpTester in Python. One op, run by ORT (every available provider), by ortlab's
Triton kernel and by its numpy reference, compared output by output.

Mirrors onnxruntime/test/providers/op_tester.h and base_tester.cc: AddInput/AddOutput/
AddAttribute build a one-node model, Run() executes it on each execution provider and checks
the outputs with a tolerance (ORT's default for float on CPU is 1e-4 absolute and relative;
kernels that sum many terms declare a larger `atol`). Random kernels (Dropout) are compared
through their invariant, since ORT's random generator is not Triton's.
"""
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from ortlab.errors import OrtlabError
from ortlab.kernels.launch import bind, run

OPSET = 17


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


def one_node_model(op_type, inputs, n_outputs, attributes, domain=""):
    """A ModelProto with one node; absent optional inputs get the empty name, as in ONNX."""
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    names = ["" if a is None else f"input{i}" for i, a in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"output{i}" for i in range(n_outputs)],
                            domain=domain or None, **attributes)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                  a.shape)
                    for n, a in zip(names, inputs) if a is not None]
    graph = helper.make_graph([node], f"op_test_{op_type}", graph_inputs,
                              [onnx.ValueInfoProto(name=f"output{i}") for i in range(n_outputs)])
    imports = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    feeds = {n: a for n, a in zip(names, inputs) if a is not None}
    return model, feeds


def run_in_ort(model, feeds, provider):
    """Outputs of the one-node model in ORT on one provider, or the error ORT gave."""
    from ortlab.session import SessionError, create, session_options

    try:
        session = create(model, session_options("disable"), [provider])
        return session.run(None, feeds), None
    except (SessionError, Exception) as error:  # ORT raises its own exception classes
        return None, str(error).splitlines()[0][:160]


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
    diff = np.abs(expected.astype(np.float64) - got.astype(np.float64))
    allowed = kernel.atol + kernel.rtol * np.abs(expected.astype(np.float64))
    bad = ~(diff <= allowed)  # NaN counts as bad
    if not bad.any():
        return {"ok": True, "detail": f"max |diff| {diff.max():.1e} <= atol {kernel.atol:g}"}
    index = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1))),
                             diff.shape)
    return {"ok": False, "detail": f"{int(bad.sum())} of {diff.size} elements off; worst at index "
                                   f"{tuple(int(i) for i in index)}: got {got[index]!r}, "
                                   f"expected {expected[index]!r}"}


def op_test(op_type, inputs, attributes=None, domain="", providers=None):
    """Run one op in ORT (each provider), in ortlab's Triton kernel and in its numpy reference,
    and compare. Returns an OpTestResult; raises OpTestFailure naming the op, the inputs'
    shapes and the worst element when any comparison fails.
    """
    from ortlab.env import quiet_import

    attributes = dict(attributes or {})
    kernel, arrays = bind(op_type, inputs, domain, **attributes)
    ours = run(op_type, *arrays, domain=domain, **attributes)
    result = OpTestResult(f"{domain or 'ai.onnx'}::{op_type}",
                          [None if a is None else tuple(a.shape) for a in arrays])
    result.rows += check_random(kernel, arrays, ours, "invariant (ortlab)")
    reference = kernel.reference(*arrays)
    result.rows += check_random(kernel, arrays, reference, "invariant (numpy reference)")
    result.rows += compare(kernel, reference, ours, "numpy reference")
    model, feeds = one_node_model(op_type, arrays, len(ours), attributes, kernel.domain)
    ort = quiet_import("onnxruntime")
    for provider in providers or ort.get_available_providers():
        if provider not in ("CPUExecutionProvider", "CUDAExecutionProvider"):
            continue
        outputs, error = run_in_ort(model, feeds, provider)
        label = f"ORT {provider.replace('ExecutionProvider', '')}"
        if error is not None:
            known = not kernel.ort_cpu and provider == "CPUExecutionProvider"
            result.rows.append({"against": label, "output": "-", "shape": "-", "ok": known,
                                "detail": ("no CPU kernel in ORT (CUDA only)" if known else error)})
            continue
        result.rows += check_random(kernel, arrays, outputs, f"invariant ({label})")
        result.rows += compare(kernel, outputs, ours, label)
    if not result.ok:
        raise OpTestFailure(failure_message(result))
    return result


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
