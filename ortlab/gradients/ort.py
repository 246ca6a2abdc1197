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


def insert_softmax_cross_entropy_loss_output(model):
    """A copy of `model` whose SoftmaxCrossEntropyLoss nodes also output their log-probabilities.

    Mirrors ORT's InsertSoftmaxCrossEntropyLossOutput rewrite (orttraining/orttraining/core/
    optimizer/insert_output_rewriter.cc), one of the pre-training transformers: the gradient
    builder reads that output, and the pybind builder does not run the rewrite itself.
    """
    model = copy.deepcopy(model)
    for k, node in enumerate(model.graph.node):
        if node.op_type == "SoftmaxCrossEntropyLoss" and len(node.output) < 2:
            node.output.append(f"{node.name or f'sce_{k}'}_log_prob")
    return model


def ort_gradient_graph(model, x_names, loss_name):
    """The forward + backward model that ORT's C++ GradientGraphBuilder builds."""
    from ortlab.session import captured_stderr_fd

    capi = quiet_import("onnxruntime.capi._pybind_state")
    model = insert_softmax_cross_entropy_loss_output(model)
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
