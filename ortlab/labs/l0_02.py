"""Exercises of the walkthrough L0_02_ortmodule: the graph inputs ORTModule makes of a call's nested arguments,
and which calls make it export again.

The module and the calls the exercises are about are here, so the notebook can show them. The checks live in
ortlab.labs.judges.l0_02 and ask ORTModule 1.19.2's own code, without exporting anything: the input flattening
and schema of _io.parse_inputs_for_onnx_export (orttraining/orttraining/python/training/ortmodule/_io.py) and the
comparison of GraphTransitionManager._export_check (_graph_transition_manager.py). The reference answers are in
solutions/walkthroughs/L0_02_ortmodule.py, outside the package.
"""
import warnings

import torch
from torch import nn

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe


class NestedModel(nn.Module):
    """forward(x, pair, extras=None, scale=1.0, mode="sum") -> a scalar loss: x a tensor [batch, 4]; pair two
    tensors of x's shape in a tuple or a list (the second may itself be a tuple or list of tensors, summed); extras
    a dict whose 'bias' and 'gate' may be tensors or None; scale a number; mode "sum" or "mean"."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.linear = nn.Linear(4, 4)

    def forward(self, x, pair, extras=None, scale=1.0, mode="sum"):
        second = pair[1] if isinstance(pair[1], torch.Tensor) else sum(pair[1])
        h = self.linear(x) * scale + pair[0] * second
        if extras is not None and extras.get("bias") is not None:
            h = h + extras["bias"]
        if extras is not None and extras.get("gate") is not None:
            h = h * extras["gate"]
        return h.sum() if mode == "sum" else h.mean()


def forward_parameters():
    """The names of NestedModel.forward's parameters, in order (self left out)."""
    return ["x", "pair", "extras", "scale", "mode"]


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(*shape, generator=g) for name, shape in
            (("x8", (8, 4)), ("p8", (8, 4)), ("q8", (8, 4)), ("x3", (3, 4)), ("p3", (3, 4)), ("q3", (3, 4)),
             ("b", (4,)))}


def re_export_calls():
    """The calls of exercise 're_export', in order: [(how it is written, args, kwargs)]."""
    t = _tensors()
    x8, p8, q8, x3, p3, q3, b = (t[k] for k in ("x8", "p8", "q8", "x3", "p3", "q3", "b"))
    return [
        ('m(x8, (p8, q8), {"bias": b})', (x8, (p8, q8), {"bias": b}), {}),
        ('m(x3, (p3, q3), {"bias": b})', (x3, (p3, q3), {"bias": b}), {}),
        ('m(x3, [p3, q3], {"bias": b})', (x3, [p3, q3], {"bias": b}), {}),
        ('m(x3, [p3, q3], {"bias": None})', (x3, [p3, q3], {"bias": None}), {}),
        ('m(x3, [p3, q3], extras={"bias": None})', (x3, [p3, q3]), {"extras": {"bias": None}}),
        ('m(x3, [p3, q3], extras={"bias": None}, mode="sum")', (x3, [p3, q3]),
         {"extras": {"bias": None}, "mode": "sum"}),
        ('m(x8, [p8, q8], extras={"bias": None}, mode="sum")', (x8, [p8, q8]),
         {"extras": {"bias": None}, "mode": "sum"}),
        ('m(x8, [p8, q8], extras={"bias": None}, mode="mean")', (x8, [p8, q8]),
         {"extras": {"bias": None}, "mode": "mean"}),
        ('m(x8[None], [p8, q8], extras={"bias": None}, mode="mean")', (x8[None], [p8, q8]),
         {"extras": {"bias": None}, "mode": "mean"}),
    ]


def number_arguments(calls):
    """Each call [(how it is written, args, kwargs)] of NestedModel under ORTModule with every check on
    (ORTMODULE_SKIPCHECK_POLICY=SKIP_CHECK_DISABLED), under ORTModule with the default fast path (one ORTModule each,
    the calls in turn), and in PyTorch: the loss each returns, or ORT's error."""

    from ortlab.ortmodule import driver as om  # lazy: loaded only when this runs
    from ortlab.viz import Table  # lazy: loaded when this runs, not when the notebook imports the exercises

    def losses(**variables):
        out = []
        with om.ortmodule_env(**variables), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with om.captured_logs():
                model = om.ortmodule(NestedModel(), "WARNING", False)
            for _, args, kwargs in calls:
                with om.captured_logs():
                    try:
                        out.append(f"{float(model(*args, **kwargs)):.4f}")
                    except Exception as exc:  # ORT's own failure, shown as the table's cell
                        out.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:70]}")
        return out

    every, fast = losses(SKIPCHECK_POLICY="SKIP_CHECK_DISABLED"), losses()
    reference = NestedModel()
    rows = [(written, a, b, f"{float(reference(*args, **kwargs)):.4f}")
            for (written, args, kwargs), a, b in zip(calls, every, fast)]
    return Table(("call", "ORTModule, every check", "ORTModule, fast path", "PyTorch"), rows)


@probe
def graph_input_names(fn, parameters, args, kwargs):
    """The learner's fn(parameters, args, kwargs), as a list of str."""
    found = fn(list(parameters), args, kwargs)
    if isinstance(found, (str, bytes, dict)) or not isinstance(found, (list, tuple)):
        raise CheckFailed(f"return the graph input names as a list of str, e.g. ['x', 'pair_0'], not "
                          f"{type(found).__name__}")
    for name in found:
        if not isinstance(name, str):
            raise CheckFailed(f"each graph input name is a str, e.g. 'pair_0'; not {name!r}")
    return list(found)


@probe
def predicted_exports(fn, count):
    """The learner's fn(), as a list of `count` bools."""
    found = fn()
    if isinstance(found, (str, bytes, dict)) or not isinstance(found, (list, tuple)):
        raise CheckFailed(f"return a list of {count} bools, one per call, not {type(found).__name__}")
    if len(found) != count:
        raise CheckFailed(f"return one bool per call: {count} of them, not {len(found)}")
    for value in found:
        if not isinstance(value, bool):
            raise CheckFailed(f"each entry is True (this call exports again) or False; not {value!r}")
    return list(found)


def check_graph_inputs(fn):
    """Exercise 'graph_inputs': fn(parameters, args, kwargs) -> the names of the graph inputs ORTModule makes of a
    call of NestedModel, checked against ORTModule's own flattening on calls the check chooses."""
    judge("graph_inputs", "l0_02.graph_inputs", learner(fn))


def check_re_export(fn):
    """Exercise 're_export': fn() -> one bool per call of re_export_calls(): does ORTModule (every check on) export
    again? Checked against ORTModule's own schema comparison."""
    judge("re_export", "l0_02.re_export", learner(fn))
