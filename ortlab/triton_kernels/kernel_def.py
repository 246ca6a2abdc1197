"""What a kernel declares: its inputs, outputs, attributes with defaults, and type constraints.

Mirrors onnxruntime/core/framework/kernel_def_builder.h (KernelDefBuilder: TypeConstraint,
MayInplace, ...) and onnxruntime/core/framework/op_kernel.h (OpKernel: attributes read once
in the constructor, Compute(OpKernelContext*) called on every run). Every ortlab kernel has a
plain numpy `reference` (the maths) and a `compute` that launches Triton kernels.
"""
import difflib
import numbers
from dataclasses import dataclass

import numpy as np

from ortlab.errors import OrtlabError
from ortlab.onnx_defs import op_name

FLOAT = ("float32",)
INDEX = ("int64", "int32")


class KernelInputError(OrtlabError):
    """An input has the wrong count, dtype, rank or shape for the kernel."""


def _kinds_of(default):
    """The kinds of value an attribute with this default takes."""
    if default is None:
        return ("int", None)
    if isinstance(default, bool) or isinstance(default, numbers.Integral):
        return ("int",)
    if isinstance(default, numbers.Real):
        return ("float",)
    if isinstance(default, str):
        return ("str",)
    return ("int", "float", "str")


@dataclass(frozen=True)
class Arg:
    """One formal input or output, as in ORT's OpSchema::FormalParameter.

    types: the dtypes allowed (names of numpy dtypes); ranks: the ranks allowed, None for any.
    """

    name: str
    types: tuple = FLOAT
    optional: bool = False
    ranks: tuple = None


class Kernel:
    """Base of every kernel: bind attributes once, check inputs, then `compute` on tensors.

    Subclasses set op_type, domain, inputs, outputs, attributes (name -> default), and
    `mirrors` (the ORT file of the CUDA kernel they follow), and write `reference` and
    `compute`; `example` gives sample inputs (the default fits elementwise ops). `atol` and
    `rtol` are the tolerances op_test allows (ORT's OpTester default for float on CPU is 1e-4
    for both; a kernel that sums many terms may declare larger ones). `random` kernels are
    compared by their invariant, not elementwise. `ort_cpu` False: ORT has the op on CUDA only.
    """

    op_type = ""
    domain = ""
    inputs = ()
    outputs = ()
    attributes = {}
    mirrors = ""
    atol = 1e-4
    rtol = 1e-4
    random = False
    ort_cpu = True  # ORT's CPU execution provider has a kernel for this op

    # name -> the kinds an attribute accepts ("int", "float", "str", None), where the default's
    # type does not say it (an attribute whose default is None takes an int or None unless set here)
    attribute_types = {}

    def __init__(self, **attributes):
        unknown = sorted(set(attributes) - set(self.attributes))
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(self.attributes), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KernelInputError(f"{self.op_type} has no attribute {', '.join(map(repr, unknown))}{hint}; "
                                   f"its attributes are {sorted(self.attributes) or 'none'}")
        attributes = {name: self._check_attribute(name, value) for name, value in attributes.items()}
        for name, default in self.attributes.items():
            setattr(self, name, attributes.get(name, default))
        self.given = dict(attributes)

    def _check_attribute(self, name, value):
        """The value, checked against the kinds the declaration allows (as ORT's OpKernelInfo::
        GetAttr<T> fails on a wrong type: onnxruntime/core/framework/op_node_proto_helper.cc);
        numpy scalars become Python ones and an int given for a float becomes a float."""
        kinds = self.attribute_types.get(name) or _kinds_of(self.attributes[name])
        if value is None and None in kinds:
            return None
        if "int" in kinds and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        if "float" in kinds and isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if "str" in kinds and isinstance(value, str):
            return value
        wanted = " or ".join("None" if k is None else k for k in kinds)
        hint = " (use 1 or 0)" if isinstance(value, bool) and "int" in kinds else ""
        raise KernelInputError(f"{self.op_type}: attribute '{name}' must be {wanted}, got "
                               f"{type(value).__name__} {value!r}{hint}")

    def __repr__(self):
        bound = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.attributes)
        return f"{type(self).__name__}({bound})  # {op_name(self.op_type, self.domain)}"

    # -- the parts a kernel writes ------------------------------------------------------
    @classmethod
    def example(cls, rng, rows=3, cols=37):
        """Sample inputs and attributes to run the kernel on: ([numpy arrays], {attributes}).

        The tests and `python -m ortlab.benchmarks.kernels` run every registered kernel on its example.
        This default gives each required input a float32 (rows, cols) array of standard normals
        (optional inputs left out), which fits elementwise and row-wise ops; a kernel whose inputs
        must fit together otherwise overrides it.
        """
        return [rng.standard_normal((rows, cols)).astype(np.float32)
                for arg in cls.inputs if not arg.optional], {}

    def reference(self, *inputs):
        """The maths in numpy: numpy arrays in, a tuple of numpy arrays out."""
        raise NotImplementedError

    def compute(self, *inputs):
        """Launch Triton kernels: torch tensors (or None) in, a tuple of torch tensors out."""
        raise NotImplementedError

    def check_shapes(self, *inputs):
        """Raise KernelInputError (via self.expect) when the shapes do not fit together."""

    def flops(self, *inputs):
        """Floating-point operations, counted analytically (default: one per element of input 0)."""
        return int(sum(np.asarray(a).size for a in inputs[:1]))

    def invariant(self, inputs, outputs):
        """For random kernels: a list of problems with `outputs` (empty when they are valid)."""
        return []

    # -- helpers --------------------------------------------------------------------
    def expect(self, condition, message):
        if not condition:
            raise KernelInputError(f"{self.op_type}: {message}")

    def validate(self, inputs):
        """Check count, dtypes and ranks against the declaration; returns the inputs padded
        with None for absent optional ones."""
        required = sum(not a.optional for a in self.inputs)
        count = f"{required}" if required == len(self.inputs) else f"{required} to {len(self.inputs)}"
        self.expect(required <= len(inputs) <= len(self.inputs),
                    f"takes {count} inputs "
                    f"({', '.join(a.name for a in self.inputs)}), got {len(inputs)}")
        inputs = list(inputs) + [None] * (len(self.inputs) - len(inputs))
        for i, (arg, value) in enumerate(zip(self.inputs, inputs)):
            if value is None:
                self.expect(arg.optional, f"input {i} '{arg.name}' is required, got None")
                continue
            self._check_arg(i, arg, np.asarray(value))
        self._check_same_type(inputs)
        self.check_shapes(*inputs)
        return inputs

    def _check_arg(self, i, arg, value):
        self.expect(value.dtype.name in arg.types,
                    f"input {i} '{arg.name}' must be {' or '.join(arg.types)}, got {value.dtype.name}")
        if arg.ranks is not None:
            self.expect(value.ndim in arg.ranks,
                        f"input {i} '{arg.name}' must have rank {' or '.join(map(str, arg.ranks))}, "
                        f"got shape {value.shape}")

    def _check_same_type(self, inputs):
        floats = {np.asarray(v).dtype.name for a, v in zip(self.inputs, inputs)
                  if v is not None and a.types == FLOAT}
        self.expect(len(floats) <= 1, f"inputs constrained to one type T got {sorted(floats)}")
