"""Checks for lab01_compose_onnx_model: compose models with onnx.helper, then edit one with ortlab.ir.

Each check runs your function on inputs of its own, validates the model with onnx.checker, runs it
in ORT and compares with numpy. The checks themselves live in ortlab.labs.judges.lab01: this module
holds no reference answers.
"""
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner


def check_transpose_matmul(build):
    """Exercise 'transpose_matmul': build(k, m, n) -> model computing Y = Transpose(A) @ B."""
    judge("transpose_matmul", "lab01.transpose_matmul", learner(build))


def check_mlp_model(build):
    """Exercise 'mlp_model': build(w1, b1, w2, b2) -> model computing Relu(X·w1 + b1)·w2 + b2."""
    judge("mlp_model", "lab01.mlp_model", learner(build))


def check_insert_scale(insert, model=None):
    """Exercise 'insert_scale': insert(model, s) -> a new model whose output is s times the old one.
    The check edits a model of its own (ortlab's MLP, exported as the notebook does), not `model`."""
    judge("insert_scale", "lab01.insert_scale", learner(insert))
