"""The checks of lab05_kernel (run where the learner's code cannot reach them).

The learner's kernel runs in the learner's process (ortlab.labs.lab05.run_kernel, bounds-checked);
its dX comes back as data and is replayed here into ortlab's op_test, which compares it with ORT's
own GeluGrad on the same inputs: the shapes catch the usual mistakes (an exact multiple of the
block, a 2-D input, a tail, a tail longer than one block).
"""
from ortlab.triton_kernels import KERNELS, op_test
from ortlab.triton_kernels.op_tester import OpTestFailure
from ortlab.triton_kernels.ops.gelu import GeluGrad
from ortlab.labs.checks import CheckFailed
from ortlab.labs.lab05 import SHAPES, inputs_for, kernel_facts, registered_facts, run_kernel, where_it_fails
from ortlab.onnx_defs import MS_DOMAIN as MS


def _replay(outputs):
    """A GeluGrad kernel class whose compute returns `outputs` (what the learner's returned)."""
    class Replayed(GeluGrad):
        def compute(self, dy, x):
            return outputs

    return Replayed


def op_test_shapes(remote, kernel_fn):
    """op_test on SHAPES of what the learner's kernel computed; None, or why it failed."""
    for shape in SHAPES:
        outputs = remote.call(run_kernel, kernel_fn, list(shape))
        if isinstance(outputs, str):  # out of bounds, said by the bounds check
            return outputs
        try:
            with KERNELS.using(("GeluGrad", MS), _replay(outputs)):
                op_test("GeluGrad", inputs_for(shape), domain=MS)
        except OpTestFailure as failure:
            detail = str(failure).splitlines()[1].strip()
            return f"for shape {shape}{where_it_fails(shape)}: {detail}"
        except Exception as exc:
            raise CheckFailed(f"for shape {shape}, compute returned something op_test cannot use "
                              f"({type(exc).__name__}); return a tuple holding one tensor: `return (dx,)`") from None
    return None


def gelu_grad(remote, kernel_fn):
    """Exercise 'gelu_grad': kernel_fn(dy_ptr, x_ptr, dx_ptr, n, BLOCK) computes GeluGrad."""
    if not remote.call(kernel_facts, kernel_fn)["jit"]:
        raise CheckFailed("gelu_grad_kernel must be decorated with @triton.jit")
    return op_test_shapes(remote, kernel_fn)


def register(remote):
    """Exercise 'register': the kernel registered for com.microsoft:GeluGrad is the learner's
    class (not the built-in) and passes op_test on every shape."""
    facts = remote.call(registered_facts)
    if facts["builtin"]:
        raise CheckFailed("com.microsoft:GeluGrad is still ortlab's built-in kernel: decorate "
                          "your class with @register_kernel(override=True)")
    if not facts["is_gelu_grad"]:
        raise CheckFailed(f"your class declares {facts['declares']}")
    return facts["mistake"] or op_test_shapes(remote, None)
