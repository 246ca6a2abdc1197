"""run(kernel name, cubin, grid, block, *args) on a real GPU: the CUDA driver API through ctypes.

What ORT's CUDA execution provider does with a compiled kernel, in the driver API's terms
(cuda.h): load the cubin into the current context (cuModuleLoadData), find the kernel by name
(cuModuleGetFunction), copy the inputs to device memory (cuMemAlloc, cuMemcpyHtoD), launch with one
pointer per argument (cuLaunchKernel), wait (cuCtxSynchronize) and copy the outputs back. Events
(cuEventRecord, cuEventElapsedTime) time the launches.

`available()` says whether libcuda and a GPU are here; without them every other call is an
OrtlabError, and callers take the CPU runner's path (ortlab.cuda.cpu) and say so. Arguments follow
the CPU runner's conventions: a numpy array for each pointer parameter (written back when not
const), a number for each scalar, typed by the kernel's parameter list (`cpu.parse_params`).
"""
import ctypes
import functools

import numpy as np

from ortlab.cuda.cpu import parse_params
from ortlab.errors import OrtlabError

_SCALARS = {np.float32: ctypes.c_float, np.float64: ctypes.c_double, np.int32: ctypes.c_int32,
            np.uint32: ctypes.c_uint32, np.int64: ctypes.c_int64, np.uint64: ctypes.c_uint64,
            np.int8: ctypes.c_int8, np.uint8: ctypes.c_uint8, np.int16: ctypes.c_int16,
            np.uint16: ctypes.c_uint16, np.bool_: ctypes.c_bool}


@functools.lru_cache(maxsize=None)
def _driver():
    """(libcuda, device ordinal 0 handle) with the primary context current, or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None
    device, context = ctypes.c_int(0), ctypes.c_void_p()
    if lib.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return None
    if lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
        return None
    lib.cuCtxSetCurrent(context)
    return lib, device, context


def available():
    """True when a CUDA GPU and its driver (libcuda) are present."""
    return _driver() is not None


def _check(code, call):
    if code != 0:
        lib = _driver()[0]
        text = ctypes.c_char_p()
        lib.cuGetErrorString(code, ctypes.byref(text))
        raise OrtlabError(f"{call} failed: CUDA error {code} ({(text.value or b'?').decode()})")


def _lib():
    found = _driver()
    if found is None:
        raise OrtlabError("no CUDA GPU here (libcuda or a device is missing): run the kernel on the CPU "
                          "runner, ortlab.cuda.launch")
    _driver()[0].cuCtxSetCurrent(found[2])  # this thread's current context
    return found[0]


def device_arch():
    """The GPU's architecture name, "sm_XY" from its compute capability."""
    lib, device = _lib(), _driver()[1]
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib.cuDeviceGetAttribute(ctypes.byref(major), 75, device), "cuDeviceGetAttribute")
    _check(lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, device), "cuDeviceGetAttribute")
    return f"sm_{major.value}{minor.value}"


def device_name():
    """The GPU's name, as the driver reports it."""
    lib, device = _lib(), _driver()[1]
    name = ctypes.create_string_buffer(256)
    _check(lib.cuDeviceGetName(name, 256, device), "cuDeviceGetName")
    return name.value.decode()


def run(source, name, cubin, grid, block, *args, shared=0, repeats=0):
    """Launch kernel `name` of `cubin` (compiled from `source` for this GPU) on grid x block threads;
    arrays are copied in, the kernel runs once, written arrays are copied back in place. With
    `repeats` > 0 it then runs that many more times between two events and returns the mean time of
    one launch in milliseconds (None otherwise)."""
    lib = _lib()
    params = parse_params(source, name)
    if len(args) != len(params):
        raise OrtlabError(f"kernel {name} takes {len(params)} arguments, got {len(args)}")
    grid = tuple(grid) + (1,) * (3 - len(tuple(grid))) if isinstance(grid, (tuple, list)) else (grid, 1, 1)
    block = tuple(block) + (1,) * (3 - len(tuple(block))) if isinstance(block, (tuple, list)) else (block, 1, 1)
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    _check(lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
    buffers, holders = [], []
    try:
        _check(lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), "cuModuleGetFunction")
        for param, value in zip(params, args):
            if param.pointer:
                array = np.ascontiguousarray(value, dtype=param.dtype)
                pointer = ctypes.c_uint64()
                _check(lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(max(1, array.nbytes))),
                       "cuMemAlloc")
                buffers.append((pointer, value, array, param))
                _check(lib.cuMemcpyHtoD_v2(pointer, array.ctypes.data_as(ctypes.c_void_p),
                                           ctypes.c_size_t(array.nbytes)), "cuMemcpyHtoD")
                holders.append(pointer)
            else:
                holders.append(_SCALARS[param.dtype](value))
        pointers = (ctypes.c_void_p * max(1, len(holders)))(*(ctypes.addressof(h) for h in holders))

        def launch():
            _check(lib.cuLaunchKernel(function, *map(ctypes.c_uint, grid), *map(ctypes.c_uint, block),
                                      ctypes.c_uint(shared), None, pointers, None), "cuLaunchKernel")

        launch()
        _check(lib.cuCtxSynchronize(), "the kernel (cuCtxSynchronize)")
        for pointer, value, array, param in buffers:
            if not param.const:
                _check(lib.cuMemcpyDtoH_v2(array.ctypes.data_as(ctypes.c_void_p), pointer,
                                           ctypes.c_size_t(array.nbytes)), "cuMemcpyDtoH")
                value.reshape(-1)[...] = array.reshape(-1)
        return _time(lib, launch, repeats) if repeats > 0 else None
    finally:
        for pointer, *_ in buffers:
            lib.cuMemFree_v2(pointer)
        lib.cuModuleUnload(module)


def _time(lib, launch, repeats):
    """Mean milliseconds of one launch over `repeats` launches between two events (after a warm-up)."""
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    _check(lib.cuEventCreate(ctypes.byref(start), 0), "cuEventCreate")
    _check(lib.cuEventCreate(ctypes.byref(end), 0), "cuEventCreate")
    try:
        launch()
        _check(lib.cuEventRecord(start, None), "cuEventRecord")
        for _ in range(repeats):
            launch()
        _check(lib.cuEventRecord(end, None), "cuEventRecord")
        _check(lib.cuEventSynchronize(end), "cuEventSynchronize")
        elapsed = ctypes.c_float()
        _check(lib.cuEventElapsedTime(ctypes.byref(elapsed), start, end), "cuEventElapsedTime")
        return elapsed.value / repeats
    finally:
        lib.cuEventDestroy_v2(start)
        lib.cuEventDestroy_v2(end)
