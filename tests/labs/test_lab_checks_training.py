"""lab06 and lab08 checks: right answers pass, typical wrong answers get a useful message.

(Its own file, after test_stack: these labs run ORTModule, which registers export symbolics.)
"""
import pytest

from ortlab import profiling
from ortlab.labs import lab06
from ortlab.labs.judges import lab06 as judge06
from ortlab.profiling import Profile


def verdict(capsys, run):
    run()
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "Traceback" not in out, out
    return out


@pytest.fixture(scope="module")
def profiles():
    _, one = lab06.profile_ortmodule(layers=1, steps=2)
    _, two = lab06.profile_ortmodule(layers=2, steps=2)
    return one, two


def _totals(profile):
    found = {}
    for e in profile.events:
        found[e.op_type] = found.get(e.op_type, 0.0) + e.dur
    return found


def _calls(profile):
    found = {}
    for e in profile.events:
        found[e.op_type] = found.get(e.op_type, 0) + 1
    return found


def _stub(*_):
    raise NotImplementedError("exercise is not done yet")


@pytest.mark.parametrize("answer, words", [
    (_totals, "[PASS]"), (_calls, "wrong values"), (lambda p: [1, 2], "must return a dict"),
    (lambda p: {"Add": 1.0}, "op types missing"), (_stub, "[NOT DONE]")])
def test_lab06_op_type_totals(capsys, profiles, answer, words):
    assert words in verdict(capsys, lambda: lab06.check_op_type_totals(answer, profiles[1]))


def test_lab06_step_times(capsys, profiles):
    profile = profiles[1]
    right = lambda p: judge06.reference_step_times(p)
    per_run = lambda p: [dur / 1e3 for _, _, dur in p.runs]  # every run counted as a step
    forward_only = lambda p: [p.runs[k][2] / 1e3 for k in range(0, len(p.runs), 2)]
    assert "[PASS]" in verdict(capsys, lambda: lab06.check_step_times(right, profile))
    assert "expected 2 step times" in verdict(capsys, lambda: lab06.check_step_times(per_run, profile))
    assert "wrong values" in verdict(capsys, lambda: lab06.check_step_times(forward_only, profile))


def test_lab06_step_times_reference_on_a_hand_made_profile():
    profile = Profile("p", [], runs=[("f0", 0, 100), ("b0", 150, 350), ("f1", 1000, 100), ("b1", 1100, 400)])
    assert judge06.reference_step_times(profile) == [0.5, 0.5]


def test_lab06_layer_ops(capsys, profiles):
    one, two = profiles
    grows = lambda a, b: sorted(op for op, n in _calls(b).items()
                                if n / len(b.runs) > _calls(a).get(op, 0) / len(a.runs))
    everything = lambda a, b: sorted(_calls(b))
    assert "[PASS]" in verdict(capsys, lambda: lab06.check_layer_ops(grows, one, two))
    assert "wrongly in or out" in verdict(capsys, lambda: lab06.check_layer_ops(everything, one, two))
    expected = judge06.reference_layer_ops(one, two)
    assert {"LayerNormalization", "FusedMatMul"} <= set(expected) and "SoftmaxCrossEntropyLossInternal" not in expected


@pytest.mark.parametrize("body, words", [
    (lambda g, u: [profiling.Finding("standalone_gelu", n.name, n.op_type, "m") for n in g.node
                   if n.op_type == "Gelu" and any(p.op_type == "Add" for p in u.before(n))], "[PASS]"),
    (lambda g, u: [profiling.Finding("standalone_gelu", n.name, n.op_type, "m") for n in g.node
                   if n.op_type == "Gelu"], "'MatMul -> Gelu' your check found 1"),
    (lambda g, u: [], "'Add -> Gelu' your check found 0"),
    (_stub, "[NOT DONE]")])
def test_lab06_doctor_check(capsys, body, words):
    body.__name__ = "standalone_gelu"
    with profiling.CHECKS.using("standalone_gelu", body):
        assert words in verdict(capsys, lambda: lab06.check_bias_gelu_check("standalone_gelu"))
    assert "is registered yet" in verdict(capsys, lambda: lab06.check_bias_gelu_check("standalone_gelu"))


# --- lab08 ------------------------------------------------------------------------------------

from ortlab.labs import lab08  # noqa: E402


def _step(model, optimizer, batch, zero=True, item=True):
    if zero:
        optimizer.zero_grad()
    loss = model(*batch)
    loss.backward()
    optimizer.step()
    return loss.item() if item else loss


@pytest.mark.parametrize("step, words", [
    (_step, "[PASS]"),
    (lambda m, o, b: _step(m, o, b, zero=False), "did you zero the gradients"),
    (lambda m, o, b: _step(m, o, b, item=False), "return loss.item()"),
    (_stub, "[NOT DONE]")])
def test_lab08_training_step(capsys, step, words):
    assert words in verdict(capsys, lambda: lab08.check_training_step(step))


def _train(wrap, steps, lr=1e-2):
    import torch

    from ortlab.ortmodule import driver as om

    with om.captured_logs():
        model = wrap(lab08.tiny_gpt())
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        data = lab08.task()
        return model, [_step(model, optimizer, data[s % len(data)]) for s in range(steps)]


def test_lab08_train_e2e(capsys):
    from onnxruntime.training.ortmodule import ORTModule

    assert "[PASS]" in verdict(capsys, lambda: lab08.check_reaches_target(lambda: _train(ORTModule, 200)))
    assert "wrap the tiny GPT with ORTModule" in verdict(
        capsys, lambda: lab08.check_reaches_target(lambda: _train(lambda m: m, 12)))
    assert "above the target 0.5" in verdict(
        capsys, lambda: lab08.check_reaches_target(lambda: _train(ORTModule, 12)))
    assert "return (model, losses)" in verdict(capsys, lambda: lab08.check_reaches_target(lambda: [1.0]))


def test_lab08_parity(capsys):
    from onnxruntime.training.ortmodule import ORTModule

    def curves(steps, lr=0.05, ort_lr=0.05):
        import torch

        from ortlab.ortmodule import driver as om

        out = []
        for wrap, rate in ((ORTModule, ort_lr), (lambda m: m, lr)):
            with om.captured_logs():
                model = wrap(lab08.tiny_gpt())
                optimizer = torch.optim.SGD(model.parameters(), lr=rate)
                data = lab08.task()
                out.append([_step(model, optimizer, data[s % len(data)]) for s in range(steps)])
        return tuple(out)

    assert "[PASS]" in verdict(capsys, lambda: lab08.check_parity(curves, steps=6))
    assert "your PyTorch losses" in verdict(capsys, lambda: lab08.check_parity(lambda n: curves(n, lr=0.1), steps=6))
    assert "your ORTModule losses" in verdict(
        capsys, lambda: lab08.check_parity(lambda n: curves(n, ort_lr=0.5), steps=6))
