"""ORT's CPU kernels for the ops that hold subgraphs, where onnx.reference's runs differ from ORT 1.19.2's:
Loop's scan outputs stacked as onnxruntime/core/providers/cpu/controlflow/loop.cc does, and a missing condition
read as true, at the top level and inside other bodies; Scan bodies given the
values of the graph around them that they read (controlflow/scan_9.cc feeds the node's implicit inputs); and
SequenceMap bodies likewise (ORT inlines SequenceMap's function body, a Loop whose body reads them).
Registered when ortlab.engine.inference_session imports this module, like the other cpu_kernels modules.
"""
import numpy as np
from onnx.reference.ops.op_loop import Loop as ReferenceLoop
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_sequence_map import SequenceMap as ReferenceSequenceMap

from ortlab.engine.cpu_execution_provider import ReferenceKernel, override_reference_op
from ortlab.engine.errors import KernelFailure
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
                self._check_shape(k, it, scans[k], outputs[1 + self.N + k])
                scans[k].append(outputs[1 + self.N + k])
            cond = outputs[0]
            state = list(outputs[1:1 + self.N])
            inputs.update(dict(zip(names[2:], state)))
            it += 1
        return state, [np.stack(s) if s else self._empty_scan(k) for k, s in enumerate(scans)]

    def _check_shape(self, k, it, earlier, value):
        """ORT refuses a scan output whose shape differs from the first iteration's (loop.cc, LoopImpl::
        SaveOutputsAndUpdateFeeds: 'Inconsistent shape in loop output for output')."""
        if earlier and np.shape(value) != np.shape(earlier[0]):
            name = self.body.output_names[1 + self.N + k]
            loop = self.onnx_node.name or "(no name)"
            raise KernelFailure(f"Loop '{loop}': scan output '{name}' has shape {list(np.shape(value))} at iteration "
                                f"{it}, {list(np.shape(earlier[0]))} at iteration 0; ORT 1.19.2 refuses it "
                                f"('Inconsistent shape in loop output for output. Expected:{list(np.shape(earlier[0]))}"
                                f" Got:{list(np.shape(value))}'). Make the body yield one shape every iteration (pad "
                                "it), or carry a sequence (SequenceInsert) as a loop-carried value instead")

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


# A Loop inside an If, Loop or Scan body too: onnx.reference's own Loop reads a missing condition (cond = "",
# None there) as false and runs zero times, silently; ORT's as true (loop.cc, LoopImpl: no condition input is
# 'no condition', the loop runs until the trip count).
override_reference_op("Loop", 1, 10 ** 6)(StackingLoop)


# --- Scan -------------------------------------------------------------------------------------
def _scan_axis(what, index, axis, rank):
    """An axis of scan_input_axes (rank: the input's) or scan_output_axes (rank: the output's, + 1)."""
    if not -rank <= axis < rank:
        raise KernelFailure(f"Scan: {what}[{index}] = {axis} is out of range for rank {rank}; it must be in "
                            f"[{-rank}, {rank - 1}] (ORT: 'Invalid value in {what}')")
    return axis % rank


def _per_item(values, count):
    return [0 if values is None or i >= len(values) else int(values[i]) for i in range(count)]


class DirectedScan(OpRun):
    """Scan (opset 9 on) as ORT runs it: each scan input sliced along its scan_input_axes entry, from the
    end where its scan_input_directions entry is 1; each scan output stacked along its scan_output_axes
    entry (a scalar per iteration stacks to [n]), in reverse where its scan_output_directions entry is 1;
    the body sees the values of the graph around it that it reads. onnx.reference refuses directions and
    axes other than 0, and ignores the directions of all but the first outputs.
    ORT: onnxruntime/core/providers/cpu/controlflow/scan_9.cc, scan_utils.cc."""

    def need_context(self):
        return True

    def _run(self, *args, context=None, num_scan_inputs=None, scan_input_axes=None, scan_input_directions=None,
             scan_output_axes=None, scan_output_directions=None, attributes=None, **_):
        n_state = len(args) - num_scan_inputs
        states, scans = list(args[:n_state]), args[n_state:]
        axes = [_scan_axis("scan_input_axes", i, a, np.ndim(x))
                for i, (a, x) in enumerate(zip(_per_item(scan_input_axes, num_scan_inputs), scans))]
        length = self._sequence_length(scans, axes)
        backward = _per_item(scan_input_directions, num_scan_inputs)
        names = self.body.input_names
        per_iteration = [[] for _ in range(len(self.body.output_names) - n_state)]
        for t in range(length):
            feeds = {**(context or {}), **dict(zip(names[:n_state], states))}
            for i, x in enumerate(scans):
                feeds[names[n_state + i]] = np.take(x, length - 1 - t if backward[i] else t, axis=axes[i])
            outputs = self._run_body(feeds, attributes=attributes)
            states = list(outputs[:n_state])
            for k, value in enumerate(outputs[n_state:]):
                per_iteration[k].append(np.asarray(value))
        return tuple(states + self._stack(per_iteration, scan_output_axes, scan_output_directions))

    def _sequence_length(self, scans, axes):
        lengths = [np.shape(x)[a] for x, a in zip(scans, axes)]
        names = self.onnx_node.input[len(self.onnx_node.input) - len(scans):]
        for name, n in zip(names, lengths):
            if n != lengths[0]:
                raise KernelFailure(f"Scan inputs have inconsistent sequence lengths: {lengths[0]} for "
                                    f"'{names[0]}', {n} for '{name}' (along their scan_input_axes); give every "
                                    "scan input the same length")
        if lengths and lengths[0] == 0:
            raise KernelFailure("Scan: the scan inputs have length 0 along their scan axis; ORT 1.19.2 fails on it "
                                "('Invalid dim0_offset of 0. Dimension 0 is 0'). Give at least one element to scan")
        return lengths[0] if lengths else 0

    def _stack(self, per_iteration, axes, directions):
        out_names = self.body.output_names[len(self.body.output_names) - len(per_iteration):]
        axes, backward = _per_item(axes, len(per_iteration)), _per_item(directions, len(per_iteration))
        stacked = []
        for k, values in enumerate(per_iteration):
            shapes = {v.shape for v in values}
            if len(shapes) > 1:
                raise KernelFailure(f"Scan: body output '{out_names[k]}' changes shape between iterations "
                                    f"({[list(v.shape) for v in values]}); a scan output's per-iteration values "
                                    "must all have one shape to be stacked")
            rank = values[0].ndim + 1
            axis = _scan_axis("scan_output_axes", k, axes[k], rank)
            stacked.append(np.stack(values[::-1] if backward[k] else values, axis=axis))
        return stacked


@register_op_kernel("Scan", provider=CPU)
class OrtScan(ReferenceKernel):
    """Scan with ORT's directions, axes and outer-scope reads (DirectedScan) from opset 9; opset 8's form
    (a batch axis and sequence_lens) keeps onnx.reference's.
    ORT: onnxruntime/core/providers/cpu/controlflow/scan_9.cc."""

    def __init__(self, info):
        opsets = dict(info.node.graph.opset_imports)
        opset = opsets.get("", opsets.get("ai.onnx", 0))
        super().__init__(info, op_class=DirectedScan if opset >= 9 else None)


override_reference_op("Scan", 9, 10 ** 6)(DirectedScan)  # a Scan inside an If, Loop or Scan body too


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
