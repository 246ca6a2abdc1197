"""Helpers that ask the real ONNX Runtime, for tests to compare ortlab against."""
import json
import os
import tempfile

import numpy as np
import onnxruntime as ort

ORDERS = {"default": ort.ExecutionOrder.DEFAULT, "priority": ort.ExecutionOrder.PRIORITY_BASED}


def run(model, feeds, optimize=False):
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def execution_order(model, feeds, kind="default"):
    """Names of the nodes in the order ORT's sequential executor ran them (from its profiler)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ORDERS[kind]
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "order")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    suffix = "_kernel_time"
    return [e["name"][: -len(suffix)] for e in events
            if e.get("cat") == "Node" and e["name"].endswith(suffix)]


def random_feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    init = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value or 2 for d in t.shape.dim]
        dtype = {1: np.float32, 7: np.int64, 11: np.float64}[t.elem_type]
        feeds[vi.name] = (rng.standard_normal(shape) if dtype != np.int64
                          else rng.integers(0, 4, shape)).astype(dtype)
    return feeds
