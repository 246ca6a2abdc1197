"""Building a CUDA C++ kernel for the CPU runner (ortlab.cuda.cpu): its parameters read from the
source, the source rewritten (checked pointer parameters, dynamic shared memory, const_cast), a
launch entry added, and the whole compiled by g++ with cpu_cuda.h into a shared library, once per
source."""
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortlab.errors import OrtlabError

HEADER = Path(__file__).with_name("cpu_cuda.h")
CHECKS = HEADER.with_name("cpu_checks.h")  # included by HEADER
STACK_KIB = 128  # kStackBytes in cpu_cuda.h
# CUDA C++ parameter types -> numpy dtypes (a pointer parameter takes an array of that dtype)
DTYPES = {
    "float": np.float32, "double": np.float64, "bool": np.bool_,
    "char": np.int8, "signed char": np.int8, "int8_t": np.int8, "unsigned char": np.uint8, "uint8_t": np.uint8,
    "short": np.int16, "int16_t": np.int16, "unsigned short": np.uint16, "uint16_t": np.uint16,
    "int": np.int32, "int32_t": np.int32, "unsigned": np.uint32, "unsigned int": np.uint32, "uint32_t": np.uint32,
    "long": np.int64, "long long": np.int64, "int64_t": np.int64,
    "unsigned long": np.uint64, "unsigned long long": np.uint64, "uint64_t": np.uint64, "size_t": np.uint64,
}
# -U_FORTIFY_SOURCE: the runner's _longjmp between thread stacks is by design, not a stack smash.
# -fsanitize=thread: GCC calls __tsan_read4(address) etc. before the kernel's loads and stores; the
# callbacks are cpu_checks.h's (no ThreadSanitizer runtime), and volatile accesses have their own.
BUILD = (["g++", "-std=c++17", "-O1", "-g", "-fPIC", "-fvisibility=hidden", "-fsanitize=bounds", "-U_FORTIFY_SOURCE",
          "-fsanitize=thread", "--param", "tsan-distinguish-volatile=1", "--param", "tsan-instrument-func-entry-exit=0",
          "-c", "kernel.cpp", "-o", "kernel.o"],
         # linked without -fsanitize: the handlers are cpu_cuda.h's, not libubsan's or libtsan's
         ["g++", "-shared", "kernel.o", "-o", "kernel.so"])
_BUILT = {}
_DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?"
                             r"(?P<type>[A-Za-z_][\w ]*?)\s+(?P<name>\w+)\s*\[\s*\]\s*;")


@dataclass(frozen=True)
class Param:
    """One kernel parameter: `pointer` params take a numpy array of `dtype`, the others a scalar."""

    name: str
    type: str        # the element type as written, e.g. "const float"
    pointer: bool
    const: bool
    dtype: type


@dataclass(frozen=True, eq=False)
class CpuKernel:
    name: str
    params: tuple
    library: ctypes.CDLL
    entry: str = "ortlab_launch"  # the library's extern "C" function that launches this kernel
    max_threads: int = 0  # from __launch_bounds__(max_threads), 0 without

    def __repr__(self):
        params = ", ".join(f"{p.type}{'*' if p.pointer else ''} {p.name}" for p in self.params)
        return f"<CpuKernel {self.name}({params})>"


def _signature(source, name):
    """(start, end) of the parameter list's text of __global__ kernel `name` in `source`."""
    matches = list(re.finditer(r"__global__[^;{}]*?\b" + re.escape(name) + r"\s*\(", source))
    # the definition, not a declaration before it: its parameter list is followed by the body
    m = next((m for m in matches if re.match(r"\s*\{", source[_closing(source, m.end(), name) + 1:])), None)
    if not m:
        plain = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", source)
        found = re.findall(r"__global__[^;{}(]*?\b(\w+)\s*\(", plain)
        raise OrtlabError(f"no __global__ kernel named {name!r} in the source; its kernels are {found}")
    return m.end(), _closing(source, m.end(), name)


def _closing(source, start, name):
    """Index of the parenthesis that closes the one opened just before `start`."""
    depth = 1
    for k in range(start, len(source)):
        depth += {"(": 1, ")": -1}.get(source[k], 0)
        if depth == 0:
            return k
    raise OrtlabError(f"kernel {name!r}'s parameter list has no closing parenthesis")


def _param(text):
    words = text.replace("*", " * ").replace("__restrict__", " ").replace("__restrict", " ").split()
    if len(words) < 2 or not re.fullmatch(r"[A-Za-z_]\w*", words[-1]):
        raise OrtlabError(f"cannot read kernel parameter {text.strip()!r}: write it as TYPE NAME or TYPE* NAME")
    name, words = words[-1], words[:-1]
    stars = words.count("*")
    const = "const" in words[: words.index("*")] if stars else "const" in words
    base = " ".join(w for w in words if w not in ("*", "const"))
    if stars > 1 or base not in DTYPES or (stars and words[-1] != "*" and words[-1] != "const"):
        raise OrtlabError(f"kernel parameter {text.strip()!r}: the CPU runner takes scalars and one-level "
                          f"pointers of {sorted(DTYPES)}")
    return Param(name, ("const " if const else "") + base, bool(stars), const, DTYPES[base])


def parse_params(source, name):
    """The Params of kernel `name`, read from its signature in `source`."""
    start, end = _signature(source, name)
    text = source[start:end].strip()
    if text in ("", "void"):
        return ()
    return tuple(_param(p) for p in text.split(","))


def _rewrite(source, name, params):
    """The source with pointer parameters made checked pointers (line numbers unchanged)."""
    start, end = _signature(source, name)
    listed = ", ".join(f"ortlab_cpu::ptr<{p.type}> {p.name}" if p.pointer else f"{p.type} {p.name}"
                       for p in params)
    source = _const_casts(source[:start] + listed + "\n" * source[start:end].count("\n") + source[end:])
    return _DYNAMIC_SHARED.sub(lambda m: f"ortlab_cpu::ptr<{m['type']}> {m['name']} = "
                               f"ortlab_cpu::dynamic_shared<{m['type']}>(\"{m['name']}\");", source)


def _const_casts(source):
    """const_cast<T*>(e) made const_cast<T*>(ortlab_cpu::raw(e)): a checked pointer parameter is a
    class, which const_cast cannot take (line numbers unchanged)."""
    for m in reversed(list(re.finditer(r"\bconst_cast\s*<", source))):
        depth, k = 1, m.end()
        while k < len(source) and depth:
            depth += {"<": 1, ">": -1}.get(source[k], 0)
            k += 1
        opened = re.match(r"\s*\(", source[k:])
        if depth or not opened:
            continue
        start = k + opened.end()
        try:
            end = _closing(source, start, "const_cast")
        except OrtlabError:
            continue
        source = source[:start] + "ortlab_cpu::raw(" + source[start:end] + ")" + source[end:]
    return source


def launch_bounds(source, name):
    """The expression of kernel `name`'s __launch_bounds__(max_threads[, ...]) as written, or None."""
    for m in re.finditer(r"__global__[^;{}]*?\b" + re.escape(name) + r"\s*\(", source):
        before = max(source.rfind(c, 0, m.start()) for c in ";{}")
        prefix = re.sub(r"^\s*#.*$", "", source[before + 1:m.end()], flags=re.M)  # not a #define's text
        bounds = re.search(r"__launch_bounds__\s*\(", prefix)
        if bounds:
            text = prefix[bounds.end():_closing(prefix, bounds.end(), name)]
            depth = 0
            for k, c in enumerate(text):
                depth += {"(": 1, ")": -1, "<": 1, ">": -1}.get(c, 0)
                if c == "," and depth == 0:
                    return text[:k].strip()
            return text.strip()
    return None


def _wrapper(name, params, entry, bounds):
    """The extern "C" launch entry of kernel `name`, and `entry`_bounds returning its launch bound."""
    info = ", ".join(f'{{"{p.name}", sizeof({p.type}), {int(p.pointer)}, {int(p.const)}}}' for p in params)
    args = [f'ortlab_cpu::argument<{p.type}>({k}, "{p.name}")' if p.pointer else f"*({p.type}*)ortlab_args[{k}]"
            for k, p in enumerate(params)]
    # every name here starts with ortlab_, so that no kernel name or macro of the source collides
    return f"""
extern "C" __attribute__((visibility("default"))) long long {entry}_bounds() {{ return (long long)({bounds or 0}); }}
extern "C" __attribute__((visibility("default"))) ORTLAB_RT int {entry}(
    void** ortlab_args, const long long* ortlab_sizes, const int* ortlab_writable, int* ortlab_written,
    unsigned ortlab_gx, unsigned ortlab_gy, unsigned ortlab_gz, unsigned ortlab_bx, unsigned ortlab_by,
    unsigned ortlab_bz, int ortlab_schedule, int ortlab_lockstep, unsigned long long ortlab_shared,
    char* ortlab_error, int ortlab_error_size) {{
  static const ortlab_cpu::ParamInfo ortlab_params[] = {{{info or '{"", 0, 0, 0}'}}};
  const ortlab_cpu::Arguments ortlab_arguments{{ortlab_args, ortlab_sizes, ortlab_writable, ortlab_written,
                                                ortlab_params, {len(params)}}};
  return ortlab_cpu::run(dim3(ortlab_gx, ortlab_gy, ortlab_gz), dim3(ortlab_bx, ortlab_by, ortlab_bz), ortlab_schedule,
                         ortlab_lockstep, ortlab_shared, ortlab_arguments, [=] {{ {name}({", ".join(args)}); }},
                         ortlab_error, ortlab_error_size);
}}
"""


# after the kernel's source: the static shared arrays lie between this guard and cpu_checks.h's
_GUARD = ('\nextern "C" { __attribute__((section("ortlab_shared"), used, visibility("hidden"))) '
          'char ortlab_shared_guard_high[16384]; }\n')


def _library(text, key, timeout):
    try:
        return ctypes.CDLL(_build(text, key, timeout))
    except OSError as exc:  # e.g. an undefined symbol the kernel needs
        raise OrtlabError(f"the CPU runner could not load the kernel's library: {exc}") from None


def _kernel(library, name, params, entry):
    bounds = getattr(library, entry + "_bounds")
    bounds.restype = ctypes.c_longlong
    return CpuKernel(name, params, library, entry, max(0, int(bounds())))


def _headers():
    return HEADER.read_text() + CHECKS.read_text()


def cpu_kernel(source, name, timeout=120.0):
    """The CpuKernel of __global__ kernel `name` in CUDA C++ `source`, compiled by g++ (cached)."""
    if not isinstance(source, str) or not isinstance(name, str):
        raise OrtlabError("cpu_kernel takes the CUDA C++ source and the kernel's name, both str")
    params = parse_params(source, name)
    key = hashlib.sha256("\0".join((source, name, _headers(), repr(BUILD))).encode()).hexdigest()[:20]
    if key not in _BUILT:
        text = (f'#include "{HEADER}"\n#line 1 "kernel.cu"\n' + _rewrite(source, name, params)
                + '\n#line 1 "ortlab_launch"\n' + _GUARD
                + _wrapper(name, params, "ortlab_launch", launch_bounds(source, name)))
        _BUILT[key] = _kernel(_library(text, key, timeout), name, params, "ortlab_launch")
    return _BUILT[key]


def cpu_kernels(source, names, timeout=120.0):
    """{name: CpuKernel} for several __global__ kernels of one `source`, built by one g++ run into
    one library (each kernel's pointer parameters checked, each with its own launch entry)."""
    if not isinstance(source, str) or isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise OrtlabError("cpu_kernels takes the CUDA C++ source (str) and a list of kernel names")
    names = tuple(dict.fromkeys(names))
    if not names:
        raise OrtlabError("cpu_kernels needs at least one kernel name")
    key = hashlib.sha256("\0".join((source, *names, _headers(), repr(BUILD))).encode()).hexdigest()[:20]
    if key not in _BUILT:
        text, params = source, {}
        for name in names:  # each rewrite keeps line numbers, so later signatures are found again
            params[name] = parse_params(text, name)
            text = _rewrite(text, name, params[name])
        wrappers = "".join(_wrapper(n, params[n], f"ortlab_launch_{k}", launch_bounds(source, n))
                           for k, n in enumerate(names))
        text = (f'#include "{HEADER}"\n#line 1 "kernel.cu"\n' + text + '\n#line 1 "ortlab_launch"\n' + _GUARD
                + wrappers)
        library = _library(text, key, timeout)
        _BUILT[key] = {n: _kernel(library, n, params[n], f"ortlab_launch_{k}") for k, n in enumerate(names)}
    return dict(_BUILT[key])


def _build(text, key, timeout):
    """Path of the shared library for `text`, built once per key (by g++) and shared by processes."""
    folder = Path(tempfile.gettempdir()) / f"ortlab-cuda-cpu-{os.getuid()}"
    library = folder / f"{key}.so"
    if library.exists():
        return str(library)
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=key, dir=folder))  # a process of its own builds here
    (work / "kernel.cpp").write_text(text)
    for argv in BUILD:
        try:
            done = subprocess.run(argv, cwd=work, capture_output=True, text=True, errors="replace", timeout=timeout,
                                  env={**os.environ, "LC_ALL": "C"})  # plain quotes in g++'s messages
        except FileNotFoundError:
            raise OrtlabError("g++ was not found: the CPU runner compiles kernels with it "
                              "(apt-get install g++)") from None
        except subprocess.TimeoutExpired:
            raise OrtlabError(f"g++ took longer than {timeout} s") from None
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line][:5]
            raise OrtlabError("g++ could not compile the kernel for the CPU runner: "
                              + ("; ".join(errors) or done.stderr.strip()[-2000:]))
    os.replace(work / "kernel.so", library)
    shutil.rmtree(work, ignore_errors=True)
    return str(library)
