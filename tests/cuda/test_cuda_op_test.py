"""op_test(cuda_cpp=True): each of ORT's training kernels written in CUDA C++ (ortlab.cuda.op_kernels, run by
the CPU runner here) against ORT 1.19.2's CPU kernel and the numpy reference, on each op's example inputs at
sizes with tails (columns not a multiple of a block, a single column, more than 1024 columns)."""
import numpy as np
import pytest

import ortlab.triton_kernels as K
from ortlab.cuda import op_kernels
from ortlab.triton_kernels.op_tester import OpTestFailure
from ortlab.onnx_defs import op_name

SIZES = [(3, 37), (37, 300), (5, 2), (9, 1030)]  # (5, 1): ORT's CPU LayerNormalizationGrad itself fails
# The Triton kernels' examples as they are, except ReduceSum's, which reduces the leading axis: reduce_sum.cu
# takes trailing axes only (its refusal is tested below), so its case reduces the last axis.
ADJUST = {("ReduceSum", ""): lambda inputs: [inputs[0], np.array([-1], np.int64)]}


def example(key, rows, cols):
    kernel_cls = K.KERNELS[key]
    inputs, attributes = kernel_cls.example(np.random.default_rng(rows * 1000 + cols), rows=rows, cols=cols)
    return kernel_cls, ADJUST.get(key, list)(inputs), attributes


@pytest.mark.parametrize("rows, cols", SIZES)
@pytest.mark.parametrize("key", sorted(op_kernels.OPS), ids=lambda key: op_name(*key))
def test_each_cuda_cpp_kernel_equals_orts_cpu_kernel_in_op_test(key, rows, cols):
    kernel_cls, inputs, attributes = example(key, rows, cols)
    result = K.op_test(kernel_cls.op_type, inputs, attributes, domain=kernel_cls.domain, cuda_cpp=True)
    against = {row["against"] for row in result.rows}
    assert "ORT CPU, CUDA C++" in against and "numpy reference, CUDA C++" in against, repr(result)
    if kernel_cls.random:
        assert "invariant (CUDA C++)" in against


def test_a_wrong_cuda_cpp_result_fails_op_test_and_names_it(monkeypatch):
    kernel_cls, inputs, attributes = example(("LayerNormalization", ""), 37, 300)
    right = op_kernels.run_op

    def off_by_a_little(*args, **kwargs):
        outputs = right(*args, **kwargs)
        outputs[0] = outputs[0] + np.float32(1e-3)
        return outputs
    monkeypatch.setattr(op_kernels, "run_op", off_by_a_little)
    with pytest.raises(OpTestFailure, match="ORT CPU, CUDA C\\+\\+, output 'Y'"):
        K.op_test(kernel_cls.op_type, inputs, attributes, cuda_cpp=True)
    K.op_test(kernel_cls.op_type, inputs, attributes)  # the Triton kernel alone still passes


def test_an_op_without_a_cuda_cpp_kernel_or_inputs_it_declines_say_so():
    x = np.random.default_rng(0).standard_normal((3, 37)).astype(np.float32)
    with pytest.raises(OpTestFailure, match="ortlab.cuda.op_kernels has no kernel for this op"):
        K.op_test("Softmax", [x], {"axis": -1}, cuda_cpp=True)
    result = K.op_test("ReduceSum", [x, np.array([0], np.int64)], {"keepdims": 0}, cuda_cpp=True)
    declined = [r for r in result.rows if r["against"] == "CUDA C++ kernel"]
    assert len(declined) == 1 and "not the trailing axes" in declined[0]["detail"]
