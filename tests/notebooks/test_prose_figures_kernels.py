"""The prose of the kernel and binding walkthroughs (L1_03, L1_04, L1_06, L1_08, L3_01) says what their stored
outputs show: each figure a sentence states is read from the stored notebook's markdown and compared with the
figure in the output beside it (or recomputed), so the two cannot drift apart; every lab a walkthrough names
exists and none is called planned; and the helper behind L1_04's OrtValue cells reads ORT's OrtValue as the
pybind layer exposes it.
"""
import json
import re

import numpy as np
import pytest

from repo_paths import ROOT
from stored_notebook import NOTEBOOKS, markdown as _markdown
from stored_notebook import output as _output_after









@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_lab_a_walkthrough_names_exists_and_none_is_called_planned(path):
    text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "markdown")
    labs = set(re.findall(r"\blab\d\d_[a-z0-9_]+", text))
    missing = sorted(lab for lab in labs if not (ROOT / "labs" / f"{lab}.ipynb").exists())
    assert not missing, f"{path.name} names labs that do not exist in labs/: {missing}"
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        if re.search(r"\blab\d\d_", sentence):
            assert not re.search(r"\bplanned\b", sentence), f"{path.name} calls a lab planned: {sentence!r}"


def test_l1_08_sends_the_learner_to_the_cuda_kernel_lab():
    assert "lab10_cuda_kernel" in _markdown("L1_08_cuda_cpp")


def test_l3_01_naive_kernel_thread_slot_shares_in_prose_are_the_tables():
    """The timing paragraph's "N% of an A100's thread slots filled, M% of an H100's" against filling_rows()."""
    prose = re.search(r"(\d+)%\s+of\s+an\s+A100's\s+thread\s+slots\s+filled,\s+(\d+)%\s+of\s+an\s+H100's",
                      _markdown("L3_01_kernel_optimization"))
    assert prose, "L3_01: the timing paragraph no longer says the naive kernel's share of each GPU's thread slots"
    table = _output_after("L3_01_kernel_optimization", "ko.filling_rows()")
    header, *rows = [line for line in table.splitlines() if line.strip() and not line.startswith("-")]
    naive = next(row for row in rows if row.startswith("naive"))
    shares = re.findall(r"(\d+)%", naive)
    assert "A100" in header and "H100" in header and header.index("A100") < header.index("H100")
    assert (prose.group(1), prose.group(2)) == tuple(shares[:2]), (prose.groups(), naive)


def test_l3_01_naive_shares_recomputed_from_the_launch():
    """The table itself: 8192 rows at one thread per row, against 2048 threads per SM on 108 (A100) and 132
    (H100) SMs (the datasheets' SM counts that L1_08's table prints)."""
    table = _output_after("L3_01_kernel_optimization", "ko.filling_rows()")
    naive = next(line for line in table.splitlines() if line.startswith("naive"))
    got = [int(s) for s in re.findall(r"(\d+)%", naive)]
    assert got == [round(100 * 8192 / (2048 * sms)) for sms in (108, 132)]


MINE = ("L1_03_iobinding_dlpack", "L1_04_pybind", "L1_06_cuda_programming", "L1_08_cuda_cpp",
        "L3_01_kernel_optimization")


@pytest.mark.parametrize("stem", MINE)
def test_the_prose_says_what_is_not_how_the_notebook_was_made(stem):
    found = re.findall(r"when this notebook was \w+|for this notebook were written|found while probing"
                       r"|what the plot showed", _markdown(stem), flags=re.IGNORECASE)
    assert not found, f"{stem}: development history in the learner's text: {found}"


def test_l1_04_speed_ratios_line_is_the_timings_above_it():
    """The ratio line the prose points to, recomputed from the rows the same cell printed."""
    from ortlab.walkthroughs import pybind as pbv

    printed = _output_after("L1_04_pybind", "pbv.speed_ratios(times)")
    rows = [{"size": int(n), "cpp_us": float(c), "numpy_us": float(p), "ort_us": float(o)} for n, c, p, o in
            re.findall(r"^\s*(\d+) elements: C\+\+\s+([\d.]+) us\s+numpy\s+([\d.]+) us\s+ORT\s+([\d.]+) us",
                       printed, flags=re.MULTILINE)]
    assert len(rows) == 4, printed
    line = next(text for text in printed.splitlines() if text.startswith("at "))
    assert "ratios at a million elements" in _markdown("L1_04_pybind")
    assert line.startswith(f"at {max(r['size'] for r in rows):,} elements")
    stated = [float(v) for v in re.findall(r"([\d.]+)x faster", line)]
    recomputed = [float(v) for v in re.findall(r"([\d.]+)x faster", pbv.speed_ratios(rows))]
    assert np.allclose(stated, recomputed, atol=0.11), (line, pbv.speed_ratios(rows))


def test_l1_04_numpy_of_a_cpu_ortvalue_is_a_view_as_the_prose_says():
    prose = _markdown("L1_04_pybind")
    assert "`numpy()` wraps the `Tensor`'s own\nbuffer" in prose or "`numpy()` wraps the `Tensor`'s own buffer" in prose
    table = _output_after("L1_04_pybind", "pbv.numpy_copy_table(value)")
    answers = dict(re.findall(r"^(.+?)\s{2,}(\S+)\s*$", table, flags=re.MULTILINE))
    assert answers["value.numpy() starts at value.data_ptr()"] == "True"
    assert answers["two numpy() calls share memory"] == "True"
    assert answers["np.array(value.numpy()) starts at value.data_ptr()"] == "False"


# --- the helpers behind L1_04's OrtValue cells (ortlab/walkthroughs/pybind.py) ---------------------------------
@pytest.fixture(scope="module")
def cpu_value():
    from ortlab.env import quiet_import

    ort = quiet_import("onnxruntime")
    return ort.OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))


def test_ortvalue_table_reads_what_ort_returns(cpu_value):
    from ortlab.walkthroughs import pybind as pbv

    rows = {row[0]: row[1] for row in pbv.ortvalue_table(cpu_value).rows}
    assert rows["value.shape()"] == repr(cpu_value.shape()) == "[2, 3]"
    assert rows["value.device_name()"] == repr(cpu_value.device_name())
    assert rows["value.data_type()"] == "'tensor(float)'"
    assert rows["value.element_type()"] == "1 (onnx.TensorProto.FLOAT)"
    assert rows["value.numpy()"] == "numpy.ndarray float32 [2, 3]"
    assert set(pbv.ORTVALUE_CPP) <= set(dir(cpu_value._ortvalue)), "every method named is C.OrtValue's own"
    assert not [m for m in dir(cpu_value._ortvalue) if m.lower().startswith("get")]


def test_numpy_copy_table_follows_the_addresses(cpu_value):
    from ortlab.walkthroughs import pybind as pbv

    answers = dict(pbv.numpy_copy_table(cpu_value).rows)
    view = cpu_value.numpy()
    assert answers["value.numpy() starts at value.data_ptr()"] == (view.ctypes.data == cpu_value.data_ptr())
    assert answers["two numpy() calls share memory"] is True
    assert answers["np.array(value.numpy()) starts at value.data_ptr()"] is False


def test_speed_ratios_line():
    from ortlab.walkthroughs import pybind as pbv

    rows = [{"size": 1024, "cpp_us": 1.0, "numpy_us": 1.0, "ort_us": 1.0},
            {"size": 1 << 20, "cpp_us": 100.0, "numpy_us": 870.0, "ort_us": 20.0}]
    assert pbv.speed_ratios(rows) == ("at 1,048,576 elements: C++ 8.7x faster than numpy; "
                                      "ORT 5.0x faster than our C++")
    with pytest.raises(pbv.PybindViewError):
        pbv.speed_ratios([])


def test_cuda_value_to_host_refuses_without_a_gpu_and_numpy_copy_table_refuses_a_device_value():
    import torch

    from ortlab.walkthroughs import pybind as pbv

    if torch.cuda.is_available():
        array = np.arange(6, dtype=np.float32).reshape(2, 3)
        host, value, how = pbv.cuda_value_to_host(array)
        assert value.device_name().lower() == "cuda" and np.array_equal(host, array), how
        with pytest.raises(pbv.PybindViewError):
            pbv.numpy_copy_table(value)
    else:
        with pytest.raises(pbv.PybindViewError, match="needs a CUDA GPU"):
            pbv.cuda_value_to_host(np.zeros(3, np.float32))
