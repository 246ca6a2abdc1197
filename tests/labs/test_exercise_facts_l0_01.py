"""The facts L0_01's exercise judges read from ORT agree with an independent computation.

'needed_inputs': get_inputs() and get_overridable_initializers() follow the rule read off the model (graph
inputs without an initializer are required, read or not; those with one are overridable), and a run needs
exactly the required ones. 'output_shapes': the arrays ORT returns have the shapes and dtypes numpy computes
for the same ops.
"""
import numpy as np
import pytest

from ortlab import session
from ortlab.labs import l0_01
from ortlab.labs.judges.l0_01 import ort_inputs

CPU = ["CPUExecutionProvider"]


def test_the_inputs_ort_lists_follow_the_models_declarations():
    model = l0_01.inputs_model()
    graph_inputs = [i.name for i in model.graph.input]
    initializers = {t.name for t in model.graph.initializer}
    assert ort_inputs(model) == {"inputs": [n for n in graph_inputs if n not in initializers],
                                 "overridable": [n for n in graph_inputs if n in initializers]}


def test_a_run_needs_exactly_the_required_inputs_and_a_feed_overrides_an_initializer():
    s = session.create(l0_01.inputs_model(), providers=CPU)
    x = np.ones((2, 3), np.float32)
    once = s.run(None, {"x": x, "unused": np.zeros(2, np.float32)})[0]
    with pytest.raises(Exception, match="unused"):
        s.run(None, {"x": x})
    twice = s.run(None, {"x": x, "unused": np.zeros(2, np.float32), "scale": np.array(4.0, np.float32)})[0]
    np.testing.assert_allclose(twice, 2 * once, rtol=1e-6)


def test_the_shapes_ort_returns_are_numpys():
    x = l0_01.shapes_feeds()["x"]
    w = next(t for t in l0_01.shapes_model().graph.initializer if t.name == "w")
    w = np.frombuffer(w.raw_data, np.float32).reshape(6, 4) if w.raw_data else np.array(w.float_data).reshape(6, 4)
    r = x.reshape(-1, 2, 3)
    t = r.transpose(0, 2, 1)
    expected = {"r": r, "t": t, "summed": t.sum(axis=1), "best": x.argmax(axis=1)[:, None],
                "shape": np.array(x.shape, np.int64), "projected": x @ w}
    s = session.create(l0_01.shapes_model(), providers=CPU)
    got = dict(zip([o.name for o in s.get_outputs()], s.run(None, l0_01.shapes_feeds())))
    assert list(got) == list(expected)
    for name, value in expected.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
