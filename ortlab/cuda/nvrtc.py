"""CUDA C++ source -> PTX with NVIDIA's runtime compiler, NVRTC, called through ctypes.

NVRTC is a shared library (`libnvrtc.so.12`, from the `nvidia-cuda-nvrtc-cu12` wheel that torch
already installs); it needs no GPU and no driver. The call sequence, in NVRTC's own C API names:

    nvrtcCreateProgram(&prog, source, "kernel.cu", 0, NULL, NULL)    one program from one source
    nvrtcCompileProgram(prog, n, options)                            "--gpu-architecture=compute_80", ...
    nvrtcGetProgramLogSize(prog, &size); nvrtcGetProgramLog(prog, log)   warnings and errors, as text
    nvrtcGetPTXSize(prog, &size); nvrtcGetPTX(prog, ptx)             only when compiling succeeded
    nvrtcDestroyProgram(&prog)                                       always, also after an error

Every call returns an `nvrtcResult` (0 is NVRTC_SUCCESS; `nvrtcGetErrorString` names the others).
A compile error is NVRTC_ERROR_COMPILATION with the front end's log, whose lines read
`kernel.cu(LINE): error: MESSAGE`, then the source line and a caret under the column; `parse_log`
turns them into `Diagnostic`s. cuda-python's `cuda.bindings.nvrtc` wraps the same five calls.
"""
import contextlib
import ctypes
import ctypes.util
import glob
import os
import re
from dataclasses import dataclass
from functools import lru_cache

from ortlab.errors import OrtlabError

SOURCE_NAME = "kernel.cu"
# kernel.cu(12): error: identifier "x" is undefined   (also "warning", "remark")
_LOG_LINE = re.compile(r"^(?P<file>[^\s()][^()]*)\((?P<line>\d+)\): "
                       r"(?P<severity>catastrophic error|error|warning|remark)"
                       r"(?: #[\w-]+-D)?: (?P<message>.*)$")


@dataclass(frozen=True)
class Diagnostic:
    """One message of NVRTC's log: where (1-based line and column; column None if no caret; `file`
    is SOURCE_NAME for the compiled source, else the header the message is about) and what."""

    line: int
    column: int
    severity: str
    message: str
    file: str = SOURCE_NAME

    def __str__(self):
        where = ("" if self.file == SOURCE_NAME else f"{self.file} ") + f"line {self.line}" + (
            f", column {self.column}" if self.column else "")
        return f"{where}: {self.severity}: {self.message}"


class CudaCompileError(OrtlabError):
    """NVRTC refused the source: `.diagnostics` holds the compiler's own line, column and message."""

    def __init__(self, message, diagnostics=(), log=""):
        super().__init__(message)
        self.diagnostics = tuple(diagnostics)
        self.log = log


def _candidates():
    """Where libnvrtc may be: the pip wheels' folders (CUDA 12, then 11), then the system's."""
    found = []
    try:
        import nvidia.cuda_nvrtc  # optional: nvidia; the wheel torch depends on; a namespace package
        for folder in nvidia.cuda_nvrtc.__path__:
            found += sorted(glob.glob(os.path.join(folder, "lib", "libnvrtc.so*")), reverse=True)
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        found += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")), reverse=True)
    system = ctypes.util.find_library("nvrtc")
    return [p for p in found if "builtins" not in os.path.basename(p)] + ([system] if system else [])


@lru_cache(maxsize=1)
def library():
    """The loaded NVRTC (ctypes.CDLL) with its argument types declared; OrtlabError if none is found."""
    tried = _candidates()
    for path in tried:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        return _declare(lib)
    raise OrtlabError("NVIDIA's runtime compiler NVRTC (libnvrtc.so) was not found"
                      + (f" (tried {', '.join(tried)})" if tried else "")
                      + ": install it with `pip install nvidia-cuda-nvrtc-cu12` (torch's CUDA wheels bring it)")


def _declare(lib):
    p, i, size_p = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetErrorString.argtypes = [i]
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(i), ctypes.POINTER(i)]
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p, i, p, p]
    lib.nvrtcCompileProgram.argtypes = [p, i, ctypes.POINTER(ctypes.c_char_p)]
    lib.nvrtcGetProgramLogSize.argtypes = [p, size_p]
    lib.nvrtcGetProgramLog.argtypes = [p, ctypes.c_char_p]
    lib.nvrtcGetPTXSize.argtypes = [p, size_p]
    lib.nvrtcGetPTX.argtypes = [p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(p)]
    return lib


def version():
    """NVRTC's (major, minor), e.g. (12, 4)."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(result, call):
    if result != 0:
        name = library().nvrtcGetErrorString(result).decode()
        raise OrtlabError(f"NVRTC's {call} returned {name} ({result})")


def _text(prog, size_call, get_call):
    lib = library()
    size = ctypes.c_size_t()
    _check(getattr(lib, size_call)(prog, ctypes.byref(size)), size_call)
    buffer = ctypes.create_string_buffer(size.value)
    _check(getattr(lib, get_call)(prog, buffer), get_call)
    return buffer.value.decode(errors="replace")


def include_dirs():
    """CUDA's own headers (cuda_fp16.h, cuda_bf16.h, cooperative_groups.h...) from the
    nvidia-cuda-runtime-cu12 wheel torch installs, so that `#include <cuda_fp16.h>` works."""
    try:
        import nvidia.cuda_runtime  # optional: nvidia
    except ImportError:
        return []
    return [d for d in (os.path.join(f, "include") for f in nvidia.cuda_runtime.__path__)
            if os.path.isfile(os.path.join(d, "cuda_fp16.h"))]


@contextlib.contextmanager
def _thread_locale_kept():
    """Put the calling thread's locale back after NVRTC: nvrtcCompileProgram switches the thread to a "C"
    locale of its own (uselocale) and leaves it there, after which Python's open() reads text as ASCII."""
    libc = ctypes.CDLL(None)
    libc.uselocale.restype, libc.uselocale.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    before = libc.uselocale(None)  # NULL: ask, change nothing
    try:
        yield
    finally:
        libc.uselocale(before)


def compile_to_ptx(source, compute, options=()):
    """(ptx, log): `source` compiled for the virtual architecture `compute` ("compute_80") with the
    further NVRTC `options`. A compile error is a CudaCompileError carrying NVRTC's diagnostics."""
    with _thread_locale_kept():
        return _compile_to_ptx(source, compute, options)


def _compile_to_ptx(source, compute, options):
    lib = library()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), SOURCE_NAME.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        args = [f"--gpu-architecture={compute}", *(f"--include-path={d}" for d in include_dirs()), *options]
        argv = (ctypes.c_char_p * len(args))(*(a.encode() for a in args))
        result = lib.nvrtcCompileProgram(prog, len(args), argv)
        log = _text(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
        if result != 0:
            raise _compile_error(result, log, source, list(options))
        return _text(prog, "nvrtcGetPTXSize", "nvrtcGetPTX"), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _compile_error(result, log, source, options):
    name = library().nvrtcGetErrorString(result).decode()
    diagnostics = parse_log(log, source)
    errors = [d for d in diagnostics if d.severity.endswith("error")] or diagnostics
    if name == "NVRTC_ERROR_INVALID_OPTION":
        what = f"NVRTC rejected an option of {options}: {log.strip() or name}"
    elif errors:
        what = "; ".join(str(d) for d in errors[:5])
    else:
        what = log.strip() or name
    return CudaCompileError(f"CUDA C++ did not compile ({name}): {what}", diagnostics, log)


def parse_log(log, source=""):
    """NVRTC's log as Diagnostics. The column comes from the caret line under the echoed source
    line (NVRTC prints no column number); it is None when the echo is not that source line."""
    lines = log.splitlines()
    source_lines = source.split("\n")  # the compiler counts newlines only
    found = []
    for k, text in enumerate(lines):
        m = _LOG_LINE.match(text)
        if not m:
            continue
        line = int(m["line"])
        column = None
        ours = m["file"] == SOURCE_NAME
        if ours and k + 2 < len(lines) and lines[k + 2].strip() == "^" and 0 < line <= len(source_lines):
            column = _caret_column(lines[k + 1], lines[k + 2], source_lines[line - 1])
        found.append(Diagnostic(line, column, m["severity"], m["message"].strip(), m["file"]))
    return found


def _caret_column(echo, caret, original, indent="  "):
    """1-based column (in characters, a tab counting one) of the caret: NVRTC echoes the source line
    after two spaces and puts the caret under the offending character, keeping the line's tabs."""
    if echo.rstrip() != (indent + original).rstrip():
        return None
    return caret.index("^") - len(indent) + 1
