"""Checks for lab06_profile_training_run: read ORT's profile of an ORTModule run, find the steps and
the kernels that scale with the layers, and add a check of your own to the graph doctor.

The checks (ortlab.labs.judges.lab06) compare the learner's answers with what ortlab.profiling
computes from the same profiles, and run the learner's doctor check on graphs built to hold the
pattern and not to.
"""
from onnx import TensorProto, helper

from ortlab import models, profiling
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe
from ortlab.ortmodule import driver as om


def profile_ortmodule(layers=2, steps=3, seed=0):
    """(OrtModuleRun, Profile) of a short ORTModule run of TinyBert with `layers` layers."""
    module = models.get("bert", layers=layers, dropout=0.1, seed=seed)
    batches = [module.example_inputs(batch=8, seq=16, seed=s) for s in range(2)]
    run = om.train(module, batches, steps, profile=True, prefix=f"bert{layers}")
    return run, profiling.load_ort_profile(run.profile)


@probe
def on_profiles(fn, profiles):
    """fn(*profiles), each profile rebuilt from its data (source, runs, events as tuples)."""
    rebuilt = [profiling.Profile(p["source"], [profiling.Event(*e) for e in p["events"]],
                                 [tuple(r) for r in p["runs"]]) for p in profiles]
    return fn(*rebuilt)


@probe
def doctor_findings(name, model):
    """(number of findings, all of them profiling.Finding) of the registered check `name` on `model`;
    None when no check has that name."""
    if name not in profiling.CHECKS:
        return None
    findings = profiling.diagnose(model, [name]).findings
    return len(findings), all(isinstance(f, profiling.Finding) for f in findings)


def _given(value):
    return value if isinstance(value, profiling.Profile) else learner(value)


def check_op_type_totals(op_type_totals, profile=None):
    """Exercise 'op_type_totals': op_type_totals(profile) -> {op type: total µs}."""
    judge("op_type_totals", "lab06.op_type_totals", learner(op_type_totals), _given(profile))


def check_step_times(step_times, profile=None):
    """Exercise 'step_times': step_times(profile) -> [ms per step], from the session runs."""
    judge("step_times", "lab06.step_times", learner(step_times), _given(profile))


def check_layer_ops(layer_ops, one=None, two=None):
    """Exercise 'layer_ops': layer_ops(one_layer, two_layers) -> sorted op types whose calls per run grow."""
    judge("layer_ops", "lab06.layer_ops", learner(layer_ops), _given(one), _given(two))


def _graph(nodes, inputs):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, None) for i in inputs],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph)


def doctor_cases():
    """(name, model, findings expected) for a 'Gelu after an Add' (BiasGelu candidate) check."""
    gelu = lambda x, name="gelu": helper.make_node("Gelu", [x], ["Y"], name=name, domain="com.microsoft")
    return [
        ("Add -> Gelu", _graph([helper.make_node("Add", ["X", "B"], ["a"], name="add"), gelu("a")], ["X", "B"]), 1),
        ("MatMul -> Gelu",
         _graph([helper.make_node("MatMul", ["X", "B"], ["a"], name="mm"), gelu("a")], ["X", "B"]), 0),
        ("Gelu of an input", _graph([gelu("X")], ["X"]), 0),
        ("Add -> Relu", _graph([helper.make_node("Add", ["X", "B"], ["a"]),
                                helper.make_node("Relu", ["a"], ["Y"])], ["X", "B"]), 0),
    ]


def check_bias_gelu_check(name="standalone_gelu"):
    """Exercise 'doctor_check': a registered graph-doctor check `name` that finds a Gelu fed by an Add."""
    judge("doctor_check", "lab06.doctor_check", name)
