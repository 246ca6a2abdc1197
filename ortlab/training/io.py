"""Inputs and outputs of any nesting, flattened for ONNX and restored for torch.

Mirrors orttraining/orttraining/python/training/ortmodule/_io.py (the input/output schema,
`_extract_schema`, flatten and unflatten) as ORT's GraphTransitionManager reworked it:
an ONNX graph takes a flat list of tensors, a torch module takes any tree of tuples, lists,
dicts, None and non-tensor values. `torch.utils._pytree` does the walking both ways.

The *schema* is what decides a re-export: the tree's structure, and for each leaf either
(dtype, rank, requires_grad) of a tensor or the value of a non-tensor. Shapes are not part
of it, because the graph is exported with every dimension dynamic.

Where this differs from ORTModule 1.19.2: a Python int, float or bool argument is a ValueStub here, baked into
the graph, so a new value exports again. ORTModule feeds such a number to the graph as a tensor
(`_io.py`, `constant_as_tensor`) and records only its type (a bool's value too), so a new value reuses the graph
and a new type exports again (L0_02 shows both side by side; tests/training/test_ortmodule_number_inputs.py pins
ORTModule's own bugs on that path). The losses agree; the number of exports does not.
"""
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from ortlab.errors import OrtlabError


class SchemaError(OrtlabError):
    """An input or output that a graph cannot carry (the message says which and why)."""


@dataclass(frozen=True)
class TensorStub:
    """What the schema records of a tensor leaf: no values, no shape, only what the graph depends on."""

    dtype: torch.dtype
    rank: int
    requires_grad: bool

    def __str__(self):
        grad = ", requires_grad" if self.requires_grad else ""
        return f"{str(self.dtype).replace('torch.', '')}, rank {self.rank}{grad}"


@dataclass(frozen=True)
class ValueStub:
    """A non-tensor leaf (int, float, bool, str...): its value is baked into the exported graph."""

    value: object

    def __str__(self):
        return f"value {self.value!r}"


def _stub(leaf, path):
    if isinstance(leaf, torch.Tensor):
        return TensorStub(leaf.dtype, leaf.dim(), leaf.requires_grad)
    try:
        hash(leaf)
    except TypeError:
        raise SchemaError(f"input {path} is a {type(leaf).__name__}, which is neither a tensor nor a "
                          "hashable constant; pass tensors, or tuples/lists/dicts of them") from None
    return ValueStub(leaf)


def leaf_paths(spec):
    """Readable paths of a spec's leaves, e.g. ['args[0]', "kwargs['mask']"]."""
    dummy = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    paths = [None] * spec.num_leaves
    for keypath, index in pytree.tree_flatten_with_path(dummy)[0]:
        paths[index] = _keystr(keypath)
    return paths


def _keystr(keypath):
    text = pytree.keystr(keypath)  # e.g. [0][1]['mask'] for ((x, y), {'mask': m})
    if text.startswith("[0]"):
        return "args" + text[3:]
    return "kwargs" + text[3:] if text.startswith("[1]") else text


@dataclass(frozen=True)
class InputSchema:
    """The structure of (args, kwargs) and one stub per leaf; equal schemas share one export."""

    spec: object
    stubs: tuple
    training: bool

    def differences(self, other):
        """Why `other` needs a new export, as readable lines (empty when it does not)."""
        if other is None:
            return ["first call: nothing exported yet"]
        if self.spec != other.spec:
            before, after = ", ".join(leaf_paths(other.spec)), ", ".join(leaf_paths(self.spec))
            if before == after:  # same leaves, other containers (a None added, a list for a tuple)
                before, after = str(other.spec).replace("\n", ""), str(self.spec).replace("\n", "")
            return [f"input structure changed: ({before}) -> ({after})"]
        reasons = [f"{path}: {old} -> {new}" for path, old, new in
                   zip(leaf_paths(self.spec), other.stubs, self.stubs) if old != new]
        if self.training != other.training:
            reasons.append(f"module mode: {'train' if other.training else 'eval'} -> "
                           f"{'train' if self.training else 'eval'}")
        return reasons


@dataclass
class FlatInputs:
    """The tensor leaves to feed the graph, and the schema they came with."""

    tensors: list
    schema: InputSchema

    def rebuild(self, tensors):
        """(args, kwargs) with the tensor leaves replaced by `tensors`, the other leaves kept."""
        it = iter(tensors)
        leaves = [next(it) if isinstance(s, TensorStub) else s.value for s in self.schema.stubs]
        return pytree.tree_unflatten(leaves, self.schema.spec)


def flatten_inputs(args, kwargs, training=True):
    """Flatten (args, kwargs) into tensor leaves and an InputSchema."""
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    paths = leaf_paths(spec)
    stubs = tuple(_stub(leaf, path) for leaf, path in zip(leaves, paths))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    return FlatInputs(tensors, InputSchema(spec, stubs, training))


@dataclass
class OutputSchema:
    """How to rebuild a module's outputs from the graph's flat outputs.

    `constants` holds the non-tensor leaves seen at export time (by leaf index): a graph
    cannot compute them, so they come back as they were then, as ORTModule does. `numbers`
    holds the leaves that are Python numbers computed from a size (`y.shape[0]`): the graph
    computes them, and they come back as Python numbers of that type (ORTModule returns them
    as 0-d tensors).
    """

    spec: object
    tensor_leaves: tuple
    constants: dict
    numbers: dict = field(default_factory=dict)

    def restore(self, tensors):
        it = iter(tensors)
        leaves = [self._leaf(i, next(it)) if i in self.tensor_leaves else self.constants[i]
                  for i in range(self.spec.num_leaves)]
        return pytree.tree_unflatten(leaves, self.spec)

    def _leaf(self, index, tensor):
        return self.numbers[index](tensor.item()) if index in self.numbers else tensor

    def with_trace(self, traced):
        """The schema to restore the graph's outputs with, given the one the export's trace saw
        (None: the same). The trace sees a tensor where the plain run saw a Python number computed
        from a size: the graph outputs it, and it is restored as a number. Anything else differing
        is refused."""
        if traced is None or (traced.spec, traced.tensor_leaves) == (self.spec, self.tensor_leaves):
            return self
        sized = [i for i in traced.tensor_leaves if i not in self.tensor_leaves]
        if traced.spec != self.spec or not set(self.tensor_leaves) <= set(traced.tensor_leaves) or \
                any(type(self.constants.get(i)) not in (int, float, bool) for i in sized):
            raise SchemaError(
                f"the module's outputs differ between a plain run ({self.spec.num_leaves} leaves, "
                f"{len(self.tensor_leaves)} tensors) and the export's trace ({traced.spec.num_leaves} "
                f"leaves, {len(traced.tensor_leaves)} tensors): its output structure depends on "
                "tracing; return the same tensors in both (no torch.jit.is_tracing() branches)")
        return OutputSchema(self.spec, traced.tensor_leaves,
                            {i: c for i, c in self.constants.items() if i not in sized},
                            {i: type(self.constants[i]) for i in sized})


# What a module may return besides tensors, inside tuples, lists and dicts: ORTModule's
# ORTModelInputOutputType (onnxruntime/training/utils/torch_io_helper.py).
CONSTANT_OUTPUTS = (type(None), str, int, bool, float)


def _check_output_leaves(outputs):
    """Refuse a leaf that is neither a tensor nor one of CONSTANT_OUTPUTS (e.g. an object of the
    module's own class), naming it: ORTModule refuses it too ("Unsupported flatten data type")."""
    for keypath, leaf in pytree.tree_flatten_with_path(outputs)[0]:
        if not isinstance(leaf, (torch.Tensor, *CONSTANT_OUTPUTS)):
            path = pytree.keystr(keypath)
            where = f"output{path}" if path else "the module's output"
            raise SchemaError(
                f"{where} is a {type(leaf).__module__}.{type(leaf).__qualname__}, an output type "
                "MiniORTModule (like ORTModule) does not support: a module may return tensors, None, "
                "str, int, bool and float, in tuples, lists, namedtuples and dicts; return the "
                "object's tensors (e.g. as a tuple or a dict) instead")


def flatten_outputs(outputs):
    """(tensor leaves, OutputSchema) of whatever a module returned."""
    _check_output_leaves(outputs)
    leaves, spec = pytree.tree_flatten(outputs)
    tensor_leaves = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    constants = {i: leaf for i, leaf in enumerate(leaves) if i not in tensor_leaves}
    if not tensor_leaves:
        raise SchemaError("the module returned no tensor at all; an ONNX graph needs at least one output")
    return [leaves[i] for i in tensor_leaves], OutputSchema(spec, tensor_leaves, constants)
