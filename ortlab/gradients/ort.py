"""ORT's own C++ gradient graph builder, for comparison with ortlab's.

Wraps onnxruntime.capi._pybind_state.GradientGraphBuilder (training build), which runs
orttraining/orttraining/core/framework/gradient_graph_builder.cc on a serialized model.
"""
import copy
import tempfile

import onnx

from ortlab.env import quiet_import
from ortlab.errors import OrtlabError


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
        wanted = OUTPUTS_FOR_GRADIENTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
        for suffix in wanted[len(node.output) - 1:]:
            node.output.append(f"{node.name or f'{node.op_type}_{k}'}_{suffix}")
    return model


def ort_gradient_graph(model, x_names, loss_name):
    """The forward + backward model that ORT's C++ GradientGraphBuilder builds."""
    from ortlab.session import captured_stderr_fd

    capi = quiet_import("onnxruntime.capi._pybind_state")
    model = insert_outputs_for_gradients(model)
    try:
        builder = capi.GradientGraphBuilder(model.SerializeToString(), {loss_name}, set(x_names), loss_name)
        with tempfile.TemporaryFile(mode="w+") as log, captured_stderr_fd(log):
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
        raise OrtGradientError(f"ORT's gradient builder failed: {reason}") from None
