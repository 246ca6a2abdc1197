"""The errors of ortlab.ir: each a GraphError, so `except GraphError` catches every refusal.

Mirrors the Status messages of onnxruntime/core/graph/graph.cc (Graph::Resolve and its
helpers): a duplicate producer, an input nothing provides, an unknown op, a cycle.
"""
from ortlab.errors import OrtlabError


class GraphError(OrtlabError):
    """A graph is not valid: see the message for what and where."""


class UnknownOpError(GraphError):
    """A node's op (or its domain or opset) is not known."""


class MissingInputError(GraphError):
    """A node reads a value that no node, graph input or initializer provides."""


class DuplicateProducerError(GraphError):
    """Two nodes produce the same value (ONNX graphs are in single-assignment form)."""


class GraphCycleError(GraphError):
    """The graph has a cycle, so it has no topological order."""
