"""Checks for lab02_graph_transformer: a fusion (BiasGelu) and an elimination rule (Add 0 / Mul 1).

Each check registers nothing itself: it runs the learner's class through ortlab's manager on
graphs where it must fire and graphs where it must not, compares the outputs in ORT, and
says which case went wrong and how (ortlab.labs.judges.lab02: the comparisons; here, only what
runs the learner's class).
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.onnx_defs import make_model
from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe
from ortlab.transformers import GeluFusion, GraphTransformer, GraphTransformerManager, RewriteRule
from ortlab.transformers import RuleBasedGraphTransformer, registry
from ortlab.viz import Table
from ortlab.walkthroughs import graph_transformers as ex


def _run(transformers, model, what):
    manager = GraphTransformerManager()
    for t in transformers:
        manager.register(t, level=1)
    try:
        return manager.optimize(model)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise CheckFailed(f"{what}: {str(exc).splitlines()[0]}") from None


@probe
def class_facts(cls):
    """What the learner's class is: a fusion (GraphTransformer), a rule (RewriteRule) or neither, and
    whether ortlab's registry holds it."""
    fusion = isinstance(cls, type) and issubclass(cls, GraphTransformer)
    rule = isinstance(cls, type) and issubclass(cls, RewriteRule)
    table = registry.TRANSFORMERS if fusion else registry.RULES
    entry = table.get(getattr(cls, "__name__", None)) if fusion or rule else None
    return {"kind": "fusion" if fusion else "rule" if rule else None, "repr": repr(cls)[:80],
            "name": getattr(cls, "__name__", "?"), "registered": entry is not None and entry[1] is cls}


@probe
def optimize_with(cls, kind, model):
    """`model` optimized by ortlab's manager with the learner's class: after GeluFusion for a fusion,
    in a RuleBasedGraphTransformer for a rule."""
    chain = [GeluFusion(), cls()] if kind == "fusion" else [RuleBasedGraphTransformer("lab02", [cls()])]
    manager = GraphTransformerManager()
    for transformer in chain:
        manager.register(transformer, level=1)
    return manager.optimize(model)


def bias_gelu_cases():
    """(description, model, should fire): Gelu already fused by GeluFusion before the learner's runs."""
    swapped = ex.gelu(bias="1d")
    swapped.graph.node[0].input[:] = ["bias", "x0"]
    shared = ex.gelu(bias="1d")
    shared.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, None))
    return [("Add(x, bias) -> Gelu", ex.gelu(bias="1d"), True),
            ("Add(bias, x) -> Gelu", swapped, True),
            ("a bias of shape [3, 4]", ex.gelu(bias="2d"), False),
            ("the Add's output is also a graph output", shared, False),
            ("Gelu without an Add before it", ex.gelu(), False)]


def check_bias_gelu(cls):
    """Exercise 'bias_gelu': a GraphTransformer fusing Add(X, 1-D bias) -> Gelu into BiasGelu."""
    judge("bias_gelu", "lab02.bias_gelu", learner(cls))


def _noop_model(op, constant, x_shape=(2, 3), constant_first=False, x_is_output_of_input=False):
    c = numpy_helper.from_array(np.asarray(constant, dtype=np.float32), "c")
    inputs = ["c", "r"] if constant_first else ["r", "c"]
    if x_is_output_of_input:
        nodes = [helper.make_node(op, ["x", "c"], ["y"])]
    else:
        nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, inputs, ["m"]),
                 helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "noop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [c])
    return make_model(graph, domains=())


def noop_cases():
    """(description, model, should fire) for an Add-0 / Mul-1 elimination."""
    return [("Add(x, 0)", _noop_model("Add", 0.0), True),
            ("Mul(1, x)", _noop_model("Mul", 1.0, constant_first=True), True),
            ("Add(x, zeros[3])", _noop_model("Add", np.zeros(3)), True),
            ("Add(x, 0.5)", _noop_model("Add", 0.5), False),
            ("Mul(x, 2)", _noop_model("Mul", 2.0), False),
            ("Add(x, zeros[4, 2, 3]), which broadcasts x to a bigger shape",
             _noop_model("Add", np.zeros((4, 2, 3))), False),
            ("Add(graph input, 0) -> graph output", _noop_model("Add", 0.0, x_is_output_of_input=True), False)]


def check_noop_elimination(cls):
    """Exercise 'noop_elimination': a RewriteRule removing Add(x, 0) and Mul(x, 1)."""
    judge("noop_elimination", "lab02.noop_elimination", learner(cls))


def cases_table(cls):
    """What `cls` did with each case of its exercise: expected, ops before and after (or what went wrong)."""
    fusion = isinstance(cls, type) and issubclass(cls, GraphTransformer)
    rows = []
    for what, model, fires in (bias_gelu_cases() if fusion else noop_cases()):
        try:
            chain = [GeluFusion(), cls()] if fusion else [RuleBasedGraphTransformer("lab02", [cls()])]
            after = ", ".join(f"{k} {v}" for k, v in sorted(ex.op_counts(_run(chain, model, what)).items()))
        except NotImplementedError:
            after = "not done yet"
        except Exception as exc:
            after = f"failed: {str(exc).splitlines()[0]}"
        before = ", ".join(f"{k} {v}" for k, v in sorted(ex.op_counts(model).items()))
        rows.append((what, "should fire" if fires else "leave alone", before, after))
    return Table(("case", "expected", "ops before", "ops after your class"), rows)


__all__ = ["bias_gelu_cases", "cases_table", "check_bias_gelu", "check_noop_elimination", "noop_cases"]
