"""ORT's Triton code generation family on a CPU build: what runs, the closest real thing, and why
the rest cannot.

ORT's code generator (orttraining/orttraining/python/training/ort_triton/: _sorted_graph.py,
_lowering.py, _codegen.py) turns an ONNX subgraph into Triton kernel source; on a GPU the C++
TritonFusion pass cuts such subgraphs out of the training graph into `TritonOp` nodes, whose kernel
calls back into Python (triton_op_executor.py: call_triton_by_onnx) to generate, load and run the
source. The CPU wheel has no TritonFusion, no TritonOp and no GPU, but the generator itself is pure
Python: `kernel_source` emits the source here, `run_interpreted` runs it under Triton's interpreter
(TRITON_INTERPRET=1) after two edits, and `family_table` says what each ORTMODULE_* switch does here.
"""
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortlab.env import quiet_import
from ortlab import models
from ortlab.errors import OrtlabError
from ortlab.patch import environment
from ortlab.viz import Table

_AUTOTUNE = re.compile(r"@triton\.autotune\((?P<body>.*?)\)\n@triton\.jit\ndef (?P<name>\w+)\(", re.S)
_FIRST_CONFIG = re.compile(r"triton\.Config\((\{[^}]*\})")
TUNING_VARIABLES = ("ENABLE_TUNING", "MAX_TUNING_DURATION_MS", "TUNING_RESULTS_PATH")
TOLERANCE = 1e-5  # interpreted kernel vs ORT's InferenceSession: below it, "equal" (the noise varies by CPU)


class OrtTritonError(OrtlabError):
    """A Triton code generation helper got input it cannot use, or its child process failed."""


def add_softmax_mul(cols=64, rows="N"):
    """An ONNX graph out = Softmax(x + b, axis=-1) * y, x and y [rows, cols], b [cols]: elementwise
    ops around a reduction, the kind of subgraph ORT's TritonFusion hands to the code generator."""
    if isinstance(cols, bool) or not isinstance(cols, int) or cols <= 0:
        raise OrtTritonError(f"cols must be a positive int, not {cols!r}")
    value = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("Mul", ["p", "y"], ["out"])]
    inputs = [value("x", [rows, cols]), value("b", [cols]), value("y", [rows, cols])]
    graph = helper.make_graph(nodes, "add_softmax_mul", inputs, [value("out", [rows, cols])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def example_inputs(model, rows=4, seed=0):
    """{input name: float32 array} for `model`, symbolic dims set to `rows`."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for value in _model(model).graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else rows for d in value.type.tensor_type.shape.dim]
        inputs[value.name] = rng.standard_normal(dims).astype(np.float32)
    return inputs


def _model(model):
    """A ModelProto from a ModelProto, bytes or a path, or OrtTritonError."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_model_from_string(model)
    if isinstance(model, (str, Path)) and Path(model).is_file():
        return onnx.load(str(model))
    raise OrtTritonError(f"model must be an onnx.ModelProto, its bytes or an .onnx path, not {model!r:.80}")


def _shapes(model, inputs):
    """The concrete input shapes in graph-input order, checked against `inputs`."""
    if not isinstance(inputs, dict):
        raise OrtTritonError(f"inputs must be a dict {{input name: array}}, not {type(inputs).__name__}")
    names = [v.name for v in model.graph.input]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise OrtTritonError(f"inputs lacks {missing}: give one array per graph input {names}")
    return [list(np.shape(inputs[n])) for n in names]


def kernel_source(model, shapes, name="func_demo"):
    """The Triton source ORT generates for `model` at input `shapes` (a list of lists of ints):
    codegen(name, SortedGraph(model, shapes)), as triton_op_executor._gen_module does."""
    model = _model(model)
    if not isinstance(name, str) or not name.isidentifier():
        raise OrtTritonError(f"name must be a Python identifier (the host function's name), not {name!r}")
    if not isinstance(shapes, (list, tuple)) or len(shapes) != len(model.graph.input):
        raise OrtTritonError(f"shapes must hold one shape per graph input ({len(model.graph.input)}), "
                             f"got {shapes!r}")
    sorted_graph = quiet_import("onnxruntime.training.ort_triton._sorted_graph")
    codegen = quiet_import("onnxruntime.training.ort_triton._codegen")
    sympy_utils = quiet_import("onnxruntime.training.ort_triton._sympy_utils")
    graph = sorted_graph.SortedGraph(model, [sympy_utils.parse_shape(list(s)) for s in shapes])
    return codegen.codegen(name, graph)


@dataclass
class CpuSource:
    """Generated source after the two edits that let it run on CPU, and what they changed."""

    source: str
    configs: dict = field(default_factory=dict)  # kernel name -> the first autotune config it now uses
    devices_replaced: int = 0

    def __repr__(self):
        return (f"CpuSource({len(self.source.splitlines())} lines, "
                f"{self.devices_replaced} device='cuda' -> 'cpu', autotune dropped for {self.configs})")


def cpu_source(source):
    """The two edits: allocate on "cpu" instead of "cuda", and drop each @triton.autotune, passing
    its first triton.Config's values at the launch instead (the interpreter has no benchmarker to
    autotune with: triton.autotune's constructor asks the active GPU driver for one)."""
    if not isinstance(source, str) or "@triton.jit" not in source:
        raise OrtTritonError("source must be the generated Triton source (a str with @triton.jit)")
    configs = {}
    for found in _AUTOTUNE.finditer(source):
        first = _FIRST_CONFIG.search(found["body"])
        configs[found["name"]] = ast.literal_eval(first.group(1)) if first else {}
    edited = _AUTOTUNE.sub(lambda m: f"@triton.jit\ndef {m['name']}(", source)
    for kernel, config in configs.items():
        extra = "".join(f", {k}={v!r}" for k, v in config.items())
        edited = re.sub(rf"({kernel}\[[^\]]*\]\()(.*)\)", lambda m: f"{m[1]}{m[2]}{extra})", edited)
    devices = edited.count('device="cuda"')
    return CpuSource(edited.replace('device="cuda"', 'device="cpu"'), configs, devices)


def ort_reference(model, inputs):
    """The graph's outputs from ORT's CPU InferenceSession: a list of arrays."""
    ort = quiet_import("onnxruntime")
    session = ort.InferenceSession(_model(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


@dataclass
class TritonRun:
    """What the child process saw: the source, the CPU run's outputs, the executor path's error and
    what ORTMODULE_TRITON_DEBUG saved."""

    source: str
    cpu: CpuSource
    outputs: list
    executor_error: str
    debug_files: list
    max_diff: float = float("nan")  # against ORT's InferenceSession
    flash_kernels_loaded: bool = False  # ort_triton.kernel imported with ORTMODULE_USE_FLASH_ATTENTION=1

    @property
    def agrees(self):
        """The max |diff| as a stable verdict: '<= 1e-05 (equal)' below TOLERANCE, else the figure."""
        return f"<= {TOLERANCE:.0e} (equal)" if self.max_diff <= TOLERANCE else f"{self.max_diff:.1e}"

    def __repr__(self):
        return (f"TritonRun({len(self.source.splitlines())}-line source, interpreted max |diff| vs ORT "
                f"{self.agrees}, executor: {self.executor_error or 'ran'}, "
                f"debug files {self.debug_files})")


def run_interpreted(model=None, inputs=None, timeout=240):
    """Generate the source for `model` (default add_softmax_mul) at the shapes of `inputs`, make
    the two cpu_source edits and run it under Triton's interpreter, in a child process with
    TRITON_INTERPRET=1 (read when triton is imported). The child also calls ORT's executor path,
    call_triton_by_onnx(1234, model, *dlpacks), with ORTMODULE_TRITON_DEBUG=1 in a fresh folder,
    and imports ort_triton.kernel with ORTMODULE_USE_FLASH_ATTENTION=1 (both read at import).
    Returns a TritonRun compared with ORT's InferenceSession."""
    model = _model(model if model is not None else add_softmax_mul())
    inputs = inputs if inputs is not None else example_inputs(model)
    shapes = _shapes(model, inputs)
    with tempfile.TemporaryDirectory(prefix="ortlab-triton-") as work:
        work = Path(work)
        onnx.save(model, str(work / "model.onnx"))
        np.savez(work / "inputs.npz", **inputs)
        (work / "shapes.json").write_text(json.dumps(shapes))
        env = dict(os.environ, TRITON_INTERPRET="1", ORTMODULE_TRITON_DEBUG="1",
                   ORTMODULE_USE_FLASH_ATTENTION="1")
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        try:
            done = subprocess.run([sys.executable, "-m", "ortlab.ortmodule.triton_codegen", str(work)], cwd=work,
                                  env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise OrtTritonError(f"the interpreter child ran past {timeout} s; pass a larger timeout") \
                from None
        if done.returncode != 0 or not (work / "result.json").exists():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise OrtTritonError(f"the interpreter child failed (exit {done.returncode}):\n{tail}")
        result = json.loads((work / "result.json").read_text())
        outputs = [np.load(work / f"out{i}.npy") for i in range(result["outputs"])]
    reference = ort_reference(model, inputs)
    diff = max(float(np.abs(o - r).max()) for o, r in zip(outputs, reference))
    cpu = CpuSource(result["cpu_source"], result["configs"], result["devices_replaced"])
    return TritonRun(result["source"], cpu, outputs, result["executor_error"], result["debug_files"], diff,
                     result["flash_kernels_loaded"])


def _child(work):
    """The child of run_interpreted (TRITON_INTERPRET=1 set before triton's import): writes
    result.json and out<i>.npy into `work`."""
    import torch  # heavy: torch
    from torch.utils.dlpack import from_dlpack, to_dlpack  # heavy: torch

    work = Path(work)
    model = onnx.load(str(work / "model.onnx"))
    shapes = json.loads((work / "shapes.json").read_text())
    with np.load(work / "inputs.npz") as data:
        tensors = [torch.from_numpy(data[v.name]) for v in model.graph.input]
    source = kernel_source(model, shapes)
    cpu = cpu_source(source)
    namespace = {}
    exec(compile(cpu.source, "<ort_triton generated, cpu>", "exec"), namespace)  # noqa: S102
    outputs = namespace["func_demo"](*tensors)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    for i, out in enumerate(outputs):
        np.save(work / f"out{i}.npy", out.numpy())
    executor = quiet_import("onnxruntime.training.ort_triton.triton_op_executor")
    try:
        dlpacks = [to_dlpack(t) for t in tensors]
        result = executor.call_triton_by_onnx(1234, model.SerializeToString(), *dlpacks)
        from_dlpack(result)
        error = ""
    except Exception as exc:  # the error is the finding
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    debug = work / "triton_debug"
    files = sorted(p.name for p in debug.iterdir()) if debug.is_dir() else []
    kernels = quiet_import("onnxruntime.training.ort_triton.kernel")
    (work / "result.json").write_text(json.dumps({
        "source": source, "cpu_source": cpu.source, "configs": cpu.configs,
        "devices_replaced": cpu.devices_replaced, "outputs": len(outputs), "executor_error": error,
        "debug_files": files,
        "flash_kernels_loaded": "flash_attn_forward" in kernels.__all__}))


# -- the ORTMODULE_* switches of the family -----------------------------------------------------
def build_facts():
    """What this build and machine offer Triton: {'C.is_triton_enabled()', 'register_triton_op_executor
    in C', 'torch.cuda.is_available()', 'triton importable'}."""
    C = quiet_import("onnxruntime.capi._pybind_state")
    import torch  # heavy: torch
    try:
        quiet_import("triton")
        triton = True
    except ImportError:
        triton = False
    return {"C.is_triton_enabled()": bool(C.is_triton_enabled()),
            "register_triton_op_executor in C": hasattr(C, "register_triton_op_executor"),
            "torch.cuda.is_available()": torch.cuda.is_available(), "triton importable": triton}


def switches_run(folder=None, module="mlp"):
    """One ORTModule training step with USE_TRITON, USE_FLASH_ATTENTION, ENABLE_TUNING,
    MAX_TUNING_DURATION_MS=500, TUNING_RESULTS_PATH=<folder>/tuning and TRITON_CONFIG_FILE set:
    {'runtime options', 'banner', 'tuning files', 'config ops'} read back from ORT."""
    from ortlab.ortmodule.driver import train  # lazy: the driver takes 1.5 s to import

    folder = Path(folder or tempfile.mkdtemp(prefix="ortlab-triton-family-"))
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "triton_config.json"
    config.write_text(json.dumps({"ops": {"Add": {"versions": [13, 14]}}, "initializer": "scalar",
                                  "min_nodes": 2}))
    model = models.get(module, dropout=0.0) if isinstance(module, str) else module
    run = train(model, [model.example_inputs()], 1, log_level="INFO", save_onnx=False, USE_TRITON=1,
                USE_FLASH_ATTENTION=1, ENABLE_TUNING=1, MAX_TUNING_DURATION_MS=500,
                TUNING_RESULTS_PATH=folder / "tuning", TRITON_CONFIG_FILE=config)
    options = run.model._torch_module._execution_manager(True)._runtime_options
    tuning = folder / "tuning"
    files = {p.name: json.loads(p.read_text()) for p in sorted(tuning.glob("*.json"))}
    executor = quiet_import("onnxruntime.training.ort_triton.triton_op_executor")
    with environment({"ORTMODULE_TRITON_CONFIG_FILE": str(config)}):
        config_ops = sorted(json.loads(executor.get_config())["ops"])
    return {"runtime options": {k: getattr(options, k) for k in
                                ("enable_triton", "enable_tuning", "max_tuning_duration_ms",
                                 "tuning_results_path")},
            "banner": [line.strip() for line in run.log if "Triton" in line or "Tuning" in line],
            "tuning files": files, "config ops": config_ops}



def family_table(run=None, facts=None, switches=None):
    """The Triton family as a Table: switch, verdict ('runs here', 'closest real thing' or 'not
    possible here, because ...') and evidence, each computed from what happened: a TritonRun
    (run_interpreted), build_facts() and switches_run() (computed when not given)."""
    run = run if run is not None else run_interpreted()
    facts = facts if facts is not None else build_facts()
    switches = switches if switches is not None else switches_run()
    options = switches["runtime options"]
    rows = [_codegen_row(run), _use_triton_row(options, facts), _flash_row(options, facts, run),
            _config_row(options, facts, switches), _debug_row(run), _tuning_row(options, switches)]
    return Table(("switch", "verdict", "evidence"), rows)


def _codegen_row(run):
    """ort_triton._codegen: runs (source), closest real thing (interpreted) or not."""
    lines = len(run.source.splitlines())
    if run.max_diff <= TOLERANCE:
        verdict = "runs here: the source; closest real thing: it runs under TRITON_INTERPRET=1 after 2 edits"
    else:
        verdict = f"runs here (the source only): the interpreted run differs from ORT by {run.max_diff:.1e}"
    return ("ort_triton._codegen", verdict, f"{lines}-line source; interpreted vs InferenceSession "
            f"max |diff| {run.agrees}; executor path: {run.executor_error or 'ran'}")


def _use_triton_row(options, facts):
    """ORTMODULE_USE_TRITON: on only when C.is_triton_enabled()."""
    if options["enable_triton"]:
        return ("ORTMODULE_USE_TRITON=1", "runs here", "enable_triton is True")
    return ("ORTMODULE_USE_TRITON=1", "not possible here, because this wheel is built without Triton: "
            f"C.is_triton_enabled() is {facts['C.is_triton_enabled()']}",
            "options.py ignores the variable silently (enable_triton False); no TritonFusion pass, "
            "no TritonOp kernel, register_triton_op_executor in C: "
            f"{facts['register_triton_op_executor in C']}")


def _flash_row(options, facts, run):
    """ORTMODULE_USE_FLASH_ATTENTION: kernels imported only with CUDA capability >= 8, run by TritonOp."""
    if run.flash_kernels_loaded and options["enable_triton"]:
        return ("ORTMODULE_USE_FLASH_ATTENTION=1", "runs here",
                "flash_attn_forward loaded, enable_triton True")
    why = []
    if not facts["torch.cuda.is_available()"]:
        why.append("torch.cuda.is_available() is False (ort_triton/kernel/__init__.py imports "
                   "_flash_attn only with a GPU of capability >= 8)")
    if not options["enable_triton"]:
        why.append("its kernels are called by TritonOp, which needs ORTMODULE_USE_TRITON (off, above)")
    return ("ORTMODULE_USE_FLASH_ATTENTION=1", "not possible here, because " + "; and ".join(why),
            f"ort_triton.kernel imported with it set: flash_attn_forward loaded {run.flash_kernels_loaded}")


def _config_row(options, facts, switches):
    """ORTMODULE_TRITON_CONFIG_FILE: read by get_config(), whose caller is the C++ TritonFusion."""
    evidence = f"get_config() reads the file (ops {switches['config ops']}) when called by hand"
    if options["enable_triton"] and facts["register_triton_op_executor in C"]:
        return ("ORTMODULE_TRITON_CONFIG_FILE", "runs here", evidence)
    return ("ORTMODULE_TRITON_CONFIG_FILE", "not possible here, because its only reader is the C++ "
            "TritonFusion pass (through register_triton_op_executor), which this build lacks "
            f"(C.is_triton_enabled() {facts['C.is_triton_enabled()']})", evidence)


def _debug_row(run):
    """ORTMODULE_TRITON_DEBUG: what call_triton_by_onnx saved in ./triton_debug."""
    sources = [f for f in run.debug_files if f.endswith(".py")]
    onnx_files = [f for f in run.debug_files if f.endswith(".onnx")]
    if sources:
        verdict = "runs here"
    elif onnx_files:
        verdict = ("runs here, ONNX side only: the .py is written after the module loads, and loading fails "
                   "on the executor error")
    else:
        verdict = "not possible here, because call_triton_by_onnx saved nothing"
    return ("ORTMODULE_TRITON_DEBUG=1", verdict, f"triton_debug/ holds {run.debug_files}")


def _tuning_row(options, switches):
    """ENABLE_TUNING / MAX_TUNING_DURATION_MS / TUNING_RESULTS_PATH: options read, results saved."""
    files = switches["tuning files"]
    name = " / ".join(TUNING_VARIABLES)
    evidence = (f"enable_tuning {options['enable_tuning']}, max {options['max_tuning_duration_ms']} ms; "
                f"files {json.dumps(files)}")
    if options["enable_tuning"] and files and all(v == [] for v in files.values()):
        return (name, "runs here, with nothing to tune: the CPU EP has no TunableOps", evidence)
    if options["enable_tuning"] and files:
        return (name, "runs here", evidence)
    return (name, "not possible here, because ORTModule did not turn tuning on or saved no results", evidence)


if __name__ == "__main__":
    _child(sys.argv[1])
