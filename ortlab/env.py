"""The environment the lab runs in: versions, device, execution providers, seeds.

Mirrors what ORT itself reports through `onnxruntime.get_available_providers()`
(onnxruntime/python/onnxruntime_pybind_state.cc) and `onnxruntime.get_device()`.
`python -m ortlab.env` prints the report.
"""
import contextlib
import importlib
import io
import importlib.metadata
import os
import platform
import random
import sys
from dataclasses import dataclass, field

from ortlab.errors import OrtlabError

DEVICE_VARIABLE = "ORTLAB_DEVICE"
TRITON_INTERPRET = "TRITON_INTERPRET"
_DEVICES = ("cpu", "cuda")
_ORT_PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


class DeviceError(OrtlabError):
    """The device asked for (by ORTLAB_DEVICE) is unknown or not usable here."""


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def onnxruntime_distribution():
    """Name and version of the installed ONNX Runtime wheel, e.g. ('onnxruntime-training-cpu', '1.19.2')."""
    for dist in ("onnxruntime-training-cpu", "onnxruntime-training", "onnxruntime-gpu", "onnxruntime"):
        version = _version(dist)
        if version:
            return dist, version
    return None, None


def quiet_import(name):
    """Import a module, dropping what it prints on stderr while importing.

    The training build's `import onnxruntime` imports torch.utils.cpp_extension, which
    prints a CUDA_HOME notice on machines with a CUDA toolkit but no GPU.
    """
    with contextlib.redirect_stderr(io.StringIO()):
        return importlib.import_module(name)


def capi():
    """onnxruntime's C++ binding module, `onnxruntime.capi._pybind_state` (built from
    onnxruntime/python/onnxruntime_pybind_state.cc), imported quietly: the classes the Python layer wraps."""
    return quiet_import("onnxruntime.capi._pybind_state")


def has_training_build():
    """True when `onnxruntime.training` (ORTModule, the training API) can be imported."""
    try:
        quiet_import("onnxruntime.training")
    except ImportError:
        return False
    return True


def has_ortmodule_extensions():
    """True when ORTModule's C++ extensions (torch_interop_utils) were built by the set-up."""
    try:
        importlib.import_module(
            "onnxruntime.training.ortmodule.torch_cpp_extensions.torch_interop_utils")
    except ImportError:
        return False
    return True


def cuda_available():
    """True when torch sees a CUDA GPU and ORT has its CUDA execution provider."""
    import torch  # heavy: torch

    onnxruntime = quiet_import("onnxruntime")
    return torch.cuda.is_available() and _ORT_PROVIDER["cuda"] in onnxruntime.get_available_providers()


def device():
    """The device the lab computes on: 'cuda' when a GPU is usable, else 'cpu'.

    Set ORTLAB_DEVICE=cpu (or cuda) to choose; asking for cuda where none is
    usable raises DeviceError instead of silently falling back.
    """
    wanted = os.environ.get(DEVICE_VARIABLE, "").strip().lower()
    if wanted and wanted not in _DEVICES:
        raise DeviceError(f"{DEVICE_VARIABLE}={wanted!r} is not a device ortlab knows; "
                          f"use one of {', '.join(_DEVICES)} or unset it")
    if wanted == "cuda" and not cuda_available():
        raise DeviceError(f"{DEVICE_VARIABLE}=cuda but no CUDA GPU is usable here (torch or ORT "
                          "has no CUDA); unset it or set it to cpu")
    if wanted:
        return wanted
    return "cuda" if cuda_available() else "cpu"


def providers():
    """ORT execution providers for `device()`, in priority order (CPU always last)."""
    dev = device()
    return [_ORT_PROVIDER["cuda"], _ORT_PROVIDER["cpu"]] if dev == "cuda" else [_ORT_PROVIDER["cpu"]]


def _torch_sees_cuda():
    try:
        import torch  # optional: torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def configure_triton():
    """Choose how Triton kernels run: compiled on a CUDA GPU, or Triton's interpreter on CPU.

    Triton reads TRITON_INTERPRET when it is first imported, so this runs when ortlab.env is
    imported (every ortlab module imports it first). A value the user set is left alone.
    Returns the mode: 'compiled (cuda)' or 'interpreter (cpu)'.
    """
    if TRITON_INTERPRET not in os.environ and not _torch_sees_cuda():
        os.environ[TRITON_INTERPRET] = "1"
    return triton_mode()


def triton_mode():
    """'interpreter (cpu)' when TRITON_INTERPRET=1, else 'compiled (cuda)'.

    Triton 3.x reads the variable when `@triton.jit` decorates a kernel, so it must be set
    before ortlab.triton_kernels (or any module defining kernels) is imported.
    """
    return "interpreter (cpu)" if os.environ.get(TRITON_INTERPRET) == "1" else "compiled (cuda)"


def kernel_device():
    """Where ortlab.triton_kernels puts tensors: 'cpu' under the interpreter, 'cuda' when compiled."""
    return "cpu" if triton_mode().startswith("interpreter") else "cuda"


def seed_everything(seed=0):
    """Seed Python, numpy and torch (CPU and CUDA), and ask torch for deterministic kernels."""
    import numpy as np  # lazy: with TRITON_INTERPRET set, importing ortlab.env loads no numpy
    import torch  # heavy: torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def seed_ort(seed=0):
    """Seed ONNX Runtime's own random generator (Dropout, RandomNormal... in ORT's kernels).

    ORT draws from a process-wide generator (onnxruntime.set_seed, onnxruntime/core/framework/
    random_seed.cc) that torch's seed does not touch: two ORTModule runs in one process draw
    different dropout masks unless it is reset between them.
    """
    quiet_import("onnxruntime").set_seed(seed)


@dataclass
class Report:
    """What `report()` found; prints as an aligned two-column table."""

    rows: dict = field(default_factory=dict)

    def __getitem__(self, key):
        return self.rows[key]

    def __repr__(self):
        width = max(len(k) for k in self.rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows.items())


def _device_name(dev):
    if dev == "cuda":
        import torch  # heavy: torch

        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine()


def report():
    """Versions of the stack, whether the training build and ORTModule's extensions are present,
    the device in use and ORT's available execution providers."""
    onnxruntime = quiet_import("onnxruntime")

    dist, ort_version = onnxruntime_distribution()
    dev = device()
    rows = {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "onnx": _version("onnx"),
        "onnxruntime": f"{ort_version} ({dist})",
        "triton": _version("triton") or "not installed",
        "triton kernels": triton_mode(),
        "training build": "yes" if has_training_build() else "no (plain onnxruntime)",
        "ORTModule extensions": "built" if has_ortmodule_extensions() else "not built (run make setup)",
        "device": f"{dev} ({_device_name(dev)})",
        "available providers": ", ".join(onnxruntime.get_available_providers()),
        "providers used": ", ".join(providers()),
        "executable": sys.executable,
    }
    return Report(rows)


configure_triton()

if __name__ == "__main__":
    print(report())

