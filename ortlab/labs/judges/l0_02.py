"""The checks of L0_02's exercises (run where the learner's code cannot reach them).

Both ask ORTModule 1.19.2's own Python code, which runs in a millisecond and exports nothing:
_io.parse_inputs_for_onnx_export (orttraining/orttraining/python/training/ortmodule/_io.py) flattens a call's
arguments into the graph's inputs and builds the call's input schema, and GraphTransitionManager._export_check
(_graph_transition_manager.py) decides from the schemas whether the call exports again. tests/labs/
test_exercise_facts_l0_02.py checks both against what the real ORTModule does when it runs the calls.
"""
import inspect
import logging
from types import SimpleNamespace

import torch

from ortlab.env import quiet_import
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l0_02 import NestedModel, forward_parameters, graph_input_names, predicted_exports, re_export_calls

_LOGGER = logging.getLogger("ortlab.labs.judges.l0_02")


def ort_model_info(args, kwargs):
    """ORTModule's ModelInfoForExport of a call of NestedModel (training mode, CPU, numbers as tensors)."""
    io = quiet_import("onnxruntime.training.ortmodule._io")
    parameters = list(inspect.signature(NestedModel.forward).parameters.values())[1:]  # a bound forward's
    return io.parse_inputs_for_onnx_export(parameters, args, kwargs, True, torch.device("cpu"),
                                           torch.onnx.TrainingMode.TRAINING, _LOGGER)


def ort_exports(calls):
    """For each (args, kwargs) in turn: does ORTModule, checking every call, export again?"""
    manager = quiet_import("onnxruntime.training.ortmodule._graph_transition_manager").GraphTransitionManager
    decisions, exported = [], None
    for args, kwargs in calls:
        info = ort_model_info(args, kwargs)
        again = manager._export_check(exported, False, info.onnx_graph_input_arg_schema,
                                      info.onnx_graph_input_kwarg_schema, _LOGGER)
        if again:
            exported = SimpleNamespace(module_forward_args_schema=info.onnx_graph_input_arg_schema,
                                       module_forward_kwargs_schema=info.onnx_graph_input_kwarg_schema)
        decisions.append(bool(again))
    return decisions


def graph_input_cases():
    """The calls 'graph_inputs' is checked on (args, kwargs), none of them shown in the notebook."""
    g = torch.Generator().manual_seed(5)
    x, p, q, q2, b, gate = (torch.randn(2, 4, generator=g) for _ in range(6))
    return [((x, (p, q)), {"extras": {"bias": b, "gate": None}, "scale": 2.0}),
            ((x, [p, [q, q2]], {"bias": None}), {"mode": "mean"}),
            ((x, (p, q)), {"mode": "sum", "scale": 3, "extras": {"gate": gate, "bias": b}}),
            ((x, (p, q), None, True), {}),
            ((x, (p, q), {"bias": b}, 0.5, "mean"), {})]


def _shown(value):
    """A call's argument written short: t for a tensor, containers as Python writes them."""
    if isinstance(value, torch.Tensor):
        return "t"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_shown, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_shown(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _value_at(name, args, kwargs):
    """The argument (or nested element) ORTModule names `name`, or a marker when there is none."""
    missing = object()
    params = forward_parameters()
    roots = {p: args[i] for i, p in enumerate(params) if i < len(args)}
    roots.update({p: kwargs[p] for p in params if p in kwargs and p not in roots})

    def walk(prefix, value):
        if prefix == name:
            return value
        if isinstance(value, (list, tuple)):
            items = enumerate(value)
        elif isinstance(value, dict):
            items = value.items()
        else:
            return missing
        for key, item in items:
            found = walk(f"{prefix}_{key}", item)
            if found is not missing:
                return found
        return missing

    for root, value in roots.items():
        found = walk(root, value)
        if found is not missing:
            return found
    return missing


def graph_inputs(remote, fn):
    for args, kwargs in graph_input_cases():
        truth = list(ort_model_info(args, kwargs).onnx_graph_input_names)
        got = remote.call(graph_input_names, fn, forward_parameters(), args, kwargs)
        if got == truth:
            continue
        call = "for m(" + ", ".join([_shown(a) for a in args] + [f"{k}={_shown(v)}" for k, v in kwargs.items()]) + ")"
        for name in got:
            if name in truth:
                continue
            value = _value_at(name, args, kwargs)
            if value is None or isinstance(value, str):
                raise CheckFailed(f"{call}: {name!r} is {value!r}, and a None or a str is no graph input: ORTModule "
                                  "keeps it as a constant of the export (its value goes into the input schema)")
            if any(c in name for c in ".[]'\""):
                raise CheckFailed(f"{call}: {name!r} is not how ORTModule names a nested input: it joins the "
                                  "argument's name and each index or key with '_' (pair_0, extras_bias)")
            raise CheckFailed(f"{call}: {name!r} is not among the graph's inputs {truth}")
        for name in truth:
            if name in got:
                continue
            value = _value_at(name, args, kwargs)
            if isinstance(value, (bool, int, float)):
                raise CheckFailed(f"{call}: {name!r} ({value!r}) is missing: ORTModule turns a Python int, float or "
                                  "bool argument into a tensor and feeds it to the graph (_io.py, constant_as_tensor)")
            raise CheckFailed(f"{call}: {name!r} is missing: every tensor, however deeply nested, is a graph input, "
                              "named after its argument and each index or key, joined with '_'")
        if sorted(got) == sorted(truth):
            raise CheckFailed(f"{call}: the right names in the wrong order {got}: ORTModule walks the forward "
                              f"signature's parameters in order ({', '.join(forward_parameters())}), taking each from "
                              "the positional arguments or else from the keyword ones, whatever order the call "
                              f"wrote them in, then each container in its own order: {truth}")
        raise CheckFailed(f"{call}: you listed {got}; ORTModule's graph takes {truth}")
    return None


REASONS = [
    "nothing was exported yet",
    "only the batch size changed (8 to 3): ORTModule exports with every dimension dynamic, so a tensor's schema is "
    "its dtype and rank, not its shape",
    "pair is a list where it was a tuple: the schema keeps the type of each container",
    "extras['bias'] is None where it was a tensor: a None is a constant of the export, kept in the schema by value, "
    "and the graph has one input fewer",
    "extras is passed by keyword where it was positional: ORT keeps the positional arguments' schema and the keyword "
    "arguments' schema apart",
    "mode is given now, with its default's value: an argument left out is in no schema, and a str is a constant kept "
    "in the schema by value",
    "only the batch size changed (3 to 8): a tensor's schema is its dtype and rank, not its shape",
    "mode's value changed ('sum' to 'mean'): a str is kept in the schema by value",
    "x has rank 3 where it had rank 2: the rank is part of a tensor's schema (an export for rank 2 cannot take it)",
]


def re_export(remote, fn):
    calls = re_export_calls()
    got = remote.call(predicted_exports, fn, len(calls))
    truth = ort_exports([(args, kwargs) for _, args, kwargs in calls])
    for k, ((written, _, _), said, does) in enumerate(zip(calls, got, truth)):
        if said != does:
            raise CheckFailed(f"call {k}, {written}: you said {'it exports again' if said else 'it does not'}; "
                              f"ORTModule's check says it {'does' if does else 'does not'}: {REASONS[k]}")
    return None
