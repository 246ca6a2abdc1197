"""ortlab.gradients: per-op gradient builders and the gradient graph builder.

    build_gradient_graph(model, x_names, loss_name, stop_gradient_edges=None) -> onnx.ModelProto
    ort_gradient_graph(model, x_names, loss_name)      ORT's C++ builder, for comparison
    check_gradient(...)                                 numeric check, as ORT's GradientChecker
    @register_gradient("Op", domain="")                 add a builder (one function per op)
"""
from ortlab.gradients import builders_elementwise, builders_nn, builders_tensor  # noqa: F401 (they register)
from ortlab.gradients.builder_base import GradientBuilderBase, GradientBuilderError
from ortlab.gradients.checker import GradientCheck, check_gradient, numeric_gradient
from ortlab.gradients.graph_builder import GradientGraphBuilder, GradientGraphError, build_gradient_graph
from ortlab.gradients.ort import OrtGradientError, ort_gradient_graph
from ortlab.gradients.registry import (GRADIENT_BUILDERS, STOP_GRADIENT_EDGES, UnknownGradientError,
                                       get_gradient_builder, register_gradient)

__all__ = ["GRADIENT_BUILDERS", "STOP_GRADIENT_EDGES", "GradientBuilderBase", "GradientBuilderError",
           "GradientCheck", "check_gradient", "numeric_gradient",
           "GradientGraphBuilder", "GradientGraphError", "OrtGradientError", "UnknownGradientError",
           "build_gradient_graph", "get_gradient_builder", "ort_gradient_graph", "register_gradient"]
