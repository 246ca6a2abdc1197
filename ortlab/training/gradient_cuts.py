"""Find where a module's forward cuts the gradient (x.detach(), torch.no_grad(), set_grad_enabled(False), w.data).

The export loses every such cut: torch.onnx.export writes detach as Identity, a no_grad block leaves no trace,
and `w.data` becomes a constant. ORT's gradient builder then differentiates straight through, so the gradients
are not PyTorch's. ORTModule 1.19.2 exports the same way (orttraining/orttraining/python/training/ortmodule/
_graph_transition_manager.py, `_export_model`, under torch.no_grad()) and trains such a module silently with
those gradients. MiniORTModule runs the forward once more, with gradients on, under a TorchFunctionMode that
follows the values cut off the autograd graph, and refuses the module when one of them flows back into a value
that needs a gradient, or is returned.

A cut that cannot change a gradient is let through: a value that is no float (a mask from a comparison), and
the factories that only read a shape (zeros_like, new_ones...), whose exported graph has no gradient either.
"""
import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from ortlab.errors import OrtlabError

_TORCH = str(Path(torch.__file__).resolve().parent)


class GradientCutError(OrtlabError):
    """The module's forward cuts the gradient where the exported graph cannot: ORT would differentiate through."""


def _tensors(tree):
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _is_factory(func):
    """zeros_like, new_ones...: the output reads its input's shape, never its values."""
    name = getattr(func, "__name__", "")
    return name.endswith("_like") or name.startswith("new_")


def _user_line():
    """'file:line (source)' of the innermost frame outside torch and this file."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = str(Path(frame.filename).resolve())
        if not path.startswith(_TORCH) and path != str(Path(__file__).resolve()):
            return f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    return "a line of the module's forward"


def _name(func):
    """Tensor.mul, Tensor.detach, Tensor.data (a property's getter)..."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    owner = getattr(func, "__self__", None)
    if name.endswith("__get__") and hasattr(owner, "__name__"):
        name = f"Tensor.{owner.__name__}"
    return name.replace("TensorBase.", "Tensor.")


class _CutTracker(TorchFunctionMode):
    """Marks each float value made from values needing a gradient without needing one itself (a cut), and each
    float value made from marked ones the same way; records the first marked value that flows back into a
    value needing a gradient."""

    def __init__(self):
        super().__init__()
        self.cut = WeakIdKeyDictionary()   # tensor -> where its cut happened
        self.found = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = _tensors((args, kwargs))
        if not inputs:
            return out
        marked = [self.cut[t] for t in inputs if t in self.cut]
        feeds_gradient = marked or any(t.requires_grad for t in inputs)
        for o in _tensors(out):
            if not o.is_floating_point() and not o.is_complex():
                continue
            if o.requires_grad and marked and self.found is None:
                self.found = marked[0]
            elif not o.requires_grad and feeds_gradient and not _is_factory(func) and o not in self.cut:
                self.cut[o] = marked[0] if marked else f"{_name(func)} at {_user_line()}"
        return out


def refuse_gradient_cuts(run):
    """Call run() (one forward, gradients on, returning the module's outputs) and raise GradientCutError where
    a cut value flows back into the gradient's path or is returned."""
    tracker = _CutTracker()
    with torch.enable_grad(), tracker:
        outputs = run()
    where = tracker.found or next((tracker.cut[o] for o in _tensors(outputs) if o in tracker.cut), None)
    if where is not None:
        raise GradientCutError(
            f"the module's forward cuts the gradient (a value made without one by {where}) and uses it where "
            "a gradient flows, or returns it: the exported graph has no such cut (detach is exported as "
            "Identity, a torch.no_grad() block leaves no trace, .data becomes a constant), so ORT would "
            "differentiate through it and give other gradients than PyTorch (ORTModule 1.19.2 does so "
            "silently). Compute the detached value outside the module and pass it as an input that needs no "
            "gradient, use a parameter with requires_grad=False or a buffer, or run the module in plain PyTorch")
