"""ortlab.gradients: per-op gradient builders and the gradient graph builder.

    build_gradient_graph(model, x_names, loss_name, stop_gradient_edges=None) -> onnx.ModelProto
    ort_gradient_graph(model, x_names, loss_name)      ORT's C++ builder, for comparison
    check_gradient(...)                                 numeric check, as ORT's GradientChecker
    @register_gradient("Op", domain="")                 add a builder (one function per op)
    register_ort_gradient("Op", builder_or_definition)  add a gradient to ORT's own C++ builder
"""
from ortlab.gradients import builders_conv, builders_elementwise, builders_nn, builders_tensor  # noqa: F401 (they register)
from ortlab.gradients.builder_base import GradientBuilderBase, GradientBuilderError
from ortlab.gradients.checker import GradientCheck, GradientCheckError, check_gradient, numeric_gradient
from ortlab.gradients.external import builder_from_definition, gradient_definition, register_ort_gradient
from ortlab.gradients.graph_builder import GradientGraphBuilder, GradientGraphError, build_gradient_graph
from ortlab.gradients.ort import OrtGradientError, ort_gradient_graph
from ortlab.gradients.registry import (GRADIENT_BUILDERS, STOP_GRADIENT_EDGES, UnknownGradientError,
                                       get_gradient_builder, register_gradient, using_gradient)

__all__ = ["GRADIENT_BUILDERS", "STOP_GRADIENT_EDGES", "GradientBuilderBase", "GradientBuilderError",
           "GradientCheckError",
           "GradientCheck", "check_gradient", "numeric_gradient",
           "GradientGraphBuilder", "GradientGraphError", "OrtGradientError", "UnknownGradientError",
           "build_gradient_graph", "builder_from_definition", "get_gradient_builder", "gradient_definition",
           "ort_gradient_graph", "register_gradient", "register_ort_gradient", "using_gradient"]
