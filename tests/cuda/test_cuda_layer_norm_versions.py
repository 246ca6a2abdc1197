"""L3_01's CUDA C++ LayerNorm in three versions (ortlab/cuda/kernels/layer_norm_versions.cu): each equals
ORT 1.19.2's CPU LayerNormalization on shapes with tails, one row, one column and rows longer than the
block, at several block sizes; none races (same result with the threads in either order between
barriers); all compile for sm_80 and sm_90 without spills, and only the float4 version emits 128-bit
vector loads in NVRTC's PTX."""
import numpy as np
import pytest

from ortlab import cuda
from ortlab.cuda import gpu
from ortlab.session import run_node
from ortlab.walkthroughs import kernel_optimization as ko

NAMES = [name for _, name, _ in ko.VERSIONS]


@pytest.fixture(scope="module")
def built():
    return cuda.cpu_kernels(ko.source(), NAMES)


def ort(x, scale, bias):
    return run_node("LayerNormalization", [x, scale, bias], {"axis": -1, "epsilon": 1e-5})[0]


@pytest.mark.parametrize("rows, cols, block", [(64, 300, 128), (37, 301, 64), (1, 1, 32), (3, 4, 32),
                                               (2, 4099, 256), (5, 1000, 96), (9, 64, 1024)])
@pytest.mark.parametrize("name", NAMES)
def test_each_version_equals_ort(built, name, rows, cols, block):
    x, scale, bias = ko.inputs(rows, cols, seed=rows + cols)
    y = np.full_like(x, np.nan)
    cuda.launch(built[name], ko.grid(name, rows, block), block, x, scale, bias, y, rows, cols, 1e-5)
    np.testing.assert_allclose(y, ort(x, scale, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES[1:])
def test_the_block_versions_do_not_race(built, name):
    x, scale, bias = ko.inputs(6, 300)
    y = np.zeros_like(x)
    assert cuda.schedule_differences(built[name], 6, 96, x, scale, bias, y, 6, 300, 1e-5) == []


@pytest.mark.parametrize("arch", ko.ARCHS)
def test_they_compile_without_spills_and_only_the_float4_version_loads_vectors(arch):
    result = cuda.compile(ko.source(), arch)
    for name in NAMES:
        k = result.kernel(name)
        assert (k.spills, k.local_bytes) == (0, 0), k
    bodies = {name: result.ptx.split(f".entry {name}(")[1].split(".entry")[0] for name in NAMES}
    assert "ld.global.v4.f32" in bodies["layer_norm_warp_vec4"]
    assert "st.global.v4.f32" in bodies["layer_norm_warp_vec4"]
    assert not any("v4.f32" in bodies[n] for n in ("layer_norm_naive", "layer_norm_block_tree"))
    assert "shfl.sync" in bodies["layer_norm_warp_vec4"] and "shfl.sync" not in bodies["layer_norm_block_tree"]


def test_the_notebook_rows():
    rows = ko.cpu_rows(shapes=((8, 12), (3, 13)), block=32)
    assert len(rows) == 6 and all(r["equal to ORT"] and r["never written"] == 0 for r in rows), rows
    filling = {r["version"]: r for r in ko.filling_rows((8192, 1024), 256)}
    assert (filling["naive"]["blocks"], filling["block tree"]["blocks"]) == (32, 8192)
    assert filling["naive"]["of H100's 270,336 thread slots"] == f"{8192 / (132 * 2048):.0%}"  # 132 SMs x 2048
    sweep = ko.occupancy_sweep("sm_80", [256, 768])
    assert sweep[ko.CONTRAST] == [0.5, 0.375]  # 64 x 256 registers: 4 blocks of 8 warps; 768: 1 block of 24


def test_without_a_gpu_nothing_is_timed():
    if gpu.available():
        pytest.skip("a GPU is here: gpu_rows times the kernels")
    assert all(r["timed"].startswith("no: no GPU here") for r in ko.gpu_rows())
    with pytest.raises(Exception, match="no CUDA GPU here"):
        gpu.device_arch()
