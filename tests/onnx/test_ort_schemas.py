"""ORT's ONNX-domain schemas (ortlab.ops.schemas): installed explicitly and once, never by an import."""
import subprocess
import sys

import onnx
from onnx import TensorProto, helper

from ortlab.ir import Graph
from ortlab.ops import schemas
from repo_paths import ROOT

NAMES = ["LayerNormalization", "SimplifiedLayerNormalization", "MaxPoolGrad", "AveragePoolGrad"]


def test_importing_every_package_registers_no_schema():
    code = ("import onnx.defs as d\n"
            "import ortlab.transformers, ortlab.gradients, ortlab.engine, ortlab.memory, ortlab.ops.contrib_ops\n"
            "from ortlab.engine import InferenceSession\n"
            "print(d.has('MaxPoolGrad', ''), d.has('SimplifiedLayerNormalization', ''),"
            " d.has('AveragePoolGrad', ''))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]


def test_install_is_idempotent_and_reports_what_it_added():
    code = ("from ortlab.ops import schemas\n"
            "print(schemas.install()); print(schemas.install()); print(len(schemas.installed()))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second, count = out.stdout.splitlines()
    assert eval(first) == NAMES and eval(second) == [] and int(count) == 4


def _layer_norm_model(opset):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [4], [1.0] * 4)]
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-5)
    graph = helper.make_graph([node], "ln", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_resolve_installs_them_so_layer_norm_below_opset_17_loads_as_in_ort():
    """ORT resolves LayerNormalization at opset 14 to its own contrib schema (contrib_defs.cc)."""
    graph = Graph.from_model(_layer_norm_model(14))
    graph.resolve()
    assert ("LayerNormalization", "", 1) in schemas.installed()
    assert onnx.defs.get_schema("LayerNormalization", 14, "").since_version == 1
    assert onnx.defs.get_schema("LayerNormalization", 17, "").since_version == 17  # ONNX's own still wins at 17
