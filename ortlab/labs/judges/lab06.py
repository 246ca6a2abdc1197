"""The checks of lab06_profile_training_run (run where the learner's code cannot reach them).

Graded, the learner's functions read profiles the check makes up here (kernel events of a training
run, 'layers' of ops that repeat; ortlab.labs.lab06.on_profiles rebuilds them on the learner's side),
so an answer fitted to the notebook's profile does not pass; called in the notebook with a profile,
they read that one. The answers are compared with what ortlab.profiling computes from the same data.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, compare
from ortlab.labs.lab06 import doctor_cases, doctor_findings, on_profiles
from ortlab.labs.remote import Learner
from ortlab.profiling import Event, Profile

FIXED_OPS = ("Gather", "SoftmaxCrossEntropyLossInternal", "ReduceSum", "Cast")
LAYER_OPS = ("FusedMatMul", "LayerNormalization", "Softmax", "Add", "BiasGelu", "Transpose", "Mul")


def made_up_profile(layers, steps, seed):
    """A Profile of `steps` training steps (a forward run then a backward run each) of a model with
    `layers` layers: FIXED_OPS once per run, each of LAYER_OPS a random 1-3 times per layer."""
    rng = np.random.default_rng(seed)
    per_layer = {op: int(rng.integers(1, 4)) for op in LAYER_OPS}
    events, runs, now = [], [], int(rng.integers(1000, 5000))
    for run in range(2 * steps):
        start = now
        ops = list(FIXED_OPS) + [op for op, n in per_layer.items() for _ in range(n * layers)]
        for k in rng.permutation(len(ops)):
            dur = int(rng.integers(3, 400))
            events.append(Event(f"{ops[k]}_{run}_{len(events)}", ops[k], now, dur, "CPUExecutionProvider"))
            now += dur + int(rng.integers(0, 20))
        runs.append((f"run {run}", start, now - start))
        now += int(rng.integers(50, 3000))
    return Profile(f"made-up profile ({layers} layer(s))", events, runs)


def _profiles(given, seed=0):
    """The profiles to check with: the notebook's when a check in the notebook got them, else made up."""
    if all(p is not None and not isinstance(p, Learner) for p in given):
        return list(given)
    if len(given) == 1:
        return [made_up_profile(2, 3, seed)]
    return [made_up_profile(1, 2, seed), made_up_profile(2, 2, seed + 1)]


def _ask(remote, fn, profiles, what):
    try:
        return remote.call(on_profiles, fn, [_data(p) for p in profiles])
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:
        text = (str(exc).strip().splitlines() or [""])[0]
        raise CheckFailed(f"{what} raised {type(exc).__name__}: {text}"[:200]) from None


def _data(profile):
    return {"source": profile.source, "runs": [tuple(r) for r in profile.runs],
            "events": [(e.name, e.op_type, e.ts, e.dur, e.provider, tuple(e.output_shapes), e.output_bytes)
                       for e in profile.events]}


def op_type_totals(remote, fn, profile=None):
    """Exercise 'op_type_totals': op_type_totals(profile) -> {op type: total µs}."""
    (profile,) = _profiles([profile])
    got = _ask(remote, fn, [profile], "op_type_totals(profile)")
    if not isinstance(got, dict):
        return f"op_type_totals must return a dict {{op type: µs}}, not {type(got).__name__}"
    expected = {op: us for op, (_, us) in profile.by_op_type().items()}
    missing, extra = set(expected) - set(got), set(got) - set(expected)
    if missing or extra:
        return f"op types missing: {sorted(missing)[:5]}, unexpected: {sorted(map(str, extra))[:5]}"
    for op, us in expected.items():
        reason = compare(got[op], us, 1e-9, 1e-6, f"the total for {op}")
        if reason:
            return reason + " (add up e.dur of every event e whose e.op_type is that op type)"
    return None


def reference_step_times(profile):
    """ms per step: a step is a forward run and the backward run after it."""
    runs = profile.runs
    return [(runs[k + 1][1] + runs[k + 1][2] - runs[k][1]) / 1e3 for k in range(0, len(runs) - 1, 2)]


def step_times(remote, fn, profile=None):
    """Exercise 'step_times': step_times(profile) -> [ms per step], from the session runs."""
    (profile,) = _profiles([profile])
    got = _ask(remote, fn, [profile], "step_times(profile)")
    expected = reference_step_times(profile)
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        return (f"expected {len(expected)} step times (one per step: {len(profile.runs)} runs, a forward "
                f"and a backward run per step), got {got!r:.80}")
    return compare(list(got), expected, 1e-6, 1e-6, "your step times (ms)")


def reference_layer_ops(one, two):
    calls = one.compare(two, by="calls").rows
    return sorted(op for op, _, _, gap in calls if gap.startswith("+"))


def layer_ops(remote, fn, one=None, two=None):
    """Exercise 'layer_ops': layer_ops(one_layer, two_layers) -> sorted op types whose calls per run grow."""
    one, two = _profiles([one, two])
    got = _ask(remote, fn, [one, two], "layer_ops(one, two)")
    expected = reference_layer_ops(one, two)
    if not isinstance(got, (list, tuple)) or sorted(map(str, got)) != expected:
        got = list(got) if isinstance(got, (list, tuple)) else []
        wrong = sorted(set(map(str, got)) ^ set(expected))[:6]
        return (f"these op types are wrongly in or out: {wrong}; compare calls per run (calls divided by "
                "len(profile.runs)), not total calls or time")
    return None


def doctor_check(remote, name="standalone_gelu"):
    """Exercise 'doctor_check': a registered graph-doctor check `name` that finds a Gelu fed by an Add."""
    for case, model, expected in doctor_cases():
        try:
            found = remote.call(doctor_findings, name, model)
        except (NotImplementedError, CheckFailed):
            raise
        except Exception as exc:
            raise CheckFailed(f"your check on '{case}' raised {type(exc).__name__}: "
                              f"{(str(exc).strip().splitlines() or [''])[0]}"[:200]) from None
        if found is None:
            raise NotImplementedError(f"no check named {name!r} is registered yet: decorate your function "
                                      "with @profiling.register_check and run its cell")
        count, all_findings = found
        if count != expected:
            return f"on the graph '{case}' your check found {count} finding(s), expected {expected}"
        if count and not all_findings:
            return "return a list of profiling.Finding"
    return None
