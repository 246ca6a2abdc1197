"""An override sits in front of the built-in kernel, as ORT's custom registries sit in front of an EP's own:
removing it brings the built-in back."""
import numpy as np

from ortlab.engine import register_op_kernel, unregister_op_kernel
from ortlab.engine.kernel_registry import registered_kernels
from ortlab.onnx_defs import op_key


def _relu_class():
    return registered_kernels("CPUExecutionProvider").kernels.get(op_key("Relu", "")).kernel_class.__name__


def test_unregistering_an_override_restores_the_built_in_kernel():
    built_in = _relu_class()
    def relu_first(ctx):
        return np.maximum(ctx.input(0), 0)

    def relu_second(ctx):
        return np.maximum(ctx.input(0), 0)

    register_op_kernel("Relu", override=True)(relu_first)
    register_op_kernel("Relu", override=True)(relu_second)
    assert _relu_class() != built_in
    unregister_op_kernel("Relu")  # the second goes; the first is back
    assert _relu_class() not in (built_in, None)
    unregister_op_kernel("Relu")
    assert _relu_class() == built_in
    assert unregister_op_kernel("NoSuchOp") is None
