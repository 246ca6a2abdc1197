"""ortlab.engine.cpp_extension: a pybind11 extension built with load_inline, checked against
ORT 1.19.2's CPU GeluGrad and SGDOptimizer kernels, torch autograd and torch.optim.SGD.

The first test to ask for `ext` compiles the extension when no cached build exists (~30-40 s on
2 cores, once per cache folder); every later build() in any process loads it from the cache.
"""
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from ortlab.engine import InferenceSession, kernel_registry
from ortlab.engine.kernel_registry import CPU
from ortlab.engine import cpp_extension as cpp
from ortlab.ops.reference import gelu_grad_reference
from ortlab.onnx_defs import MS_DOMAIN, one_node_model
from ortlab.session import run_model, run_node


@pytest.fixture(scope="module")
def ext():
    """The built extension (a cold build the first time on a machine: marked by the module docstring)."""
    return cpp.build()


def _inputs(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal(n - 8) * 3, [0.0, -0.0, 1e-8, -1e-8, 6.0, -6.0, 12.0, -12.0]])
    return rng.standard_normal(n).astype(np.float32), x.astype(np.float32)


def _torch_gelu_grad(dy, x):
    """dy * d gelu(x)/dx by torch autograd in float64 (the erf form: approximate='none')."""
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.gelu(xt, approximate="none").backward(torch.tensor(dy, dtype=torch.float64))
    return xt.grad.numpy()


def assert_gelu_grad_close(got, expected, dy):
    """Within a few float32 ulps of |dy| (gelu' lies in [-0.13, 1.13]). Not a relative bound per element:
    for x < -2 the erf form 0.5 * (1 + erf(x / sqrt 2)) cancels in float32, in ORT's kernel as in ours."""
    assert got.shape == expected.shape
    assert np.all(np.abs(got.astype(np.float64) - expected) <= 1e-6 * np.abs(dy) + 1e-12)


# --- build and cache ---------------------------------------------------------------------------------
def test_a_second_process_loads_the_build_from_the_cache_in_well_under_a_second(ext):
    assert ext.directory.parent == cpp.cache_root() and ext.directory.name.startswith(cpp.NAME)
    code = ("from ortlab.engine import cpp_extension as c; r = c.build(); "
            "print(r.compiled, r.seconds, r.module.__file__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    compiled, seconds, path = out.stdout.split()
    assert compiled == "False" and float(seconds) < 1.0 and path == ext.module.__file__
    assert cpp.build() is ext  # in one process, built and imported once


def test_the_build_key_changes_with_the_source_and_the_flags():
    key = cpp.build_key(cpp.CPP_SOURCE)
    assert key == cpp.build_key(cpp.CPP_SOURCE)
    assert key != cpp.build_key(cpp.CPP_SOURCE + "\n// edited")
    assert key != cpp.build_key(cpp.CPP_SOURCE, cflags=("-O0",))


def test_a_compiler_error_comes_back_trimmed_to_its_first_lines_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv(cpp.CACHE_ENV, str(tmp_path))
    broken = ("float twice(float v) { return 2 * vv; }\n"
              "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"twice\", &twice); }\n")
    with pytest.raises(cpp.CppBuildError) as caught:
        cpp.build_extension(broken, name="ortlab_broken")
    message = str(caught.value)
    assert re.search("main.cpp:2:35: error: .vv. was not declared in this scope", message)  # 1 + the include
    assert "2 | float twice(float v) { return 2 * vv; }" in message  # quotes are ' or ‘’ by the locale
    assert "Fix the source" in message and str(tmp_path) in message
    assert len(message.splitlines()) <= 10 and "Traceback" not in message


def test_a_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path):
    import os
    import time

    lock = tmp_path / "lock"
    lock.touch()
    assert not cpp.remove_stale_lock(tmp_path) and lock.exists()  # a build in progress holds it
    old = time.time() - cpp.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    assert cpp.remove_stale_lock(tmp_path) and not lock.exists()
    assert not cpp.remove_stale_lock(tmp_path)


def test_first_errors_keeps_the_error_lines_and_drops_ninja_noise():
    log = ("Error building extension 'x': [1/2] c++ -MMD -c main.cpp\nFAILED: main.o\n"
           "main.cpp: In function 'float f()':\nmain.cpp:3:12: error: 'y' was not declared in this scope\n"
           "    3 | return y;\n      |        ^\nninja: build stopped: subcommand failed.\n")
    log = "c++ -Werror -c main.cpp\n" + log  # a command line naming -Werror is not an error
    assert cpp.first_errors(log) == ["main.cpp:3:12: error: 'y' was not declared in this scope",
                                     "    3 | return y;", "      |        ^"]


# --- GeluGrad: the maths, ORT's kernel, zero copy ------------------------------------------------------
def test_gelu_grad_matches_torch_autograd_the_numpy_reference_and_orts_kernel(ext):
    dy, x = _inputs()
    got = cpp.gelu_grad(dy, x)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert_gelu_grad_close(got, _torch_gelu_grad(dy, x), dy)
    assert_gelu_grad_close(got, gelu_grad_reference(dy, x), dy)
    (ort,) = run_node("GeluGrad", [dy, x], domain=MS_DOMAIN)
    assert_gelu_grad_close(got, ort, dy)


def test_gelu_grad_writes_into_the_callers_numpy_and_torch_memory_without_a_copy(ext):
    dy, x = _inputs(64)
    out = np.zeros_like(x)
    assert cpp.gelu_grad(dy, x, out=out) is out and cpp.data_pointer(out) == out.ctypes.data
    assert_gelu_grad_close(out, _torch_gelu_grad(dy, x), dy)
    dy_t, x_t, out_t = torch.from_numpy(dy), torch.from_numpy(x), torch.zeros(64)
    pointer = out_t.data_ptr()
    cpp.gelu_grad(dy_t, x_t, out=out_t)  # torch's memory, seen through .numpy(): nothing copied
    assert out_t.data_ptr() == pointer == cpp.data_pointer(out_t)
    assert cpp.data_pointer(x_t) == x_t.data_ptr() == x.ctypes.data
    np.testing.assert_array_equal(out_t.numpy(), out)


def test_gelu_grad_in_place_on_its_own_input(ext):
    dy, x = _inputs(256)
    expected, dy_before = _torch_gelu_grad(dy, x), dy.copy()
    cpp.gelu_grad(dy, x, out=dy)  # elementwise: reading dy[i] before writing it is safe
    assert_gelu_grad_close(dy, expected, dy_before)


# --- the errors at the boundary ------------------------------------------------------------------------
@pytest.mark.parametrize("case, expected", [
    ("float64", r"x has buffer format 'd'.*float32.*x\.astype\(np\.float32\)"),
    ("torch float64", r"x has buffer format 'd'.*x\.float\(\)"),
    ("transposed", r"x of shape \(8, 4\) is not C-contiguous.*np\.ascontiguousarray\(x\)"),
    ("torch transposed", r"x of shape \(8, 4\) is not C-contiguous.*x\.contiguous\(\)"),
    ("strided", r"x of shape \(16,\) is not C-contiguous \(stride 8 bytes"),
    ("shape", r"dy has shape \(32,\), x has shape \(16,\); they must be equal"),
    ("list", r"x is a list; pass a numpy array or a torch CPU tensor"),
])
def test_a_value_the_kernel_cannot_take_is_refused_with_what_to_pass(ext, case, expected):
    x32 = np.arange(32, dtype=np.float32)
    x = {"float64": x32.astype(np.float64), "torch float64": torch.arange(32, dtype=torch.float64),
         "transposed": x32.reshape(4, 8).T, "torch transposed": torch.arange(32.0).reshape(4, 8).t(),
         "strided": x32[::2], "shape": x32[:16], "list": [1.0, 2.0]}[case]
    dy = x32.reshape(4, 8).T.copy() if "transposed" in case else x32
    with pytest.raises(cpp.CppExtensionError, match=expected):
        cpp.gelu_grad(dy, x)


def test_the_raw_module_refuses_too_and_a_read_only_output_is_named(ext):
    x = np.ones(8, dtype=np.float32)
    with pytest.raises(ValueError, match="dtype: x has buffer format 'd'"):
        ext.module.gelu_grad(x, x.astype(np.float64), np.empty_like(x))  # what pybind11 raises, unexplained
    frozen = x.copy()
    frozen.flags.writeable = False
    with pytest.raises(cpp.CppExtensionError, match=r"out is read-only.*np\.array\(out\)"):
        cpp.gelu_grad(x, x, out=frozen)
    with pytest.raises(cpp.CppExtensionError, match="refused its arguments.*incompatible function arguments"):
        cpp.call(ext.module.gelu_grad, x, x, 3)


# --- the fused SGD step ----------------------------------------------------------------------------------
def test_sgd_step_matches_torch_optim_sgd_in_place_on_the_parameter(ext):
    torch.manual_seed(0)
    ours, theirs = torch.randn(10, 7), torch.nn.Parameter(torch.randn(10, 7))
    ours.copy_(theirs.detach())
    velocity, pointer = torch.zeros_like(ours), ours.data_ptr()
    optimizer = torch.optim.SGD([theirs], lr=0.1, momentum=0.9, weight_decay=0.01)
    for _ in range(3):
        grad = torch.randn(10, 7)
        theirs.grad = grad.clone()
        optimizer.step()
        cpp.sgd_step(ours, grad, lr=0.1, weight_decay=0.01, momentum=0.9, velocity=velocity)
    assert ours.data_ptr() == pointer
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(velocity, optimizer.state[theirs]["momentum_buffer"], rtol=1e-6, atol=1e-6)


def test_sgd_step_without_momentum_is_orts_sgd_optimizer_kernel(ext):
    rng = np.random.default_rng(1)
    w, g = rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)
    (expected,) = run_node("SGDOptimizer", [np.array([0.25], dtype=np.float32), w, g], domain=MS_DOMAIN)
    cpp.sgd_step(w, g, lr=0.25)
    np.testing.assert_allclose(w, expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(cpp.CppExtensionError, match=r"velocity has shape \(3,\), w has shape \(50,\)"):
        cpp.sgd_step(w, g, lr=0.25, momentum=0.9, velocity=np.zeros(3, dtype=np.float32))


# --- the engine's CPU EP ---------------------------------------------------------------------------------
def _gelu_grad_model(elem_type=1):
    return one_node_model("GeluGrad", [(elem_type, ["n"])] * 2, domain=MS_DOMAIN)


def test_register_cpp_kernels_puts_the_cpp_gelu_grad_into_the_engines_cpu_ep_and_takes_it_out(ext):
    key = ("GeluGrad", MS_DOMAIN)
    assert key not in kernel_registry(CPU)  # by default the CPU EP runs GeluGrad through the numpy reference
    dy, x = _inputs(300)
    expected = run_model(_gelu_grad_model(), {"x0": dy, "x1": x})["y0"]  # ORT 1.19.2
    with cpp.register_cpp_kernels() as registered:
        assert kernel_registry(CPU).kernels[key].kernel_class.fn is cpp.gelu_grad_kernel
        session = InferenceSession(_gelu_grad_model())
        assert type(session.state.steps[0].kernel).__name__ == "gelu_grad_kernel"
        assert_gelu_grad_close(session.run(None, {"x0": dy, "x1": x})[0], expected, dy)
        assert "GeluGrad" in repr(registered)
    assert key not in kernel_registry(CPU) and "unregistered" in repr(registered)
    default = InferenceSession(_gelu_grad_model())
    assert type(default.state.steps[0].kernel).__name__ == "ReferenceKernel"
    registered.unregister()  # a second undo changes nothing


def test_the_cpp_kernel_takes_float32_only_as_orts_does(ext):
    model = _gelu_grad_model(elem_type=11)  # double
    # ORT 1.19.2 has no double GeluGrad kernel: it inlines GeluGrad's function body, then lacks Erf(double)
    with pytest.raises(Exception, match="Could not find an implementation"):
        run_model(model, {"x0": np.ones(4), "x1": np.ones(4)})
    with cpp.register_cpp_kernels():
        with pytest.raises(Exception, match="input 0 is float64, the kernel takes float32"):
            InferenceSession(model)


def test_a_kernel_already_registered_is_kept_unless_override_and_restored_after(ext):
    from ortlab.engine import register_op_kernel, unregister_op_kernel

    def mine(ctx):
        ctx.put(0, ctx.input(0))

    register_op_kernel("GeluGrad", MS_DOMAIN)(mine)
    try:
        with pytest.raises(Exception, match="already registered"):
            cpp.register_cpp_kernels()
        with cpp.register_cpp_kernels(override=True):
            assert kernel_registry(CPU).kernels["GeluGrad", MS_DOMAIN].kernel_class.fn is cpp.gelu_grad_kernel
        assert kernel_registry(CPU).kernels["GeluGrad", MS_DOMAIN].kernel_class.fn is mine
    finally:
        unregister_op_kernel("GeluGrad", MS_DOMAIN)


def test_time_gelu_grad_returns_one_row_per_size_for_cpp_numpy_and_ort(ext):
    rows = cpp.time_gelu_grad(sizes=(256, 4096), repeat=2)
    assert [r["size"] for r in rows] == [256, 4096]
    assert all(r[k] > 0 for r in rows for k in ("cpp_us", "numpy_us", "ort_us"))
