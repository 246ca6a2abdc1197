"""ORT's own C++ gradient graph builder, for comparison with ortlab's.

Wraps onnxruntime.capi._pybind_state.GradientGraphBuilder (training build), which runs
orttraining/orttraining/core/framework/gradient_graph_builder.cc on a serialized model.
"""
import copy

import onnx

from ortlab.capture import captured_lines
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.gradients.graph_builder import check_loss_name, check_x_names
from ortlab.onnx_defs import domain_of


class OrtGradientError(OrtlabError):
    """ORT's C++ gradient builder refused the model; the message carries ORT's reason."""


# Optional outputs that ORT's gradient builders read (gradient_builder.cc: I/O indices they ask for),
# and that an exporter may leave out: op type -> names of the outputs to add, by suffix.
OUTPUTS_FOR_GRADIENTS = {"SoftmaxCrossEntropyLoss": ("log_prob",),
                         "LayerNormalization": ("saved_mean", "saved_inv_std_var"),
                         "Dropout": ("mask",)}


def insert_outputs_for_gradients(model):
    """A copy of `model` whose nodes carry the optional outputs their ORT gradient builders read:
    SoftmaxCrossEntropyLoss's log-probabilities, LayerNormalization's mean and inverse standard
    deviation, Dropout's mask.

    Mirrors ORT's InsertSoftmaxCrossEntropyLossOutput rewrite (orttraining/orttraining/core/
    optimizer/insert_output_rewriter.cc), one of the pre-training transformers, and what
    ORTModule's own export symbolics do for layer_norm; the pybind builder does neither itself,
    and without them it fails with "i < node_->OutputDefs().size()" (gradient_builder_base.h).
    """
    model = copy.deepcopy(model)
    for k, node in enumerate(model.graph.node):
        wanted = OUTPUTS_FOR_GRADIENTS.get(node.op_type, ()) if not domain_of(node.domain) else ()
        for suffix in wanted[len(node.output) - 1:]:
            node.output.append(f"{node.name or f'{node.op_type}_{k}'}_{suffix}")
    return model


def check_arguments(model, x_names, loss_name):
    """The arguments checked as build_gradient_graph checks them (one str is one x name), with
    the names looked up in the model, so that ORT's C++ checks never see a bad one."""
    if not isinstance(model, onnx.ModelProto):
        raise OrtGradientError(f"the model must be an onnx.ModelProto, not {type(model).__name__}")
    x_names = check_x_names(x_names, OrtGradientError)
    loss_name = check_loss_name(loss_name, OrtGradientError)
    g = model.graph
    produced = {o for n in g.node for o in n.output if o}
    values = produced | {i.name for i in g.input} | {t.name for t in g.initializer}
    for x in x_names:
        if x not in values:
            raise OrtGradientError(f"x {x!r} is not a value of the graph; inputs: {[i.name for i in g.input]}, "
                                   f"initializers: {sorted(t.name for t in g.initializer)[:8]}...")
    if loss_name not in produced:
        raise OrtGradientError(f"the loss {loss_name!r} is not produced by any node of the graph; graph "
                               f"outputs are {[o.name for o in g.output]}")
    loss_type = _elem_type(model, loss_name)
    if loss_type is not None and loss_type not in FLOAT_TYPES:
        raise OrtGradientError(f"the loss {loss_name!r} is {onnx.TensorProto.DataType.Name(loss_type).lower()}: "
                               "a gradient needs a floating-point loss; cast it to float (Cast to=FLOAT) "
                               "or pick a float value as the loss")
    return x_names, loss_name


FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16}


def _elem_type(model, name):
    """The element type onnx's shape inference gives `name`, or None where it cannot tell."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # contrib ops or a graph inference cannot follow: leave it to ORT
        return None
    g = inferred.graph
    for info in [*g.value_info, *g.output, *g.input]:
        if info.name == name and info.type.tensor_type.elem_type:
            return info.type.tensor_type.elem_type
    return None


def ort_gradient_graph(model, x_names, loss_name):
    """The forward + backward model that ORT's C++ GradientGraphBuilder builds.

    x_names: a list of names, or one name as a str (as build_gradient_graph takes them).
    """
    x_names, loss_name = check_arguments(model, x_names, loss_name)
    capi = quiet_import("onnxruntime.capi._pybind_state")
    model = insert_outputs_for_gradients(model)
    try:
        with captured_lines(fds=(2,), python=False):  # ORT logs the build to stderr
            builder = capi.GradientGraphBuilder(model.SerializeToString(), {loss_name}, set(x_names), loss_name)
            builder.build()
        return onnx.load_from_string(builder.get_model())
    except Exception as exc:
        reason = str(exc).splitlines()[0]
        reason = reason.split("[ONNXRuntimeError] : 1 : FAIL : ")[-1]  # a Status: its message
        check, _, message = reason.partition(" was false. ")  # ORT's C++ check, then its message
        if message.strip() or not _:
            reason = message.strip() or reason
        else:  # a bare ORT_ENFORCE: name the condition and where it failed
            where = check.split(" ")[0].rsplit("/", 1)[-1]
            reason = f"{check.rsplit(') const ', 1)[-1]} was false ({where})"
        raise OrtGradientError(f"ORT's gradient builder failed: {reason}{_advice(reason)}") from None


def _advice(reason):
    """What to do when ORT's C++ builder has no builder for an op (gradient_builder_registry.cc)."""
    if "gradient builder has not been registered" not in reason:
        return ""
    op = reason.split("registered: ", 1)[-1].split(" for node")[0].strip()
    replaced = {"BatchNormalization": " ORTModule gets past this one because its pre-training transformer "
                                      "BatchNormReplacement first turns it into BatchNormInternal, which has "
                                      "a builder."}
    return (f". ORT's C++ builder has no gradient for {op} as it is in this graph.{replaced.get(op, '')} "
            "Register a gradient definition for it (register_ort_gradient, as lab03 does), build with "
            "ortlab's builder (gradient_builder='ortlab') if it has one, or keep the op off the path from "
            "the weights to the loss")
