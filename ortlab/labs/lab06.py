"""Checks for lab06_profile_training_run: read ORT's profile of an ORTModule run, find the steps and
the kernels that scale with the layers, and add a check of your own to the graph doctor.

The checks compare the learner's answers with what ortlab.profiling computes from the same
profiles, and run the learner's doctor check on graphs built to hold the pattern and not to.
"""
from onnx import TensorProto, helper

from ortlab import models, profiling
from ortlab.labs.checks import call_learner, check, compare
from ortlab.training import ortmodule as om


def profile_ortmodule(layers=2, steps=3, seed=0):
    """(OrtModuleRun, Profile) of a short ORTModule run of TinyBert with `layers` layers."""
    module = models.get("bert", layers=layers, dropout=0.1, seed=seed)
    batches = [module.example_inputs(batch=8, seq=16, seed=s) for s in range(2)]
    run = om.train(module, batches, steps, profile=True, prefix=f"bert{layers}")
    return run, profiling.load_ort_profile(run.profile)


def check_op_type_totals(op_type_totals, profile):
    """Exercise 'op_type_totals': op_type_totals(profile) -> {op type: total µs}."""
    def test():
        got = call_learner(op_type_totals, profile, what="op_type_totals(profile)")
        if not isinstance(got, dict):
            return f"op_type_totals must return a dict {{op type: µs}}, not {type(got).__name__}"
        expected = {op: us for op, (_, us) in profile.by_op_type().items()}
        missing, extra = set(expected) - set(got), set(got) - set(expected)
        if missing or extra:
            return f"op types missing: {sorted(missing)[:5]}, unexpected: {sorted(extra)[:5]}"
        for op, us in expected.items():
            reason = compare(got[op], us, 1e-9, 1e-6, f"the total for {op}")
            if reason:
                return reason + " (add up e.dur of every event e whose e.op_type is that op type)"
        return None
    check("op_type_totals", test)


def reference_step_times(profile):
    """ms per step: a step is a forward run and the backward run after it."""
    runs = profile.runs
    return [(runs[k + 1][1] + runs[k + 1][2] - runs[k][1]) / 1e3 for k in range(0, len(runs) - 1, 2)]


def check_step_times(step_times, profile):
    """Exercise 'step_times': step_times(profile) -> [ms per step], from the session runs."""
    def test():
        got = call_learner(step_times, profile, what="step_times(profile)")
        expected = reference_step_times(profile)
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return (f"expected {len(expected)} step times (one per step: {len(profile.runs)} runs, a forward "
                    f"and a backward run per step), got {got!r:.80}")
        return compare(list(got), expected, 1e-6, 1e-6, "your step times (ms)")
    check("step_times", test)


def reference_layer_ops(one, two):
    calls = one.compare(two, by="calls").rows
    return sorted(op for op, _, _, gap in calls if gap.startswith("+"))


def check_layer_ops(layer_ops, one, two):
    """Exercise 'layer_ops': layer_ops(one_layer, two_layers) -> sorted op types whose calls per run grow."""
    def test():
        got = call_learner(layer_ops, one, two, what="layer_ops(one, two)")
        expected = reference_layer_ops(one, two)
        if sorted(got) != expected:
            wrong = sorted(set(got) ^ set(expected))[:6]
            return (f"these op types are wrongly in or out: {wrong}; compare calls per run (calls divided by "
                    "len(profile.runs)), not total calls or time")
        return None
    check("layer_ops", test)


def _graph(nodes, inputs):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, None) for i in inputs],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph)


def doctor_cases():
    """(name, model, findings expected) for a 'Gelu after an Add' (BiasGelu candidate) check."""
    gelu = lambda x, name="gelu": helper.make_node("Gelu", [x], ["Y"], name=name, domain="com.microsoft")
    return [
        ("Add -> Gelu", _graph([helper.make_node("Add", ["X", "B"], ["a"], name="add"), gelu("a")], ["X", "B"]), 1),
        ("MatMul -> Gelu", _graph([helper.make_node("MatMul", ["X", "B"], ["a"], name="mm"), gelu("a")], ["X", "B"]), 0),
        ("Gelu of an input", _graph([gelu("X")], ["X"]), 0),
        ("Add -> Relu", _graph([helper.make_node("Add", ["X", "B"], ["a"]),
                                helper.make_node("Relu", ["a"], ["Y"])], ["X", "B"]), 0),
    ]


def check_bias_gelu_check(name="standalone_gelu"):
    """Exercise 'doctor_check': a registered graph-doctor check `name` that finds a Gelu fed by an Add."""
    def test():
        if name not in profiling.CHECKS:
            raise NotImplementedError(f"no check named {name!r} is registered yet: decorate your function "
                                      "with @profiling.register_check and run its cell")
        for case, model, expected in doctor_cases():
            findings = call_learner(lambda: profiling.diagnose(model, [name]).findings, what=f"your check on '{case}'")
            if len(findings) != expected:
                return f"on the graph '{case}' your check found {len(findings)} finding(s), expected {expected}"
            if findings and not all(isinstance(f, profiling.Finding) for f in findings):
                return "return a list of profiling.Finding"
        return None
    check("doctor_check", test)
