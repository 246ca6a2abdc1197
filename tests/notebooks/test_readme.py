"""The README and CONTRIBUTING.md tell the same story as the notebooks they quote, and the README stays a learner's
front page."""
import json
import re

from repo_paths import ROOT

MARK = "<!-- copied from solutions/lab08_train_e2e.ipynb, section 4 -->"


def lab08_step_times():
    """The stored output of lab08's step-time cell (the record of ORTModule against PyTorch)."""
    cells = json.loads((ROOT / "solutions" / "lab08_train_e2e.ipynb").read_text())["cells"]
    cell = next(c for c in cells if "step_time_table" in "".join(c["source"]))
    return "".join("".join(o.get("text", "")) for o in cell["outputs"]).strip()


def readme_step_times():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert MARK in text, "CONTRIBUTING.md quotes lab08's step-time table after the marker " + MARK
    block = re.search(re.escape(MARK) + r"\s*```text\n(.*?)```", text, re.S)
    assert block, "a ```text block follows the marker"
    return block.group(1).strip()


def test_the_readme_quotes_lab08s_stored_step_times():
    stored = lab08_step_times()
    assert "ms/step" in stored and "ORTModule" in stored and "PyTorch" in stored
    assert readme_step_times() == stored, ("CONTRIBUTING.md's ORTModule vs PyTorch table differs from lab08's stored "
                                           "output: copy lab08's output there after re-executing it")


# The contributor section's examples: each runs in a fresh process, and what it registers works.
EXAMPLE_CHECKS = {
    "gradient": """
import numpy as np
from ortlab.gradients import check_gradient
from ortlab.walkthroughs.per_op_gradients import op_model
case = op_model("Sinh", {"X": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)})
assert check_gradient(case.model, case.x_names, case.loss, case.feeds).passed
""",
    "fusion": """
import numpy as np
from onnx import TensorProto, helper
from ortlab import onnx_defs
from ortlab.transformers import GraphTransformerManager
nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
manager = GraphTransformerManager.from_registry(2, names=["ReluReluFusion"])
fused = manager.optimize(onnx_defs.make_model(graph))
assert [n.op_type for n in fused.graph.node] == ["Relu"], fused.graph.node
assert manager.fire_counts() == {"ReluReluFusion": 1}, manager.fire_counts()
""",
    "kernel": """
from ortlab import triton_kernels as kernels


def check():  # not at module level: Triton's interpreter chokes on a numpy array among a kernel's globals
    x = np.linspace(-2, 2, 3000, dtype=np.float32)
    np.testing.assert_array_equal(kernels.run("Relu", x)[0], np.maximum(x, 0))
    kernels.op_test("Relu", [x])  # raises OpTestFailure on a mismatch


check()
""",
    "check": """
from ortlab import onnx_defs, profiling
import numpy as np
model = onnx_defs.one_node_model("Sqrt", [np.ones(3, np.float32)])
found = profiling.diagnose(model, checks=["standalone_sqrt"]).findings
assert [f.check for f in found] == ["standalone_sqrt"], found
""",
    "engine_kernel": """
from ortlab.engine import InferenceSession
from ortlab.onnx_defs import one_node_model
sess = InferenceSession(one_node_model("Sinh", [np.ones(3, np.float32)]))
assert type(sess.state.steps[0].kernel).__name__ == "sinh", sess.state.steps[0].kernel
np.testing.assert_allclose(sess.run(None, {"x0": np.full(3, 0.5, np.float32)})[0], np.sinh(np.float32(0.5)), rtol=1e-6)
""",
    "execution_provider": """
import numpy as np
from ortlab.engine import InferenceSession, register_op_kernel
from ortlab.onnx_defs import one_node_model
register_op_kernel("Tanh", provider="TanhOnlyExecutionProvider")(lambda ctx: np.tanh(ctx.input(0)))
sess = InferenceSession(one_node_model("Tanh", [np.ones(3, np.float32)]), providers=["TanhOnlyExecutionProvider"])
assert sess.get_providers() == ["TanhOnlyExecutionProvider", "CPUExecutionProvider"]
assert sess.state.steps[0].provider.type == "TanhOnlyExecutionProvider"
np.testing.assert_allclose(sess.run(None, {"x0": np.ones(3, np.float32)})[0], np.tanh(1.0), rtol=1e-6)
""",
}


def readme_examples():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    pattern = r"(\d+) lines?\b[^\n]*(?:\n[^\n<]+)*\n<!-- contributor example: (\w+) -->\n```python\n(.*?)```"
    return {kind: (int(count), code) for count, kind, code in re.findall(pattern, text, re.S)}


def counted_lines(code):
    """The lines an example takes: not blank, not an import."""
    return sum(1 for line in code.splitlines()
               if line.strip() and not line.startswith(("import ", "from ")))


def test_the_readme_shows_one_example_per_registry_with_its_line_count():
    examples = readme_examples()
    assert set(examples) == set(EXAMPLE_CHECKS), set(examples) ^ set(EXAMPLE_CHECKS)
    for kind, (count, code) in examples.items():
        assert counted_lines(code) == count, f"CONTRIBUTING.md says {count} lines for the {kind} example"


def test_each_contributor_example_registers_what_works(tmp_path):
    import subprocess
    import sys

    for kind, (_, code) in readme_examples().items():
        script = tmp_path / f"{kind}.py"
        script.write_text(code + EXAMPLE_CHECKS[kind])
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, f"CONTRIBUTING.md's {kind} example: {done.stderr[-2000:]}"


def test_the_readme_is_a_learners_front_page():
    """At most about 1,500 words, the two commands first, and the contributor material one link away."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 1600, len(text.split())
    assert text.index("make lab") < text.index("## The course") < text.index("## Doing and grading an exercise")
    assert "ssh -L 8888:127.0.0.1:8888" in text  # reaching the lab from a laptop
    assert "(CONTRIBUTING.md)" in text and "(docs/course.md)" in text
    for contributor_only in ("## Reproducible outputs", "## Where things are", "contributor example"):
        assert contributor_only not in text
