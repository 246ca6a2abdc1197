"""L1_08's exercises. 'overlap' is judged on ortlab.cuda.runtime's timeline: here the timelines of the pipelines the
exercise talks about are worked out by hand from the rules the model follows (CUDA C++ Programming Guide, "Streams":
one stream runs its work in issue order, different streams may overlap; one copy engine per direction; the
synchronize calls make the host wait), and the RecordingDevice's log is the model's own intervals. 'row_sum_fix' is
judged against ORT's ReduceSum: here ORT's row sums are numpy's in float64 on every shape the check runs, and the
kernel the notebook shows has the two bugs it says (a barrier not every thread reaches, and, that one fixed, a race
the two thread orders expose), both found by ortlab's CPU runner."""
import numpy as np
import pytest

from ortlab import cuda
from ortlab.labs import l1_08
from ortlab.labs.judges.l1_08 import ort_row_sums
from ortlab.errors import OrtlabError


def _run(streams_for):
    """The pipeline with chunk i on stream streams_for(device)[i]: (device, {name: (start, end)})."""
    device, host_in, buffers, host_out = l1_08.overlap_setup()
    streams = streams_for(device)
    for i in range(l1_08.CHUNKS):
        device.memcpy_async(buffers[i], host_in[i], l1_08.COPY_IN, streams[i])
        device.launch(f"kernel {i}", l1_08.KERNEL, streams[i], args=(buffers[i],))
        device.memcpy_async(host_out[i], buffers[i], l1_08.COPY_OUT, streams[i])
    device.device_synchronize()
    return device


def test_the_setup_costs_no_time():
    device, *_ = l1_08.overlap_setup()
    assert device.host_now == 0 and not device.host_blocked()


def test_one_stream_takes_24_model_ms():
    # issue order on one stream: 4 chunks x (2 + 3 + 1) = 24
    device = _run(lambda d: [d.create_stream("s")] * l1_08.CHUNKS)
    assert device.host_now == 24


def test_a_stream_per_chunk_ends_at_12():
    # copies in share the H2D engine: chunk i's copy in runs [2i, 2i + 2], its kernel [2i + 2, 2i + 5] (kernels
    # of different streams overlap), its copy out [2i + 5, 2i + 6]: the D2H engine is free each time; done at 12
    device = _run(lambda d: [d.create_stream(f"s{i}") for i in range(l1_08.CHUNKS)])
    spans = [(c["name"] or ("in" if c["dst"] in range(4, 8) else "out"), c["start"], c["end"])
             for c in device.calls]
    for i in range(l1_08.CHUNKS):
        assert spans[3 * i] == ("in", 2 * i, 2 * i + 2)
        assert spans[3 * i + 1] == (f"kernel {i}", 2 * i + 2, 2 * i + 5)
        assert spans[3 * i + 2] == ("out", 2 * i + 5, 2 * i + 6)
    assert device.host_now == 12


def test_two_alternating_streams_reach_the_target_14():
    # stream A: chunk 0 in [0, 2], kernel [2, 5], out [5, 6]; chunk 2 in [6, 8] (behind chunk 0 in A), kernel
    # [8, 11], out [11, 12]. Stream B: chunk 1 in [2, 4], kernel [4, 7], out [7, 8]; chunk 3 in [8, 10] (the H2D
    # engine is busy with chunk 2 until 8), kernel [10, 13], out [13, 14]. Done at 14 = TARGET.
    device = _run(lambda d: [d.create_stream("A"), d.create_stream("B")] * 2)
    assert device.host_now == l1_08.TARGET == 14


def test_the_log_is_the_models_timeline():
    device = _run(lambda d: [d.create_stream("A"), d.create_stream("B")] * 2)
    placed = {(i.lane, i.start, i.end) for i in device.intervals}
    assert len(device.calls) == 3 * l1_08.CHUNKS
    assert all((c["stream"], c["start"], c["end"]) in placed for c in device.calls)


@pytest.mark.parametrize("rows, cols, block", l1_08.SEEN_ROWS + l1_08.HIDDEN_ROWS)
def test_orts_row_sums_are_numpys(rows, cols, block):
    x = l1_08.row_sum_input(rows, cols)
    np.testing.assert_allclose(ort_row_sums(x), x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    assert block <= 256 and block & (block - 1) == 0  # the tree halves a power-of-two block; 256 slots


def test_the_shown_kernel_has_the_two_bugs_it_says():
    x = l1_08.row_sum_input(4, 300)
    buggy = cuda.cpu_kernel(l1_08.BUGGY_ROW_SUM, "row_sum")
    with pytest.raises(OrtlabError, match="waits at __syncthreads"):
        cuda.launch(buggy, 4, 128, x, np.zeros(4, np.float32), 300)
    barrier_outside = l1_08.BUGGY_ROW_SUM.replace("      __syncthreads();\n    }\n", "    }\n    __syncthreads();\n")
    raced = cuda.cpu_kernel(barrier_outside, "row_sum")
    assert cuda.schedule_differences(raced, 4, 128, x, np.zeros(4, np.float32), 300) == ["out"]
    fixed = cuda.cpu_kernel(barrier_outside.replace("partial[t] = s;\n", "partial[t] = s;\n  __syncthreads();\n"),
                            "row_sum")
    out = np.zeros(4, np.float32)
    cuda.launch(fixed, 4, 128, x, out, 300)
    assert cuda.schedule_differences(fixed, 4, 128, x, np.zeros(4, np.float32), 300) == []
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-5)
