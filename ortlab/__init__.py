"""ortlab: small, readable teaching implementations of ONNX Runtime's training machinery.

Each module mirrors one ORT concept and names the ORT source file it follows;
the notebooks show each next to the real ONNX Runtime.
"""
from ortlab.errors import OrtlabError

__version__ = "0.1.0"
__all__ = ["OrtlabError", "__version__"]
