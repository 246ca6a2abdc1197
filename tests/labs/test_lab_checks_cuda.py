"""lab10_cuda_kernel's checks: the solution's kernels pass; each usual mistake gets its own message.

The reference is ORT 1.19.2's CPU kernels (GeluGrad, LayerNormalizationGrad) inside the judges; the
kernels below are the solution's and, for each mistake, the solution with that one mistake made.
Also checked here, independently of the judges: the solution's dX equals ORT's on a case of their
own, and the machinery's facts the messages rely on (ORT's CPU LayerNormalizationGrad refuses one
column; the CPU runner fills nothing itself, so NaN marks an element no thread wrote).
"""
import nbformat
import numpy as np
import pytest

from repo_paths import ROOT
from ortlab import cuda
from ortlab.cuda import gpu
from ortlab.labs import lab10
from ortlab.labs.checks import evaluate
from ortlab.labs.judges import lab10 as judges
from ortlab.labs.remote import LocalRemote, learner
from ortlab.session import SessionError, run_node

GELU = r"""
extern "C" __global__ void gelu_grad(const float* dy, const float* x, float* dx, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    dx[i] = dy[i] * (0.5f * (1.0f + erff(v * 0.70710678118654752f)) + v * expf(-0.5f * v * v) * 0.39894228040143268f);
  }
}
"""

LN = r"""
__device__ float block_sum(float v, float* buffer) {
  __syncthreads();
  buffer[threadIdx.x] = v;
  __syncthreads();
  int width = 1;
  while (width < blockDim.x) width *= 2;  // a tree over the next power of two
  for (int half = width / 2; half > 0; half /= 2) {
    if (threadIdx.x < half && threadIdx.x + half < blockDim.x) buffer[threadIdx.x] += buffer[threadIdx.x + half];
    __syncthreads();
  }
  return buffer[0];
}

extern "C" __global__ void layer_norm_grad_dx(const float* dy, const float* x, const float* scale,
                                              const float* mean, const float* inv_std, float* dx,
                                              int rows, int cols) {
  __shared__ float buffer[1024];
  const int row = blockIdx.x;
  const long long base = (long long)row * cols;
  const float mu = mean[row], rs = inv_std[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = dy[base + c] * scale[c];
    sum_g += g;
    sum_g_xhat += g * (x[base + c] - mu) * rs;
  }
  const float mean_g = block_sum(sum_g, buffer) / cols;
  const float mean_g_xhat = block_sum(sum_g_xhat, buffer) / cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = (x[base + c] - mu) * rs;
    dx[base + c] = rs * (dy[base + c] * scale[c] - mean_g - xhat * mean_g_xhat);
  }
}
"""


def ceil_blocks(n):
    return -(-n // lab10.BLOCK)


def gelu_verdict(source, grid=ceil_blocks):
    result = evaluate("gelu_grad", lambda: judges.gelu_grad(LocalRemote(), learner(lambda: source), learner(grid)))
    return result.status, result.message


def ln_verdict(source):
    result = evaluate("layer_norm_grad", lambda: judges.layer_norm_grad(LocalRemote(), learner(lambda: source)))
    return result.status, result.message


def test_the_solution_kernels_pass():
    assert gelu_verdict(GELU) == ("pass", "")
    assert ln_verdict(LN) == ("pass", "")


def test_the_solution_equals_ort_on_a_case_of_this_test():
    """Independent of the judges' cases: 7 rows of 515 with 96 threads per block, and n = 3001."""
    dy, x, scale, mean, inv_std = lab10.layer_norm_inputs(7, 515, seed=5)
    dx = np.full_like(x, np.nan)
    cuda.launch(cuda.cpu_kernel(LN, "layer_norm_grad_dx"), 7, 96, dy, x, scale, mean, inv_std, dx, 7, 515)
    ort = run_node("LayerNormalizationGrad", [dy, x, scale, mean.reshape(7, 1), inv_std.reshape(7, 1)],
                   {"axis": -1}, domain="com.microsoft", outputs=3)[0]
    np.testing.assert_allclose(dx, ort, rtol=1e-4, atol=1e-4)
    dy, x = lab10.gelu_inputs(3001, seed=5)
    dx = np.full_like(x, np.nan)
    cuda.launch(cuda.cpu_kernel(GELU, "gelu_grad"), ceil_blocks(3001), lab10.BLOCK, dy, x, dx, 3001)
    np.testing.assert_allclose(dx, run_node("GeluGrad", [dy, x], domain="com.microsoft")[0], rtol=1e-5, atol=1e-5)


def test_ort_cpu_layer_norm_grad_refuses_one_column():
    """Why the hidden cases have no single-column rows: ORT 1.19.2's CPU kernel requires M != 1."""
    dy, x, scale, mean, inv_std = lab10.layer_norm_inputs(3, 1)
    with pytest.raises(SessionError, match="M != 1"):
        run_node("LayerNormalizationGrad", [dy, x, scale, mean.reshape(3, 1), inv_std.reshape(3, 1)],
                 {"axis": -1}, domain="com.microsoft", outputs=3)


@pytest.mark.parametrize("source, grid, words", [
    (GELU.replace("if (i < n) {", "{"), ceil_blocks,
     "for n = 1000: no bounds check: thread (232, 0, 0) of block (3, 0, 0): x[1000] is out of bounds"),
    (GELU, lambda n: n // lab10.BLOCK, "for n = 1000: 232 of 1000 elements of dx were never written (the first at "
                                       "index (768,)); the grid is too small: gelu_grad_grid(1000) = 3 block(s)"),
    (GELU, lambda n: max(1, n // lab10.BLOCK), "launch ceil(n / BLOCK) = 4 blocks"),
    (GELU.replace("erff(v * 0.70710678118654752f)", "tanhf(0.7978845608f * (v + 0.044715f * v * v * v))"),
     ceil_blocks, "for n = 1024, compared with ORT's GeluGrad: dx: wrong values"),
    (GELU.replace('extern "C" ', ""), ceil_blocks, "declare it extern \"C\" __global__"),
    (GELU.replace("int n)", "long n)"), ceil_blocks, "does not take the lab's parameters: write extern \"C\" "
                                                      "__global__ void gelu_grad(const float* dy, const float* x, "
                                                      "float* dx, int n)"),
    (GELU.replace("erff(", "erf_typo("), ceil_blocks, "NVRTC cannot compile it for sm_80"),
    (GELU.replace("const float v = x[i];", "float buf[64]; for (int k = 0; k < 64; ++k) buf[(k * 7 + i) % 64] = "
                                           "x[i] + k; const float v = buf[n % 64] - (n % 64);"),
     ceil_blocks, "spills to local memory"),
    (None, ceil_blocks, "gelu_grad_source() must return the kernel's CUDA C++ source as a str, not NoneType"),
    (GELU, lambda n: 0, "gelu_grad_grid(1024) returned 0"),
], ids=["no-bounds-check", "grid-too-small", "grid-too-small-with-floor-one", "tanh-approximation",
        "mangled-name", "wrong-signature", "compile-error", "spills", "not-a-str", "zero-grid"])
def test_gelu_grad_mistakes_get_their_own_message(source, grid, words):
    status, message = gelu_verdict(source, grid)
    assert status == "fail" and words in message, message


def test_a_hidden_shape_catches_what_the_seen_ones_do_not():
    """A kernel right for n a multiple of 8 only (the notebook's two n are): failed on a hidden n."""
    source = GELU.replace("if (i < n) {", "if (i < (n / 8) * 8) {")
    status, message = gelu_verdict(source)
    assert status == "fail" and "for n = 1 (a shape the notebook does not show)" in message, message


TREE_WITHOUT_BARRIER = LN.replace("  buffer[threadIdx.x] = v;\n  __syncthreads();\n", "  buffer[threadIdx.x] = v;\n")
WARP_ONLY = LN.replace("for (int half = width / 2;", "for (int half = 16;")
POWER_OF_TWO_TREE = LN.replace("for (int half = width / 2;", "for (int half = blockDim.x / 2;").replace(
    " && threadIdx.x + half < blockDim.x", "")


@pytest.mark.parametrize("source, words", [
    (TREE_WITHOUT_BARRIER, "for 4 row(s) of 300 with 128 threads per block: a race: dx changes with the order "
                           "the threads run between barriers"),
    (LN.replace("/ cols;\n  const float mean_g_xhat", "/ blockDim.x;\n  const float mean_g_xhat"),
     "for 4 row(s) of 300 with 128 threads per block: a wrong reduction: row 0's dx has the formula's form, but "
     "with mean(g) ="),
    (WARP_ONLY, "for 4 row(s) of 300 with 128 threads per block: a wrong reduction"),
    (POWER_OF_TWO_TREE, "for 7 row(s) of 515 with 96 threads per block (a shape the notebook does not show): a "
                        "wrong reduction"),
    (LN.replace("for (int c = threadIdx.x; c < cols; c += blockDim.x) {\n    const float xhat",
                "for (int c = threadIdx.x; c < cols && c < (int)blockDim.x; c += blockDim.x) {\n    const float xhat"),
     "columns from 128 (blockDim.x) on were never written: loop over the row"),
    (LN.replace("const int row = blockIdx.x;", "const int row = blockIdx.x; if (row % 2) return;"),
     "whole rows were never written"),
    (LN.replace("for (int c = threadIdx.x; c < cols; c += blockDim.x) {\n    const float g",
                "for (int c = threadIdx.x; c < (cols + 127) / 128 * 128; c += blockDim.x) {\n    const float g"),
     "for 4 row(s) of 300 with 128 threads per block: no bounds check: thread (44, 0, 0) of block (0, 0, 0): "
     "scale[300] is out of bounds (scale has 300 elements)"),
    (LN.replace("__shared__ float buffer[1024];", "__shared__ float buffer[128];"),
     "with 256 threads per block (a shape the notebook does not show): an index past a fixed-size array: "
     "thread (128, 0, 0) of block (0, 0, 0): buffer[128] is out of bounds for type __shared__ buffer"),
    (LN.replace("  const float mean_g = block_sum",
                "  if (threadIdx.x >= cols) return;\n  const float mean_g = block_sum"),
     "for 1 row(s) of 33 with 128 threads per block (a shape the notebook does not show): a __syncthreads() that "
     "not every thread of the block reaches"),
    (LN.replace("rs * (dy[base + c] * scale[c] - mean_g", "rs * (dy[base + c] - mean_g"),
     "compared with ORT's LayerNormalizationGrad: dx: wrong values"),
    (LN.replace("float* dx,", "double* dx,"), "does not take the lab's parameters"),
], ids=["missing-syncthreads", "divides-by-blockdim", "warp-only-tree", "power-of-two-tree", "no-column-loop",
        "rows-skipped",
        "no-bounds-check", "shared-array-too-small", "divergent-barrier", "wrong-formula", "wrong-signature"])
def test_layer_norm_grad_mistakes_get_their_own_message(source, words):
    status, message = ln_verdict(source)
    assert status == "fail" and words in message, message


@pytest.mark.parametrize("source, grid, words", [
    (GELU.replace("if (i < n) {", "while (i >= 0) {"), ceil_blocks, "the kernel never finished on the CPU runner"),
    (GELU.replace("const float v = x[i];", "extern __shared__ float s[]; s[threadIdx.x] = x[i]; const float v = "
                                           "s[threadIdx.x];"),
     ceil_blocks, "s[0] is out of bounds (s has 0 elements): the lab launches with no dynamic shared memory"),
    (GELU, lambda n: 2**31 - 1, "returned 2147483647 blocks of 256 threads for 1024 elements: 4 cover them all"),
    (GELU.replace("int n) {", "int n) {\0"), ceil_blocks, "it cannot be compiled for sm_80: source holds a NUL"),
    (GELU, lambda n: "4", "gelu_grad_grid(1024) returned '4'"),
    (GELU, lambda n: 1 / 0, "gelu_grad_grid(1024) raised ZeroDivisionError"),
], ids=["endless-loop", "dynamic-shared", "huge-grid", "nul-character", "grid-a-str", "grid-raises"])
def test_hostile_gelu_grad_inputs_end_in_a_message(source, grid, words, monkeypatch):
    monkeypatch.setattr(lab10, "TIMEOUT", 2.0)
    status, message = gelu_verdict(source, grid)
    assert status == "fail" and words in message, message


FORGED = r"""
#ifndef __CUDACC__
extern "C" int PyRun_SimpleString(const char*);
__attribute__((constructor)) static void forge() {  // runs where the CPU runner's build is loaded
  PyRun_SimpleString("import ortlab.labs.judges.lab10 as j; j.compare = lambda *a, **k: None");
}
#endif
extern "C" __global__ void gelu_grad(const float* dy, const float* x, float* dx, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dx[i] = 0.0f;
}
"""


@pytest.mark.parametrize("host, found", [
    (FORGED, "__CUDACC__"),
    ('__attribute__((constructor)) static void f() {}', "__attribute__"),
    ('#include <cstdlib>', "#include"),
    ('#define GLUE(a, b) a ## b', "##"),
    ('int system(const char*); static int x = system("true");', "system("),
    ('extern "C" int PyRun_SimpleString(const char*);', "PyRun_SimpleString"),
])
def test_host_code_in_the_source_is_refused(host, found):
    status, message = gelu_verdict(host + "\n" + GELU)
    assert status == "fail" and f"the source holds host-side code ({found!r})" in message, message


# The forgery: host code NVRTC never sees (#ifndef __CUDA_ARCH__), Python's C API named through the
# digraph %:%: (the screen looks for ## and Py...), and a static object whose constructor replaces the
# launch with ORT's own answer where the build is loaded. An empty kernel: dx is never written.
FORGED_DIGRAPH = r"""
#ifndef __CUDA_ARCH__
%:define GLUE(a, b) a %:%: b
extern "C" int GLUE(Py, Run_SimpleString)(const char*);
extern "C" int GLUE(Py, GILState_Ensure)();
extern "C" void GLUE(Py, GILState_Release)(int);
struct Forge {  // a static object: its constructor runs where the CPU runner's build is loaded
  Forge() {
    const int state = GLUE(Py, GILState_Ensure)();
    GLUE(Py, Run_SimpleString)("import ortlab.labs.judges.lab10 as j, ortlab.labs.lab10 as l\n"
                               "j.run_gelu_grad = l.run_gelu_grad = (lambda source, grid_fn, n, kernel=None, seed=0:"
                               " j.ort_gelu_grad(*l.gelu_inputs(n, seed)))\n");
    GLUE(Py, GILState_Release)(state);
  }
};
static Forge forge;
#endif
extern "C" __global__ void gelu_grad(const float* dy, const float* x, float* dx, int n) {}
"""


@pytest.mark.parametrize("forged, words", [
    (FORGED, "compared with ORT's GeluGrad: dx: wrong values"),
    (FORGED_DIGRAPH, "1024 of 1024 elements of dx were never written"),
], ids=["replaces-compare", "digraph-static-constructor"])
def test_native_code_loaded_for_the_cpu_runner_cannot_change_the_verdict(forged, words, monkeypatch):
    """Past the screen (turned off here: the second forgery gets past it anyway), the learner's build is
    loaded only in the CPU runner's own process (ortlab.labs.cpu_runner), which holds no judge and no
    reference: what its constructor replaces there is not what decides. Under the earlier judge, which ran
    the runner in a forked child of its own process, both forgeries passed."""
    import re

    monkeypatch.setattr(judges, "HOST_CODE", re.compile("(?!x)x"))
    status, message = gelu_verdict(forged)
    assert status == "fail" and words in message, message
    assert judges.compare is not None and judges.compare.__module__ == "ortlab.labs.checks"
    assert lab10.run_gelu_grad.__module__ == "ortlab.labs.lab10" and not hasattr(judges, "run_gelu_grad")


def test_the_screen_is_a_message_not_the_defence():
    """The issue's forgery holds no token the screen looks for: only the process structure stops it."""
    assert judges.HOST_CODE.search(FORGED_DIGRAPH) is None


def test_grading_the_lab_runs_the_judges_in_the_grader(tmp_path):
    """The lab with GeluGrad's bounds check left out and the solution's LayerNormGrad, graded in a fresh
    kernel: the grader's own checks (the learner's functions called through the kernel) say which is which."""
    from ortlab.labs import grade

    nb = nbformat.read(ROOT / "labs" / "lab10_cuda_kernel.ipynb", as_version=4)
    stub = "raise NotImplementedError(\"exercise '{}' is not done yet: replace this line with your solution\")"
    for cell in nb.cells:
        if stub.format("gelu_grad") in cell.source and "def gelu_grad_source" in cell.source:
            cell.source = (f"def gelu_grad_source():\n    return {GELU.replace('if (i < n) {', '{')!r}\n\n\n"
                           "def gelu_grad_grid(n):\n    return (n + BLOCK - 1) // BLOCK\n")
        elif stub.format("layer_norm_grad") in cell.source:
            cell.source = f"def layer_norm_grad_source():\n    return {LN!r}\n"
    path = tmp_path / "lab10_cuda_kernel.ipynb"
    nbformat.write(nb, path)
    results, problem = grade.grade(path, timeout=300, solutions_dir=ROOT / "solutions")
    verdicts = {r.exercise: (r.status, r.message) for r in results}
    assert verdicts["layer_norm_grad"] == ("pass", ""), verdicts
    assert verdicts["gelu_grad"][0] == "fail" and "for n = 1000: no bounds check" in verdicts["gelu_grad"][1], verdicts


def test_a_stubbed_exercise_is_not_done():
    def stub():
        raise NotImplementedError("exercise 'layer_norm_grad' is not done yet: replace this line with your solution")

    result = evaluate("layer_norm_grad", lambda: judges.layer_norm_grad(LocalRemote(), learner(stub)))
    assert result.status == "not done"


def test_lab_module_holds_no_reference():
    """The learner's module imports neither ORT's sessions nor the judges (the reference lives in judges/lab10.py)."""
    import ast

    tree = ast.parse((ROOT / "ortlab" / "labs" / "lab10.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if "judges" in m or m.startswith(("ortlab.session", "onnxruntime"))], imported


def test_the_lab_says_where_the_kernels_ran():
    assert lab10.where_it_ran().startswith("GPU: " if lab10.gpu_usable() else "CPU path: no GPU here")
    assert lab10.gpu_usable() == (gpu.available() and gpu.device_arch() in cuda.ARCHS)


def test_the_solution_notebook_has_both_exercises_and_their_checks():
    nb = nbformat.read(ROOT / "solutions" / "lab10_cuda_kernel.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for exercise in ("gelu_grad", "layer_norm_grad"):
        assert f"# BEGIN SOLUTION {exercise}" in code
        assert f"lab10.check_{exercise}(" in code
