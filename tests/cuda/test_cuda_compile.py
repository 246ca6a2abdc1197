"""ortlab.cuda.compile: CUDA C++ through NVIDIA's NVRTC and ptxas on a machine with no GPU.

What is checked comes from the source and from NVIDIA's tools, not from ortlab: the PTX that NVRTC
writes (its .target, .maxntid, bar.sync and branch instructions), the numbers ptxas prints, and the
line and column of a deliberately broken line of the source.
"""
import re

import pytest

import cuda_sources
import ortlab.cuda as cuda
from ortlab.cuda import ptxas
from ortlab.errors import OrtlabError

ARCHS = ("sm_60", "sm_70", "sm_80", "sm_90")

REDUCTION = cuda_sources.block_sum()


@pytest.fixture(scope="module")
def results():
    return {arch: cuda.compile(REDUCTION, arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_targets_the_architecture_and_keeps_the_launch_bounds(results, arch):
    ptx = results[arch].ptx
    assert re.search(rf"^\.target {arch}\s*$", ptx, re.M)
    assert re.search(r"\.entry block_sum\(", ptx)
    assert ".maxntid 256, 1, 1" in ptx  # __launch_bounds__(256)
    assert re.search(r"\.shared .*\[1024\];", ptx)  # float buf[256]: 1024 bytes


@pytest.mark.parametrize("arch", ARCHS)
def test_ptxas_resources_parse_and_the_reduction_does_not_spill(results, arch):
    result = results[arch]
    assert result.cubin[:4] == b"\x7fELF"  # a cubin is an ELF file
    k = result.kernel("block_sum")
    assert k is result.kernel() and k.arch == arch
    assert k.shared_bytes == 256 * 4
    assert 0 < k.registers <= 255
    assert (k.spill_stores, k.spill_loads, k.spills, k.local_bytes) == (0, 0, 0, 0)
    assert k.max_threads_per_block == 256 and k.min_blocks_per_sm is None
    # the report ptxas printed holds the same numbers
    assert f"Used {k.registers} registers, 1024 bytes smem" in result.ptxas_report
    if arch != "sm_90":  # ptxas 12.4 reports no cmem for sm_90
        assert dict(k.constant_bytes)[0] >= 8 + 8 + 4  # bank 0 holds the parameters (two pointers, an int)
    assert "block_sum on " + arch in repr(result) and "spills 0 B" in repr(result)


def _backward_branches(ptx):
    """Branches to a label defined above them: a loop's back edge."""
    labels, back = {}, 0
    for k, line in enumerate(ptx.splitlines()):
        if m := re.match(r"^(\$\w+):", line):
            labels[m[1]] = k
        elif m := re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line):
            back += m[1] in labels
    return back


def test_pragma_unroll_removes_the_loop():
    unrolled = cuda.compile(REDUCTION, "sm_80").ptx
    rolled = cuda.compile(REDUCTION, "sm_80", ("-DUNROLL=1",)).ptx
    # unrolled: the barrier before the loop and one per step (8 steps); no back edge left
    assert unrolled.count("bar.sync") == 1 + 8 and _backward_branches(unrolled) == 0
    # `#pragma unroll 1` keeps the loop: one barrier in its body, one branch back to its top
    assert rolled.count("bar.sync") == 2 and _backward_branches(rolled) == 1


def test_launch_bounds_cap_registers_and_ptxas_reports_the_spills():
    # __launch_bounds__(1024, 2): two blocks of 1024 threads share 65536 registers, so ptxas may
    # give a thread at most 65536 / 2048 = 32; 96 live floats do not fit and go to local memory.
    source = r"""
    template <int N> __device__ float work(const float* x) {
      float a[N];
      #pragma unroll
      for (int i = 0; i < N; ++i) a[i] = x[i * 7 % 97];
      float s = 0;
      #pragma unroll
      for (int i = 0; i < N; ++i) s += a[i] * a[(i * 13) % N] + a[(i * 5) % N];
      return s;
    }
    extern "C" __global__ void __launch_bounds__(1024, 2) spill(const float* x, float* y) {
      y[threadIdx.x] = work<96>(x + threadIdx.x);
    }
    """
    k = cuda.compile(source, "sm_80").kernel("spill")
    assert k.registers <= 32 and (k.max_threads_per_block, k.min_blocks_per_sm) == (1024, 2)
    assert k.spill_stores > 0 and k.spill_loads > 0 and k.local_bytes > 0


def test_a_compile_error_carries_nvrtcs_line_column_and_message():
    lines = REDUCTION.splitlines()
    broken_at = next(i for i, line in enumerate(lines) if "buf[threadIdx.x] +=" in line)
    lines[broken_at] = lines[broken_at].replace("buf[threadIdx.x + s]", "bfu[threadIdx.x + s]")
    with pytest.raises(cuda.CudaCompileError) as caught:
        cuda.compile("\n".join(lines), "sm_80")
    error = caught.value
    assert isinstance(error, OrtlabError)
    (d,) = [d for d in error.diagnostics if d.severity == "error"]
    assert d.line == broken_at + 1  # 1-based, as the compiler counts
    assert d.column == lines[broken_at].index("bfu") + 1
    assert d.message == 'identifier "bfu" is undefined'
    assert f"line {broken_at + 1}, column {d.column}" in str(error)
    assert f"kernel.cu({broken_at + 1}): error" in error.log  # NVRTC's own log is kept


def test_errors_and_warnings_of_several_lines_and_tabs():
    source = 'extern "C" __global__ void f(float* x) {\n\tx[0] = nope;\n  int y = ;\n  int unused;\n}\n'
    with pytest.raises(cuda.CudaCompileError) as caught:
        cuda.compile(source, "sm_70")
    found = [(d.line, d.column, d.severity) for d in caught.value.diagnostics]
    # columns in characters, a tab counting one: "\tx[0] = nope;" has `nope` at index 8
    assert found[:2] == [(2, 9, "error"), (3, 11, "error")]
    assert (4, 7, "warning") in found  # `unused` never used: a warning, not an error


@pytest.mark.parametrize("arch", ["sm_61", "sm_100", "80", "compute_80", None, 80])
def test_an_unknown_architecture_lists_the_known_ones(arch):
    with pytest.raises(OrtlabError, match=r"unknown GPU architecture.*sm_60 \(P100\).*sm_70 \(V100\)"
                                          r".*sm_80 \(A100\).*sm_90 \(H100\)"):
        cuda.compile(REDUCTION, arch)


@pytest.mark.parametrize("options, message", [
    (("-arch=compute_70",), "sets the architecture"),
    (("--gpu-architecture=compute_70",), "sets the architecture"),
    ((42,), "must be a str"),
    (3, "list of NVRTC option strings"),
    (("--no-such-option",), "NVRTC rejected an option"),
])
def test_bad_options_are_ortlab_errors(options, message):
    with pytest.raises(OrtlabError, match=message):
        cuda.compile(REDUCTION, "sm_80", options)


@pytest.mark.parametrize("source", ["", "   \n", None, b"__global__ void f() {}"])
def test_source_must_be_text(source):
    with pytest.raises(OrtlabError, match="source must be CUDA C\\+\\+ text"):
        cuda.compile(source, "sm_80")


def test_ptxas_refusal_is_an_ortlab_error_with_its_message():
    # 60000 floats = 240000 bytes of static shared memory: more than the 164 KiB of an A100's SM
    source = ('extern "C" __global__ void big(float* y) { __shared__ float t[60000];'
              ' t[threadIdx.x] = y[threadIdx.x]; __syncthreads(); y[threadIdx.x] = t[threadIdx.x + 1]; }')
    with pytest.raises(OrtlabError, match="ptxas could not assemble the PTX for sm_80: .*too much shared data"):
        cuda.compile(source, "sm_80")


def test_compiling_is_cached_by_source_arch_and_options():
    first = cuda.compile(REDUCTION, "sm_80")
    assert cuda.compile(REDUCTION, "sm_80", []) is first  # options () and [] are the same key
    assert cuda.compile(REDUCTION, "sm_80", ("-DUNROLL=1",)) is not first
    assert cuda.compile(REDUCTION, "sm_70") is not first
    with pytest.raises(TypeError):
        first.kernels["block_sum"] = None  # a cached result is shared: its table is read-only


def test_a_single_option_string_is_one_option():
    assert cuda.compile(REDUCTION, "sm_80", "-DUNROLL=1").options == ("-DUNROLL=1",)


def test_without_ptxas_the_result_still_has_the_ptx(monkeypatch):
    monkeypatch.setattr(ptxas, "find_ptxas", lambda: None)
    result = cuda.compile(REDUCTION + "\n// no ptxas\n", "sm_80")
    assert ".target sm_80" in result.ptx and result.cubin is None and result.kernels is None
    assert "no cubin: ptxas is not installed" in repr(result)
    with pytest.raises(OrtlabError, match="no kernel resources without ptxas"):
        result.kernel()


def test_a_missing_kernel_name_lists_the_kernels(results):
    with pytest.raises(OrtlabError, match=r"no kernel 'sum'.*\['block_sum'\]"):
        results["sm_80"].kernel("sum")


def test_parse_resources_reads_every_field_of_a_ptxas_report():
    # the lines ptxas 12.4 prints for a kernel with a stack frame and two constant banks
    report = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1fPf' for 'sm_80'
ptxas info    : Function properties for _Z1fPf
    304 bytes stack frame, 312 bytes spill stores, 408 bytes spill loads
ptxas info    : Used 32 registers, 304 bytes cumulative stack size, 2048 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]
"""
    ptx = ".visible .entry _Z1fPf(\n\t.param .u64 _Z1fPf_param_0\n)\n.maxntid 128, 2, 1\n.minnctapersm 3\n{\n}\n"
    (k,) = ptxas.parse_resources(report, ptx).values()
    assert (k.name, k.arch, k.registers, k.shared_bytes, k.constant_bytes) == \
        ("_Z1fPf", "sm_80", 32, 2048, ((0, 368), (2, 8)))
    assert (k.local_bytes, k.spill_stores, k.spill_loads, k.spills) == (304, 312, 408, 720)
    assert (k.max_threads_per_block, k.min_blocks_per_sm) == (256, 3)


def test_cuda_headers_from_the_runtime_wheel_are_on_the_include_path():
    source = ('#include <cuda_fp16.h>\n'
              'extern "C" __global__ void inc(__half* x) '
              '{ x[threadIdx.x] = __hadd(x[threadIdx.x], __float2half(1.0f)); }\n')
    result = cuda.compile(source, "sm_80")
    assert "add.f16" in result.ptx  # a half-precision add, as cuda_fp16.hpp writes it for sm_53+
    assert result.kernel("inc").registers > 0


def test_a_nul_character_in_the_source_is_refused():
    with pytest.raises(OrtlabError, match="NUL character"):
        cuda.compile(REDUCTION + "\0", "sm_80")


def test_ptxas_runs_under_a_time_limit():
    with pytest.raises(OrtlabError, match="ptxas took longer than 0.0001 s for sm_80"):
        cuda.compile(REDUCTION + "\n// timed\n", "sm_80", ptxas_timeout=0.0001)
    assert cuda.compile(REDUCTION + "\n// timed\n", "sm_80").cubin  # a failure is not cached


def test_compiling_leaves_pythons_text_encoding_alone():
    # NVRTC switches the calling thread to a "C" locale of its own; left so, open() reads text as ASCII
    import locale

    before = locale.getpreferredencoding(False)
    cuda.clear_cache()
    cuda.compile('extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }', "sm_80")
    assert locale.getpreferredencoding(False) == before
