"""A C++ kernel of our own, built at run time by torch.utils.cpp_extension.load_inline (pybind11).

Two float32 kernels in C++, reached from Python through pybind11's buffer protocol, so they read
and write numpy's (and, through `.numpy()`, torch's) memory where it lies, without a copy:

    gelu_grad(dy, x, out=None)   com.microsoft GeluGrad: dy * (Phi(x) + x * phi(x)), the erf form.
                                 Mirrors orttraining/orttraining/training_ops/cpu/activation/
                                 activations_grad.cc
    sgd_step(w, g, lr, ...)      a fused SGD step in place: w -= lr * v, v = momentum * v + g + wd * w
                                 (torch.optim.SGD's rule; ORT's SGDOptimizer is the momentum-free case,
                                 orttraining/orttraining/training_ops/cpu/optimizer/sgd/sgd.cc)

`build()` compiles once (about 30 s on 2 cores) into a folder that a second process finds
(~/.cache/ortlab/torch_extensions, or $ORTLAB_EXTENSIONS_DIR), named by a hash of the source, the
flags, torch and Python, so a stale build is never loaded; a cached load takes milliseconds.
`register_cpp_kernels()` makes the C++ GeluGrad the kernel of ortlab.engine's CPU EP (undone by
`.unregister()` or a `with` block). The errors a learner meets at this boundary (a float64 or a
non-contiguous array, a read-only output, a compiler error) come back as CppExtensionError saying
what to pass or what to do. ORT's own pybind layer: onnxruntime/python/onnxruntime_pybind_state.cc.
"""
import hashlib
import os
import re
import sys
import time
import timeit
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto

from ortlab.engine.kernel_registry import kernel_registry, register_op_kernel, unregister_op_kernel
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.onnx_defs import one_node_model
from ortlab.ops.reference import gelu_grad_reference

CPP_SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace {

std::string shape_text(const py::buffer_info& info) {
  std::string text = "(";
  for (py::ssize_t d = 0; d < info.ndim; ++d) text += (d ? ", " : "") + std::to_string(info.shape[d]);
  return text + (info.ndim == 1 ? ",)" : ")");
}

// The buffer behind a Python object, checked to be float32 and C-contiguous: the kernel walks
// `size` floats from `ptr`. pybind11 turns std::invalid_argument into ValueError.
py::buffer_info float_buffer(const py::buffer& value, const char* name, bool writable) {
  py::buffer_info info = value.request();
  if (writable && info.readonly)
    throw std::invalid_argument(std::string("readonly: ") + name +
                                " is read-only; the kernel writes into it");
  if (info.format != py::format_descriptor<float>::format() || info.itemsize != 4)
    throw std::invalid_argument(std::string("dtype: ") + name + " has buffer format '" + info.format + "' (" +
                                std::to_string(info.itemsize) + "-byte items); the kernel takes float32 " +
                                "('f')");
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] != 1 && info.strides[d] != expected)
      throw std::invalid_argument(std::string("layout: ") + name + " of shape " + shape_text(info) +
                                  " is not C-contiguous (stride " + std::to_string(info.strides[d]) +
                                  " bytes in dim " + std::to_string(d) + ", " + std::to_string(expected) +
                                  " expected)");
    expected *= info.shape[d];
  }
  return info;
}

void same_size(const py::buffer_info& a, const char* a_name, const py::buffer_info& b, const char* b_name) {
  if (a.shape != b.shape)
    throw std::invalid_argument(std::string("shape: ") + a_name + " has shape " + shape_text(a) + ", " +
                                b_name + " has shape " + shape_text(b) + "; they must be equal");
}

}  // namespace

// dX = dY * (Phi(x) + x * phi(x)) in float, as ORT's CPU GeluGrad (activations_grad.cc) computes it.
void gelu_grad(py::buffer dy, py::buffer x, py::buffer dx) {
  py::buffer_info dy_info = float_buffer(dy, "dy", false), x_info = float_buffer(x, "x", false);
  py::buffer_info dx_info = float_buffer(dx, "out", true);
  same_size(dy_info, "dy", x_info, "x");
  same_size(dx_info, "out", x_info, "x");
  const float* dy_data = static_cast<const float*>(dy_info.ptr);
  const float* x_data = static_cast<const float*>(x_info.ptr);
  float* dx_data = static_cast<float*>(dx_info.ptr);
  const float alpha = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);  // 1 / sqrt(2 pi)
  const float sqrt1_2 = static_cast<float>(M_SQRT1_2);
  const py::ssize_t n = x_info.size;
  py::gil_scoped_release release;  // other Python threads run while C++ computes
  for (py::ssize_t i = 0; i < n; ++i) {
    const float v = x_data[i];
    dx_data[i] = dy_data[i] * (0.5f * (std::erf(v * sqrt1_2) + 1.0f) + v * alpha * std::exp(-0.5f * v * v));
  }
}

// In place: g' = g + weight_decay * w; v = momentum * v + g' (when v is given); w -= lr * (v or g').
void sgd_step(py::buffer w, py::buffer g, double lr, double weight_decay, double momentum,
              py::object velocity) {
  py::buffer_info w_info = float_buffer(w, "w", true), g_info = float_buffer(g, "g", false);
  same_size(w_info, "w", g_info, "g");
  const bool with_velocity = !velocity.is_none();
  py::buffer_info v_info;
  if (with_velocity) {
    v_info = float_buffer(velocity.cast<py::buffer>(), "velocity", true);
    same_size(v_info, "velocity", w_info, "w");
  }
  float* w_data = static_cast<float*>(w_info.ptr);
  const float* g_data = static_cast<const float*>(g_info.ptr);
  float* v_data = with_velocity ? static_cast<float*>(v_info.ptr) : nullptr;
  const float lr_f = static_cast<float>(lr), wd = static_cast<float>(weight_decay);
  const float mom = static_cast<float>(momentum);
  const py::ssize_t n = w_info.size;
  py::gil_scoped_release release;
  for (py::ssize_t i = 0; i < n; ++i) {
    float step = wd != 0.0f ? g_data[i] + wd * w_data[i] : g_data[i];
    if (v_data) {
      v_data[i] = mom * v_data[i] + step;
      step = v_data[i];
    }
    w_data[i] -= lr_f * step;
  }
}

// The address of the first element as C++ sees it: equal to numpy's, the proof that nothing was copied.
std::uintptr_t data_pointer(py::buffer value) {
  return reinterpret_cast<std::uintptr_t>(value.request().ptr);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ortlab's C++ kernels: GeluGrad and a fused SGD step on float32 buffers";
  m.def("gelu_grad", &gelu_grad, "out = dy * gelu'(x), float32, C-contiguous", py::arg("dy"), py::arg("x"),
        py::arg("out"));
  m.def("sgd_step", &sgd_step, "w -= lr * (momentum * v + g + weight_decay * w), in place", py::arg("w"),
        py::arg("g"), py::arg("lr"), py::arg("weight_decay") = 0.0, py::arg("momentum") = 0.0,
        py::arg("velocity") = py::none());
  m.def("data_pointer", &data_pointer, "the address C++ reads", py::arg("value"));
}
"""

CFLAGS = ("-O3",)  # load_inline compiles with no -O (that is -O0) unless told; no -march: portable results
NAME = "ortlab_cpp_kernels"
CACHE_ENV = "ORTLAB_EXTENSIONS_DIR"
STALE_LOCK_S = 600  # a build lock older than this was left by a killed build
MS_DOMAIN = "com.microsoft"


class CppExtensionError(OrtlabError):
    """A value the C++ kernel cannot take, or a build that failed: what is wrong and what to do."""


class CppBuildError(CppExtensionError):
    """The C++ source did not compile: the compiler's first errors, and what to do."""


@dataclass(frozen=True)
class BuildResult:
    """A loaded extension: the module, how long build() took, whether it compiled, and where it lives."""

    module: object
    seconds: float
    compiled: bool
    directory: Path

    def __repr__(self):
        how = "compiled" if self.compiled else "loaded from the cache"
        return f"BuildResult({self.module.__name__}, {how} in {self.seconds:.2f} s)"


_LOADED = {}  # build key -> BuildResult, so that a process builds and imports each extension once


def cache_root():
    """The folder builds are cached in: $ORTLAB_EXTENSIONS_DIR, else ~/.cache/ortlab/torch_extensions."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "ortlab" / "torch_extensions"


def build_key(source, name=NAME, cflags=CFLAGS):
    """The extension's name on disk: `name` and a hash of what the binary depends on."""
    import torch  # heavy: torch

    text = "\n".join([source, " ".join(cflags), torch.__version__, sys.version, sys.platform])
    return f"{name}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _cpp_extension():
    """torch.utils.cpp_extension, imported without its 'No CUDA runtime is found' note on stderr
    (the CPU machine's torch wheel is a CUDA build with no CUDA runtime)."""
    return quiet_import("torch.utils.cpp_extension")


def check_build_arguments(source, name, cflags):
    """What load_inline needs, checked before a compiler runs (a build takes ~40 s): the source a non-empty str
    defining PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) (the module gets the name load_inline gives it), the
    name a Python identifier, cflags a list of str (one str would be passed letter by letter)."""
    if not isinstance(source, str) or not source.strip():
        raise CppExtensionError(f"build_extension takes the C++ source as a non-empty str, not "
                                f"{type(source).__name__} {source!r:.60}")
    if not re.search(r"PYBIND11_MODULE\s*\(\s*TORCH_EXTENSION_NAME\b", source):
        raise CppExtensionError("the source defines no PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(...); }: "
                                "without it the built library exports no functions Python can import; add one "
                                "(load_inline sets TORCH_EXTENSION_NAME to the module's name)")
    if not isinstance(name, str) or not name.isidentifier():
        raise CppExtensionError(f"name must be a Python identifier such as 'my_kernels', not {name!r}")
    if isinstance(cflags, (str, bytes)) or not isinstance(cflags, (list, tuple)) or \
            not all(isinstance(f, str) for f in cflags):
        raise CppExtensionError(f"cflags must be a list of str such as ['-O3'], not {cflags!r}")


def build_extension(source, name=NAME, cflags=CFLAGS, verbose=False):
    """Compile `source` (a C++ file's text with its own PYBIND11_MODULE) with load_inline, or load
    it from the cache; returns a BuildResult. Raises CppBuildError with the compiler's first errors,
    and CppExtensionError at once for arguments no build could use."""
    check_build_arguments(source, name, cflags)
    key = build_key(source, name, cflags)
    if key in _LOADED:
        return _LOADED[key]
    directory = cache_root() / key
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CppExtensionError(f"cannot create the build folder {directory}: {exc.strerror}; set "
                                f"${CACHE_ENV} to a folder you can write to") from None
    remove_stale_lock(directory)
    compiled = not (directory / f"{key}.so").exists()
    cpp_extension = _cpp_extension()
    start = time.perf_counter()
    try:
        module = cpp_extension.load_inline(key, cpp_sources=[source], extra_cflags=list(cflags),
                                           build_directory=str(directory), verbose=verbose, with_cuda=False)
    except RuntimeError as failure:
        raise CppBuildError(explain_build_failure(str(failure), directory)) from None
    except ImportError as failure:  # a cached .so that no longer loads (a changed system library)
        raise CppBuildError(f"the built extension {directory / (key + '.so')} would not load: {failure}. "
                            f"Delete {directory} and build again.") from None
    result = BuildResult(module, time.perf_counter() - start, compiled, directory)
    _LOADED[key] = result
    return result


def remove_stale_lock(directory, age_s=STALE_LOCK_S):
    """Remove a build folder's `lock` file older than `age_s`: torch's FileBaton waits for ever on a
    lock that a killed build left behind (a real build holds it for a minute or two). True if removed."""
    lock = Path(directory) / "lock"
    try:
        if time.time() - lock.stat().st_mtime > age_s:
            lock.unlink()
            return True
    except FileNotFoundError:
        pass
    return False


def build(verbose=False):
    """ortlab's C++ kernels, compiled on first use (~30 s on 2 cores) or loaded from the cache."""
    return build_extension(CPP_SOURCE, verbose=verbose)


def first_errors(log, limit=6):
    """The compiler's first error lines (and the notes right after them) from a build log."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if re.search(r"(^|:\d+:\d+: )(fatal )?error: ", line)]
    kept = []
    for i in starts:
        for line in lines[i:i + 3]:
            if line not in kept and not line.startswith(("ninja:", "[", "FAILED:")):
                kept.append(line)
        if len(kept) >= limit:
            break
    return kept[:limit]


def explain_build_failure(log, directory):
    """A build failure in a few lines: where the compiler stopped, and what to do."""
    errors = first_errors(log)
    shown = "\n".join("    " + line.rstrip()[:300] for line in errors) or "    " + log.strip()[-600:]
    return (f"the C++ extension did not build. The compiler's first errors (main.cpp is your source after "
            f"load_inline put '#include <torch/extension.h>' on top, so line numbers are one more):\n"
            f"{shown}\n"
            f"Fix the source at that line and build again. If no compiler error is shown, check that g++ and "
            f"ninja work (`g++ --version`, `ninja --version`); to start clean, delete {directory}.")


# --- the Python side of the boundary ---------------------------------------------------------------
def as_buffer(value, name):
    """A numpy view of `value` that shares its memory (numpy as is, a CPU torch tensor through
    .numpy()); no dtype or layout conversion here: the C++ side checks and refuses."""
    if type(value).__module__.startswith("torch"):
        if value.device.type != "cpu":
            raise CppExtensionError(f"{name} is on {value.device}; the C++ kernel reads host memory: pass "
                                    f"{name}.cpu() (and copy the result back)")
        return value.detach().numpy()
    if not isinstance(value, np.ndarray):
        raise CppExtensionError(f"{name} is a {type(value).__name__}; pass a numpy array or a torch CPU "
                                "tensor (np.asarray(..., dtype=np.float32))")
    return value


_ADVICE = {
    "dtype": "The kernel reads the memory as float32 and cannot convert it: pass {0}.astype(np.float32) "
             "(numpy) or {0}.float() (torch). A converted array is a new buffer: keep it to read what the "
             "kernel wrote.",
    "layout": "The kernel walks the memory element after element: pass np.ascontiguousarray({0}) (numpy) or "
              "{0}.contiguous() (torch), a copy; a transposed or strided view is not contiguous.",
    "shape": "Pass arrays of the same shape (the kernel does not broadcast).",
    "readonly": "Pass a writable array (np.array({0}) copies a read-only one).",
}


def explain_refusal(function, message):
    """The C++ side's refusal ('kind: name ...') with what to pass instead."""
    kind, _, said = message.partition(": ")
    name = said.split(" ", 1)[0]
    advice = _ADVICE.get(kind, "").format(name)
    return f"C++ {function} refused: {said or kind}. {advice}".rstrip()


def call(fn, *args, **kwargs):
    """Call a C++ function; its refusals (ValueError, TypeError) become CppExtensionError."""
    try:
        return fn(*args, **kwargs)
    except ValueError as refused:
        raise CppExtensionError(explain_refusal(fn.__name__, str(refused))) from None
    except TypeError as refused:
        first = str(refused).splitlines()[0]
        raise CppExtensionError(f"C++ {fn.__name__} refused its arguments ({first}); pass numpy float32 "
                                "arrays or torch CPU float32 tensors and Python floats") from None


def gelu_grad(dy, x, out=None):
    """dy * gelu'(x) by the C++ kernel, into `out` (allocated float32 when None); returns out."""
    dy_b, x_b = as_buffer(dy, "dy"), as_buffer(x, "x")
    if out is None:
        out = np.empty(x_b.shape, dtype=np.float32)
    call(build().module.gelu_grad, dy_b, x_b, as_buffer(out, "out"))
    return out


def sgd_step(w, g, lr, weight_decay=0.0, momentum=0.0, velocity=None):
    """One fused SGD step in place on w (and on the velocity buffer, zeros before the first step).
    lr, weight_decay and momentum must be finite numbers >= 0 (torch.optim.SGD's rule, NaN and inf refused)."""
    for what, value in (("lr", lr), ("weight_decay", weight_decay), ("momentum", momentum)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
                not 0 <= value < float("inf"):
            raise CppExtensionError(f"sgd_step: {what} must be a finite number >= 0, not {value!r} (a NaN or inf "
                                    "turns w into NaN without an error)")
    velocity_b = None if velocity is None else as_buffer(velocity, "velocity")
    call(build().module.sgd_step, as_buffer(w, "w"), as_buffer(g, "g"), float(lr), float(weight_decay),
         float(momentum), velocity_b)
    return w


def data_pointer(value):
    """The address of `value`'s first element as the C++ side sees it."""
    return call(build().module.data_pointer, as_buffer(value, "value"))


# --- the engine's CPU EP --------------------------------------------------------------------------
class CppKernels:
    """What register_cpp_kernels() put into an EP's kernel registry; `unregister()` (or leaving a
    `with` block) puts back what was there before."""

    def __init__(self, provider, previous):
        self.provider, self.previous = provider, previous  # {(op, domain): KernelCreateInfo or None}
        self.active = True

    def unregister(self):
        """Remove the C++ kernels and restore the kernels they replaced."""
        if not self.active:
            return
        for (op_type, domain), old in self.previous.items():
            unregister_op_kernel(op_type, domain, self.provider)
            if old is not None:
                kernel_registry(self.provider).register(old, override=True)
        self.active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unregister()

    def __repr__(self):
        ops = ", ".join(f"{d}:{op}" for op, d in self.previous)
        return f"CppKernels({ops} on {self.provider}{'' if self.active else ', unregistered'})"


def gelu_grad_kernel(ctx):
    """The engine kernel: C++ GeluGrad from the frame's input buffers into the frame's output
    (ORT's tensors are always contiguous; a strided view the engine hands over is copied first)."""
    dy, x = np.ascontiguousarray(ctx.input(0)), np.ascontiguousarray(ctx.input(1))
    call(build().module.gelu_grad, dy, x, ctx.output(0, x.shape, np.float32))


def register_cpp_kernels(provider="CPUExecutionProvider", override=False):
    """Make the C++ GeluGrad `provider`'s kernel for com.microsoft GeluGrad (float32 only, as ORT's
    CPU kernel: ONNX_OPERATOR_KERNEL_EX(GeluGrad, kMSDomain, 1, kCpuExecutionProvider, ...)).
    Builds the extension first. Returns a CppKernels; `.unregister()` undoes it."""
    register = register_op_kernel("GeluGrad", MS_DOMAIN, provider, override=override,  # refuses an unknown EP
                                  type_constraints={0: ("float32",), 1: ("float32",)})  # before the build
    build()
    key = ("GeluGrad", MS_DOMAIN)
    previous = {key: kernel_registry(provider).kernels.get(key)}
    register(gelu_grad_kernel)
    return CppKernels(provider, previous)


# --- checks and timings -----------------------------------------------------------------------------
def ort_gelu_grad_session():
    """An ORT session of one com.microsoft GeluGrad node on float32 vectors of any length."""
    from ortlab.session import create, session_options  # lazy: loads onnxruntime (2 s), for the ORT timing only

    model = one_node_model("GeluGrad", [(TensorProto.FLOAT, ["n"])] * 2, domain=MS_DOMAIN)
    return create(model, session_options("disable"), ["CPUExecutionProvider"])


def _best_of(fn, repeat):
    number = max(1, int(0.02 / max(timeit.timeit(fn, number=1), 1e-7)))
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def time_gelu_grad(sizes=(1 << 10, 1 << 14, 1 << 18, 1 << 20), repeat=5, seed=0):
    """GeluGrad timed three ways per size: C++ (this extension), numpy (ortlab's float64 reference)
    and ORT 1.19.2's CPU kernel (a one-node session's run, its call overhead included).
    Returns rows {size, cpp_us, numpy_us, ort_us}; timings vary by machine and are not asserted."""
    module, session = build().module, ort_gelu_grad_session()
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        dy, x = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        out = np.empty_like(x)
        feeds = {"x0": dy, "x1": x}
        rows.append({"size": n,
                     "cpp_us": 1e6 * _best_of(lambda: module.gelu_grad(dy, x, out), repeat),
                     "numpy_us": 1e6 * _best_of(lambda: gelu_grad_reference(dy, x), repeat),
                     "ort_us": 1e6 * _best_of(lambda: session.run(None, feeds), repeat)})
    return rows
