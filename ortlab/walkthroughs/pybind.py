"""Views of the boundary where Python meets ORT's C++, for the L1_04 walkthrough.

onnxruntime's Python classes are thin: `onnxruntime.InferenceSession` (onnxruntime/python/
onnxruntime_inference_collection.py, installed as onnxruntime/capi/) keeps a pybind11 object,
`sess._sess`, of the class `C.InferenceSession` that onnxruntime/python/onnxruntime_pybind_state.cc
defines around the C++ onnxruntime::InferenceSession; the training classes (TrainingAgent,
OrtModuleGraphBuilder, ...) come from orttraining/orttraining/python/orttraining_pybind_state.cc.

    trace_capi()                  a `with` block recording the calls into onnxruntime's Python layer and
                                  into its pybind11 module (a CapiTrace: .names(), printed as a tree)
    layer_table(*objects)         the layers behind Python objects: class, file, the C++ class wrapped
    ortvalue_table(value)         what an OrtValue's Python methods read off its C++ Tensor, and the call behind each
    numpy_copy_table(value)       whether OrtValue.numpy() copies a CPU Tensor, read from addresses
    cuda_value_to_host(array)     on a GPU: a CUDA OrtValue of `array`, copied to the host, and which path copied it
    pybind_methods(obj)           the methods pybind11 gives a C object (`sess._sess`)
    gradient_table(ours, theirs)  max |ORT - torch| per parameter, printed against a bound
    memory_pattern_table(...)     the forward output before and after run_backward, pattern off and on
    gelu_grad_check(n)            the C++ GeluGrad against the numpy reference and ORT's own kernel
    zero_copy_table(...)          the addresses numpy, torch and the C++ side see
    refusal(fn, *args)            the error a call raises, as a learner reads it
    build_failure(source)         a broken extension's build error, kept after the first (slow) build
    plot_gelu_grad_times(rows)    the picture of cpp_extension.time_gelu_grad's rows
    speed_ratios(rows)            the C++ kernel against numpy and ORT at the largest timed size, as a line
"""
import contextlib
import inspect
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortlab.engine import cpp_extension as cpp
from ortlab.env import capi, quiet_import
from ortlab.errors import OrtlabError
from ortlab.onnx_defs import MS_DOMAIN
from ortlab.ops.reference import gelu_grad_reference
from ortlab.ortmodule.training_agent import ModuleTrainingAgent, session_options, torch_gradients
from ortlab.viz import Table

PYBIND_MODULE = "onnxruntime.capi.onnxruntime_pybind11_state"
SKIPPED_FRAMES = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>")

# C class -> (the pybind11 file defining it, the C++ class it wraps and its file), in ORT 1.19.2's tree
PYBIND_SOURCES = {
    "InferenceSession": ("onnxruntime/python/onnxruntime_pybind_state.cc",
                         "onnxruntime::InferenceSession (onnxruntime/core/session/inference_session.cc)"),
    "SessionOptions": ("onnxruntime/python/onnxruntime_pybind_state.cc",
                       "onnxruntime::SessionOptions (onnxruntime/core/framework/session_options.h)"),
    "RunOptions": ("onnxruntime/python/onnxruntime_pybind_state.cc",
                   "OrtRunOptions (onnxruntime/core/framework/run_options.h)"),
    "OrtDevice": ("onnxruntime/python/onnxruntime_pybind_state.cc",
                  "OrtDevice (include/onnxruntime/core/framework/ortdevice.h)"),
    "SessionIOBinding": ("onnxruntime/python/onnxruntime_pybind_iobinding.cc",
                         "onnxruntime::IOBinding (onnxruntime/core/session/IOBinding.cc)"),
    "OrtValue": ("onnxruntime/python/onnxruntime_pybind_ortvalue.cc",
                 "OrtValue (include/onnxruntime/core/framework/ort_value.h)"),
    "OrtValueVector": ("onnxruntime/python/onnxruntime_pybind_ortvalue.cc", "std::vector<OrtValue>"),
    "TrainingAgent": ("orttraining/orttraining/python/orttraining_pybind_state.cc",
                      "onnxruntime::training::TrainingAgent "
                      "(orttraining/orttraining/core/agent/training_agent.cc)"),
    "OrtModuleGraphBuilder": ("orttraining/orttraining/python/orttraining_pybind_state.cc",
                              "onnxruntime::training::OrtModuleGraphBuilder "
                              "(orttraining/orttraining/core/framework/ortmodule_graph_builder.cc)"),
    "PartialGraphExecutionState": ("orttraining/orttraining/python/orttraining_pybind_state.cc",
                                   "onnxruntime::PartialGraphExecutionState "
                                   "(onnxruntime/core/framework/partial_graph_execution_state.cc)"),
}
C_OBJECT_ATTRIBUTES = ("_sess", "_iobinding", "_ortvalue")  # where the Python classes keep their C object


class PybindViewError(OrtlabError):
    """A view was given something it cannot show."""


def _onnxruntime_dir():
    return os.path.dirname(quiet_import("onnxruntime").__file__) + os.sep


# --- tracing the calls ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One recorded call: 'python' (a function of onnxruntime's Python files) or 'pybind' (a function,
    method or constructor of the C module), its qualified name, and how deep in the recorded calls."""

    kind: str
    name: str
    depth: int

    def __str__(self):
        return "    " * self.depth + self.name


@dataclass
class CapiTrace:
    """The calls recorded by trace_capi(), in order."""

    calls: list = field(default_factory=list)

    def names(self, kind=None):
        """The qualified names, in call order ('python' or 'pybind' ones only when `kind` is given)."""
        return [c.name for c in self.calls if kind is None or c.kind == kind]

    def text(self, max_depth=None, collapse=True):
        """The calls as an indented tree, one line per call; with `collapse`, a call repeated right after
        itself is one line ending in '(xN)'."""
        shown = [c for c in self.calls if max_depth is None or c.depth <= max_depth]
        lines, count = [], 0
        for index, call in enumerate(shown):
            count += 1
            if collapse and index + 1 < len(shown) and shown[index + 1] == call:
                continue
            lines.append(str(call) + (f"  (x{count})" if count > 1 else ""))
            count = 0
        return "\n".join(lines)

    def __repr__(self):
        return self.text()


def pybind_names():
    """{id(builtin function): 'C.Class.method' or 'C.function'} for everything the pybind module defines
    (a method's builtin is what sys.setprofile reports as a 'c_call')."""
    C = capi()
    names = {}
    for attr, value in vars(C).items():
        if type(value).__name__ == "builtin_function_or_method":
            names[id(value)] = f"C.{attr}"
        elif isinstance(value, type):
            for method, member in vars(value).items():
                function = getattr(member, "__func__", member)
                if type(function).__name__ == "builtin_function_or_method":
                    names[id(function)] = f"C.{value.__name__}.{method}"
    return names


def _pybind_classes():
    """The C module's classes whose constructor a trace can record (exceptions left out)."""
    C = capi()
    return [v for v in vars(C).values()
            if isinstance(v, type) and v.__module__ == PYBIND_MODULE and "__init__" in vars(v)
            and not issubclass(v, BaseException)]


def _python_name(code, root):
    """'module.Class.function' of a frame in onnxruntime's Python files, or None for other files."""
    filename = code.co_filename
    if not filename.startswith(root):
        return None
    qualname = getattr(code, "co_qualname", code.co_name)
    if any(skip in qualname for skip in SKIPPED_FRAMES):
        return None
    return f"{Path(filename).stem}.{qualname}"


class _Recorder:
    """The sys.setprofile hook: Python frames of onnxruntime's files and pybind11 calls."""

    def __init__(self, trace):
        self.trace, self.stack = trace, []
        self.root, self.names = _onnxruntime_dir(), pybind_names()

    def add(self, kind, name):
        self.trace.calls.append(Call(kind, name, len(self.stack)))

    def __call__(self, frame, event, arg):
        if event == "call":
            name = _python_name(frame.f_code, self.root)
            if name is not None:
                self.add("python", name)
                self.stack.append(frame)
        elif event == "return":
            if self.stack and self.stack[-1] is frame:
                self.stack.pop()
        elif event == "c_call":
            name = self.names.get(id(arg))
            if name is None and getattr(arg, "__module__", None) == PYBIND_MODULE:
                name = f"C.?.{arg.__name__}"
            if name is not None:
                self.add("pybind", name)


def _recording_init(cls, original, recorder):
    def __init__(self, *args, **kwargs):
        recorder.add("pybind", f"C.{cls.__name__}.__init__")
        return original(self, *args, **kwargs)
    return __init__


@contextlib.contextmanager
def trace_capi():
    """Record, inside the block, every call into onnxruntime's Python files and its pybind11 module.

    Python functions and pybind11 functions come from sys.setprofile ('call' and 'c_call' events);
    a pybind11 constructor is not a 'c_call' (Python's type call reaches it from C), so the C classes'
    __init__ are wrapped for the block and restored after it. Yields a CapiTrace."""
    trace = CapiTrace()
    recorder = _Recorder(trace)
    originals = [(cls, vars(cls)["__init__"]) for cls in _pybind_classes()]
    previous = sys.getprofile()
    try:
        for cls, original in originals:
            setattr(cls, "__init__", _recording_init(cls, original, recorder))
        sys.setprofile(recorder)
        yield trace
    finally:
        sys.setprofile(previous)
        for cls, original in originals:
            setattr(cls, "__init__", original)


# --- the layers -------------------------------------------------------------------------------------------
def _installed_path(cls):
    """A Python class's file relative to site-packages ('onnxruntime/capi/...py')."""
    path = Path(inspect.getsourcefile(cls))
    parts = path.parts
    return "/".join(parts[parts.index("onnxruntime"):]) if "onnxruntime" in parts else str(path)


def c_object(obj):
    """The pybind11 object a Python onnxruntime object keeps (`_sess`, `_iobinding`, `_ortvalue`), or
    `obj` itself when it is already one."""
    if type(obj).__module__ == PYBIND_MODULE:
        return obj
    for attr in C_OBJECT_ATTRIBUTES:
        inner = getattr(obj, attr, None)
        if inner is not None and type(inner).__module__ == PYBIND_MODULE:
            return inner
    raise PybindViewError(f"{type(obj).__name__} keeps no pybind11 object in {C_OBJECT_ATTRIBUTES}; pass "
                          "an onnxruntime InferenceSession, IOBinding or OrtValue, or a C object")


def _c_row(label, inner):
    name = type(inner).__name__
    pybind_file, cpp = PYBIND_SOURCES.get(name, ("(not in ortlab's map)", "?"))
    return (label, f"C.{name}", pybind_file, cpp)


def layer_table(**objects):
    """The layers behind named objects (name=object): for a Python onnxruntime object its class and
    file, then the pybind11 object it keeps; for a C object the pybind11 file defining its class and
    the C++ class it wraps."""
    rows = []
    for label, obj in objects.items():
        if type(obj).__module__ != PYBIND_MODULE:
            inner = c_object(obj)
            attr = next(a for a in C_OBJECT_ATTRIBUTES if getattr(obj, a, None) is inner)
            rows.append((label, f"onnxruntime.{type(obj).__name__}", _installed_path(type(obj)),
                         f"Python: keeps .{attr}"))
            rows.append(_c_row(f"{label}.{attr}", inner))
        else:
            rows.append(_c_row(label, obj))
    return Table(("object", "class", "defined in", "wraps"), rows)


def pybind_methods(obj):
    """The public methods pybind11 defines on a C object's class (or on a C class), sorted."""
    cls = obj if isinstance(obj, type) else type(obj)
    if cls.__module__ != PYBIND_MODULE:
        raise PybindViewError(f"{cls.__name__} is not a class of {PYBIND_MODULE}; pass sess._sess")
    return sorted(name for name, member in vars(cls).items()
                  if not name.startswith("_") and type(member).__name__ == "instancemethod")


# --- the training classes ----------------------------------------------------------------------------------
def _bound_text(value, bound):
    return f"< {bound:.0e}" if value < bound else f"{value:.1e} (over {bound:.0e})"


def gradient_table(ours, reference, bound=1e-5):
    """One row per gradient: its shape and max |ours - reference|, printed as '< bound' (stable on any
    CPU) or as the value when over it. `ours` and `reference` are {name: torch tensor}."""
    if set(ours) != set(reference):
        raise PybindViewError(f"different gradients: only ours {sorted(set(ours) - set(reference))}, "
                              f"only the reference's {sorted(set(reference) - set(ours))}")
    rows = []
    for name, expected in reference.items():
        gap = float((ours[name].double() - expected.double()).abs().max())
        rows.append((name, tuple(expected.shape), _bound_text(gap, bound)))
    return Table(("gradient of", "shape", "max |ORT - torch|"), rows)


def max_gap(ours, reference):
    """The largest max |ours - reference| over the gradients."""
    return max(float((ours[n].double() - reference[n].double()).abs().max()) for n in reference)


def memory_pattern_table(module, *args):
    """The module's first output read right after run_forward and again after run_backward, with
    ORTModule's setting (memory pattern off) and ORT's default (on): rows of plain values."""
    expected = float(torch_gradients(module, *args)[0][0])
    rows = []
    for pattern, setting in ((False, "off (ORTModule)"), (True, "on (ORT's default)")):
        agent = ModuleTrainingAgent(module, *args, sess_options=session_options(mem_pattern=pattern))
        run = agent.forward(*args)
        before = float(run.outputs[0])
        agent.backward(run)
        after = float(run.outputs[0])
        rows.append({"memory pattern": setting, "torch's loss": f"{expected:.4f}",
                     "after run_forward": f"{before:.4f}", "after run_backward": f"{after:.4f}",
                     "still the loss": after == before})
    return Table.from_dicts(rows)


# --- OrtValue and its Tensor ------------------------------------------------------------------------------
# What each method of C.OrtValue runs in C++ (onnxruntime/python/onnxruntime_pybind_ortvalue.cc, ORT 1.19.2):
# every one reaches the Tensor through OrtValue::Get<Tensor>() or GetMutable<Tensor>()
# (include/onnxruntime/core/framework/ort_value.h), which Python cannot call itself.
ORTVALUE_CPP = {
    "data_ptr": "GetMutable<Tensor>()->MutableDataRaw()",
    "device_name": "GetDeviceName(Get<Tensor>().Location().device)",
    "shape": "Get<Tensor>().Shape().GetDims()",
    "data_type": "Get<Tensor>().GetElementType(), as a type string",
    "element_type": "GetTensorProtoType(*ort_value): the Tensor's ONNX element type",
    "numpy": "GetPyObjFromTensor(Get<Tensor>(), ...): a numpy array of the Tensor",
}


def _shown(name, result):
    if name == "data_ptr":
        return f"an int: the Tensor's data address ({type(result).__name__})"
    if name == "element_type":
        return f"{result} (onnx.TensorProto.{_tensor_proto_name(result)})"
    if name == "numpy":
        return f"numpy.ndarray {result.dtype} {list(result.shape)}"
    return repr(result)


def _tensor_proto_name(number):
    from onnx import TensorProto  # light: onnx is imported by ortlab already

    return TensorProto.DataType.Name(number)


def ortvalue_table(value):
    """One row per method of an onnxruntime.OrtValue that reads its Tensor: the Python call, what it returned
    for `value`, and the C++ the pybind layer (onnxruntime_pybind_ortvalue.cc) runs for it. Addresses differ
    from run to run, so data_ptr() shows its type only."""
    rows = []
    for name, cpp_call in ORTVALUE_CPP.items():
        rows.append((f"value.{name}()", _shown(name, getattr(value, name)()), cpp_call))
    return Table(("Python", "returned", "C++ in onnxruntime_pybind_ortvalue.cc"), rows)


def numpy_copy_table(value):
    """Does OrtValue.numpy() copy? For a CPU OrtValue, read from addresses: where numpy()'s array starts
    against the Tensor's data_ptr(), whether two numpy() calls share memory, who owns it, and np.array() of
    it (a copy, for contrast). In ORT 1.19.2 GetPyObjFromTensor wraps a CPU Tensor's
    buffer; a CUDA Tensor, in a CUDA build of ORT, it copies to the host."""
    if value.device_name().lower() != "cpu":
        raise PybindViewError(f"numpy_copy_table reads a CPU OrtValue, not one on {value.device_name()!r}: "
                              f"use cuda_value_to_host() for a CUDA one")
    first, second = value.numpy(), value.numpy()
    copied = np.array(value.numpy())
    rows = [("value.numpy() starts at value.data_ptr()", first.ctypes.data == value.data_ptr()),
            ("two numpy() calls share memory", bool(np.shares_memory(first, second))),
            ("numpy()'s array owns its memory", bool(first.flags.owndata)),
            ("what keeps the buffer alive (the array's base)", type(first.base).__name__),
            ("np.array(value.numpy()) starts at value.data_ptr()", copied.ctypes.data == value.data_ptr())]
    return Table(("question", "answer"), rows)


def cuda_value_to_host(array):
    """On a machine with a CUDA GPU and torch: a CUDA OrtValue holding `array`, copied back to the host.
    Returns (host numpy array, the OrtValue, which path made and copied it). A CUDA build of ORT makes the
    value with ortvalue_from_numpy(array, "cuda", 0) and copies with numpy() (GetPyObjFromTensor with the CUDA
    device-to-host copy); the CPU build this lab pins has no CUDA copy, so there the value wraps a torch CUDA
    tensor through DLPack (C.OrtValue.from_dlpack) and torch copies it to the host (tensor.cpu())."""
    import torch  # heavy: torch, on the GPU path only

    ort = quiet_import("onnxruntime")
    if not torch.cuda.is_available():
        raise PybindViewError("cuda_value_to_host needs a CUDA GPU (torch.cuda.is_available() is False)")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), "cuda", 0)
        return value.numpy(), value, "ORT's CUDA build: OrtValue.numpy() copied device to host"
    on_gpu = torch.from_numpy(np.ascontiguousarray(array)).cuda()
    value = ort.OrtValue(capi().OrtValue.from_dlpack(on_gpu.__dlpack__(), False))
    host = torch.from_dlpack(value._ortvalue).cpu().numpy()  # the OrtValue's device memory, copied by torch
    return host, value, "ORT's CPU build (no CUDA copy in numpy()): DLPack to torch, then tensor.cpu()"


# --- our own pybind11 extension ----------------------------------------------------------------------------
def gelu_grad_inputs(n=4096, seed=0):
    """float32 (dy, x) for GeluGrad checks: x spread over [-12, 12] with the edge cases 0, -0, tiny, big."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal(n - 8) * 3, [0.0, -0.0, 1e-8, -1e-8, 6.0, -6.0, 12.0, -12.0]])
    return rng.standard_normal(n).astype(np.float32), x.astype(np.float32)


def gelu_grad_check(n=4096, seed=0, bound=1e-6):
    """The C++ GeluGrad against ortlab's numpy reference (float64) and ORT 1.19.2's CPU kernel: rows
    of max |C++ - other| / max(|dy|, 1), printed against `bound`."""
    from ortlab.session import run_node  # lazy: ortlab.session imports onnxruntime (2 s)

    dy, x = gelu_grad_inputs(n, seed)
    ours = cpp.gelu_grad(dy, x).astype(np.float64)
    (ort,) = run_node("GeluGrad", [dy, x], domain=MS_DOMAIN)
    scale = np.maximum(np.abs(dy), 1.0)
    rows = []
    for name, other in (("numpy reference (float64)", gelu_grad_reference(dy, x)),
                        ("ORT 1.19.2 GeluGrad (CPU)", ort)):
        gap = float(np.max(np.abs(ours - np.asarray(other, dtype=np.float64)) / scale))
        rows.append((name, n, _bound_text(gap, bound)))
    return Table(("C++ GeluGrad against", "elements", "max |diff| / max(|dy|, 1)"), rows)


def zero_copy_table(**buffers):
    """For each named numpy array or torch CPU tensor: does the C++ side see the same address as
    Python's own (numpy's ctypes.data, torch's data_ptr())?"""
    rows = []
    for name, value in buffers.items():
        python = value.data_ptr() if hasattr(value, "data_ptr") else value.ctypes.data
        seen = cpp.data_pointer(value)
        rows.append((name, type(value).__module__.split(".")[0], "data_ptr()" if hasattr(value, "data_ptr")
                     else "ctypes.data", seen == python))
    return Table(("buffer", "from", "Python's address", "C++ reads the same address"), rows)


def refusal(fn, *args, **kwargs):
    """The error `fn(*args, **kwargs)` raises, as 'ErrorType: message'; raises if nothing is raised."""
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - shown, not handled
        return f"{type(error).__name__}: {error}"
    raise PybindViewError(f"{getattr(fn, '__name__', fn)} accepted its arguments: nothing to show")


BROKEN_SOURCE = ("float twice(float v) { return 2 * vv; }  // a typo: vv\n"
                 "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"twice\", &twice); }\n")
BROKEN_NAME = "ortlab_broken"
FAILURE_FILE = "failure.txt"


@dataclass(frozen=True)
class BuildFailure:
    """A failed build's message (CppBuildError's, the cache folder written <cache>, the build's hash
    <hash>), how long it took and whether it was read from the cache rather than compiled now."""

    message: str
    seconds: float
    cached: bool


def _portable(message, root, key):
    """The message without this machine's cache folder and build hash (it depends on the Python build),
    and with the compiler's locale quotes as '."""
    for quote in ("\u2018", "\u2019"):
        message = message.replace(quote, "'")
    return message.replace(str(root), "<cache>").replace(key, f"{BROKEN_NAME}_<hash>")


def build_failure(source=BROKEN_SOURCE, fresh=False):
    """Build a broken extension and return its BuildFailure. A failing build costs what a good one
    does (g++ parses torch/extension.h before line 1 of the source, ~30-40 s on 2 cores), so its
    message is kept in the build folder and read back next time, unless `fresh`."""
    root, key = cpp.cache_root(), cpp.build_key(source, BROKEN_NAME)
    kept = root / key / FAILURE_FILE
    start = time.perf_counter()
    if kept.exists() and not fresh:
        return BuildFailure(_portable(kept.read_text(), root, key), time.perf_counter() - start, True)
    try:
        cpp.build_extension(source, name=BROKEN_NAME)
    except cpp.CppBuildError as failure:
        message = _portable(str(failure), root, key)
    else:
        raise PybindViewError("the source built: build_failure needs a source that does not compile")
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(message)
    return BuildFailure(message, time.perf_counter() - start, False)


def plot_gelu_grad_times(rows):
    """GeluGrad's time per call against the size, C++ vs numpy vs ORT (log-log); shows the figure."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    if not rows:
        raise PybindViewError("no timing rows: pass cpp_extension.time_gelu_grad()'s result")
    sizes = [r["size"] for r in rows]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for key, label, style in (("cpp_us", "C++ (pybind11, ours)", "o-"),
                              ("numpy_us", "numpy reference (float64)", "s--"),
                              ("ort_us", "ORT 1.19.2 session.run (one node)", "^:")):
        axes.plot(sizes, [r[key] for r in rows], style, label=label, linewidth=2)
    axes.set(xscale="log", yscale="log", xlabel="elements", ylabel="time per call (us)",
             title="GeluGrad on float32 vectors")
    axes.grid(alpha=0.3, which="both")
    axes.legend()
    figure.tight_layout()
    plt.show()


def speed_ratios(rows):
    """At the largest size of cpp_extension.time_gelu_grad's rows: how many times faster our C++ kernel is than
    numpy, and ORT's kernel than ours (below 1: ours is faster), as one line."""
    if not rows:
        raise PybindViewError("no timing rows: pass cpp_extension.time_gelu_grad()'s result")
    last = max(rows, key=lambda r: r["size"])
    return (f"at {last['size']:,} elements: C++ {last['numpy_us'] / last['cpp_us']:.1f}x faster than numpy; "
            f"ORT {last['cpp_us'] / last['ort_us']:.1f}x faster than our C++")
