"""ORT's CPU kernels for the ops that hold subgraphs, where onnx.reference's runs differ from ORT 1.19.2's:
Loop's scan outputs stacked as onnxruntime/core/providers/cpu/controlflow/loop.cc does; Scan bodies given the
values of the graph around them that they read (controlflow/scan_9.cc feeds the node's implicit inputs); and
SequenceMap bodies likewise (ORT inlines SequenceMap's function body, a Loop whose body reads them).
Registered when ortlab.engine.inference_session imports this module, like the other cpu_kernels modules.
"""
import numpy as np
from onnx.reference.ops.op_loop import Loop as ReferenceLoop
from onnx.reference.ops.op_scan import Scan as ReferenceScan
from onnx.reference.ops.op_sequence_map import SequenceMap as ReferenceSequenceMap

from ortlab.engine.cpu_execution_provider import ReferenceKernel
from ortlab.engine.kernel_registry import CPU, register_op_kernel
from ortlab.ir.tensor_value import np_dtype


# --- Loop -------------------------------------------------------------------------------------
class StackingLoop(ReferenceLoop):
    """onnx.reference's Loop with ORT's scan outputs: per-iteration values stacked on a new first
    axis (the reference's np.vstack gives [N, 1] for scalars and [N*a, b] for [a, b]); a missing
    condition means true; zero iterations give empty outputs of the body's rank + 1 (loop.cc)."""

    def _run(self, M, cond, *args, context=None, body=None, attributes=None):  # noqa: N803 (ONNX's name)
        cond = np.array(True) if cond is None else cond
        state, stacked = self._iterate(M, cond, args, context, attributes)
        return tuple(state + stacked)

    def _iterate(self, M, cond, args, context, attributes):  # noqa: N803
        body = self.body
        names = body.input_names
        inputs = {name: None for name in names}
        inputs.update(dict(zip(names[2:], args)))
        inputs.update(context or {})
        scans = [[] for _ in range(self.K)]
        state = list(args)
        it = 0
        while bool(cond) and (M is None or it < M):
            inputs[names[0]] = np.array(it, dtype=np.int64 if M is None else M.dtype)
            inputs[names[1]] = cond
            outputs = self._run_body(inputs, attributes=attributes)
            for k in range(self.K):
                scans[k].append(outputs[1 + self.N + k])
            cond = outputs[0]
            state = list(outputs[1:1 + self.N])
            inputs.update(dict(zip(names[2:], state)))
            it += 1
        return state, [np.stack(s) if s else self._empty_scan(k) for k, s in enumerate(scans)]

    def _empty_scan(self, k):
        """ORT's output of a scan that ran zero times: [0] + the body output's dims (0 for a
        symbolic one), [0] when the body declares no shape (loop.cc, LoopImpl::Execute)."""
        body = next(a.g for a in self.onnx_node.attribute if a.name == "body")
        t = body.output[1 + self.N + k].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim] \
            if t.HasField("shape") else []
        dtype = np_dtype(t.elem_type) if t.elem_type else np.float32
        return np.zeros([0] + dims, dtype=dtype)


@register_op_kernel("Loop", provider=CPU)
class OrtLoop(ReferenceKernel):
    """Loop with ORT's scan outputs (see StackingLoop).
    ORT: onnxruntime/core/providers/cpu/controlflow/loop.cc."""

    def __init__(self, info):
        super().__init__(info, op_class=StackingLoop)


# --- Scan -------------------------------------------------------------------------------------
class ScopedScan(ReferenceScan):
    """onnx.reference's Scan with the body's outer-scope reads: each iteration's body sees the values of
    the graph around it it reads (ORT: scan_9.cc runs the body with the node's implicit inputs as feeds)."""

    def __init__(self, onnx_node, run_params):
        super().__init__(onnx_node, run_params)
        self._outer, body = {}, self._run_body  # (an instance attribute onnx.reference makes per graph)
        self._run_body = lambda inputs, attributes=None: body({**self._outer, **inputs}, attributes=attributes)

    def need_context(self):
        return True

    def _run(self, *args, context=None, **attributes):
        self._outer = context or {}
        return super()._run(*args, **attributes)


@register_op_kernel("Scan", provider=CPU)
class OrtScan(ReferenceKernel):
    """Scan whose body may read values of the graph around it (see ScopedScan).
    ORT: onnxruntime/core/providers/cpu/controlflow/scan_9.cc."""

    def __init__(self, info):
        opsets = dict(info.node.graph.opset_imports)
        opset = opsets.get("", opsets.get("ai.onnx", 0))
        super().__init__(info, op_class=ScopedScan if opset >= 9 else None)  # opset 8's form: the reference's


# --- SequenceMap ------------------------------------------------------------------------------
class ScopedBody:
    """A subgraph's evaluator whose every run also sees the outer-scope values it reads."""

    def __init__(self, body, outer):
        self.body, self.outer = body, outer

    def __getattr__(self, name):
        return getattr(self.body, name)

    def run(self, names, feeds, **kwargs):
        return self.body.run(names, {**self.outer, **feeds}, **kwargs)


class ScopedSequenceMap(ReferenceSequenceMap):
    """onnx.reference's SequenceMap with the body's outer-scope reads (ORT inlines SequenceMap's function
    body, a Loop, whose body reads the implicit inputs)."""

    def need_context(self):
        return True

    def _run(self, *args, context=None, body=None, attributes=None):
        return super()._run(*args, body=ScopedBody(body or self.body, context or {}), attributes=attributes)


@register_op_kernel("SequenceMap", provider=CPU)
class OrtSequenceMap(ReferenceKernel):
    """SequenceMap whose body may read values of the graph around it (see ScopedSequenceMap)."""

    def __init__(self, info):
        super().__init__(info, op_class=ScopedSequenceMap)
