"""Exercises of the walkthrough L1_01_graph_transformers: predicting what ORT's levels make of a small block,
and writing a rewrite rule of ORT's, NotWhereFusion.

The models the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.l1_01 (against the graph ORT saves after its transformers, SessionOptions
optimized_model_filepath; the rule is onnxruntime/core/optimizer/not_where_fusion.cc, the levels
onnxruntime/core/optimizer/graph_transformer_utils.cc), and the reference answers in
solutions/walkthroughs/L1_01_graph_transformers.py, outside the package.
"""
from collections import Counter

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe
from ortlab.transformers import GraphTransformerManager, RewriteRule, RuleBasedGraphTransformer

F, B = TensorProto.FLOAT, TensorProto.BOOL


def _model(nodes, inputs, outputs, inits=(), opset=17, name="exercise"):
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def block_model():
    """The model of exercise 'level_ops': x [2, 4, 8] -> Identity -> torch's LayerNorm pattern -> MatMul W ->
    Add bias -> Erf GELU pattern -> Dropout -> y, exported for inference."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("Identity", ["x"], ["xi"], name="identity"),
             n("ReduceMean", ["xi"], ["mean"], axes=[-1], name="ln_mean"),
             n("Sub", ["xi", "mean"], ["d"], name="ln_sub"),
             n("Pow", ["d", "two"], ["d2"], name="ln_pow"), n("ReduceMean", ["d2"], ["var"], axes=[-1], name="ln_var"),
             n("Add", ["var", "eps"], ["var_eps"], name="ln_add_eps"), n("Sqrt", ["var_eps"], ["std"], name="ln_sqrt"),
             n("Div", ["d", "std"], ["normed"], name="ln_div"), n("Mul", ["normed", "ln_w"], ["nw"], name="ln_scale"),
             n("Add", ["nw", "ln_b"], ["h"], name="ln_shift"),
             n("MatMul", ["h", "W"], ["m"], name="matmul"), n("Add", ["m", "bias"], ["pre"], name="add_bias"),
             n("Div", ["pre", "sqrt2"], ["s"], name="gelu_div"), n("Erf", ["s"], ["e"], name="gelu_erf"),
             n("Add", ["e", "one"], ["e1"], name="gelu_add_one"), n("Mul", ["pre", "e1"], ["xe"], name="gelu_mul"),
             n("Mul", ["xe", "half"], ["g"], name="gelu_half"), n("Dropout", ["g"], ["y"], name="dropout")]
    f32 = np.float32
    inits = [("two", f32(2.0)), ("eps", f32(1e-5)), ("ln_w", rng.standard_normal(8).astype(f32)),
             ("ln_b", rng.standard_normal(8).astype(f32)), ("W", rng.standard_normal([8, 8]).astype(f32)),
             ("bias", rng.standard_normal(8).astype(f32)), ("sqrt2", f32(1.4142135)), ("one", f32(1.0)),
             ("half", f32(0.5))]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4, 8])], ["y"], inits, name="block")


def _where_model(nodes, outputs, name):
    inputs = [helper.make_tensor_value_info("c", B, [4]), helper.make_tensor_value_info("a", F, [4]),
              helper.make_tensor_value_info("b", F, [4])]
    model = _model(nodes, inputs, [], opset=15, name=name)
    for out, elem in outputs:
        model.graph.output.append(helper.make_tensor_value_info(out, elem, None))
    return model


def not_where_cases():
    """(description, model) for exercise 'not_where': Where(Not(c), a, b) and its neighbours, at opset 15
    (Where-9, Not-1: ORT's rule leaves the Where-16 of newer opsets alone)."""
    n = helper.make_node
    plain = [n("Not", ["c"], ["nc"], name="not"), n("Where", ["nc", "a", "b"], ["y"], name="where")]
    two = plain + [n("Where", ["nc", "b", "a"], ["z"], name="where2")]
    other = plain + [n("Cast", ["nc"], ["z"], to=F, name="cast")]
    compared = [n("Greater", ["a", "b"], ["gt"], name="greater"), n("Where", ["gt", "a", "b"], ["y"], name="where")]
    return [("Where(Not(c), a, b)", _where_model(plain, [("y", F)], "plain")),
            ("two Wheres reading the same Not(c) as their condition", _where_model(two, [("y", F), ("z", F)], "two")),
            ("Not(c) also read by a Cast", _where_model(other, [("y", F), ("z", F)], "other")),
            ("Not(c) also a graph output", _where_model(plain, [("y", F), ("nc", B)], "shown")),
            ("Where(Greater(a, b), a, b), no Not at all", _where_model(compared, [("y", F)], "compared"))]


def where_feeds():
    return {"c": np.array([True, False, True, False]), "a": np.arange(4, dtype=np.float32) - 1.5,
            "b": np.full(4, 10.0, np.float32)}


@probe
def predicted(fn):
    """The learner's prediction fn(), as {level: {op type: count}}."""
    found = fn()
    if not isinstance(found, dict) or not all(isinstance(v, (dict, Counter)) for v in found.values()):
        raise CheckFailed("return a dict {level: {op type: number of nodes}}, e.g. {'basic': {'Relu': 1}, ...}")
    return {str(k): {str(op): int(c) for op, c in v.items()} for k, v in found.items()}


@probe
def rule_facts(cls):
    """Whether the learner's class is a RewriteRule class, and the op types it targets."""
    ok = isinstance(cls, type) and issubclass(cls, RewriteRule)
    return {"rule": ok, "repr": repr(cls)[:80], "targets": list(cls.target_op_types) if ok else []}


@probe
def optimize_with_rule(cls, model):
    """`model` optimized by ortlab's manager with only the learner's rule, in a RuleBasedGraphTransformer."""
    manager = GraphTransformerManager()
    manager.register(RuleBasedGraphTransformer("exercise", [cls()]), level=1)
    return manager.optimize(model)


def check_level_ops(fn):
    """Exercise 'level_ops': fn() -> {"basic": {op: count}, "extended": {op: count}} for block_model() after
    ORT's transformers at each level (CPU EP), checked against the graph ORT saves."""
    judge("level_ops", "l1_01.level_ops", learner(fn))


def check_not_where(cls):
    """Exercise 'not_where': a RewriteRule class turning Where(Not(c), a, b) into Where(c, b, a), checked on
    not_where_cases() against ORT's NotWhereFusion (level 1) and by running both graphs."""
    judge("not_where", "l1_01.not_where", learner(cls))
