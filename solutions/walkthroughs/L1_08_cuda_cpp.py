"""Reference answers to the exercises of notebooks/L1_08_cuda_cpp.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "overlap": '''
for i in range(len(buffers)):
    stream = device.create_stream(f"chunk {i}")  # one stream per chunk: its three steps stay in order
    device.memcpy_async(buffers[i], host_in[i], l1_08.COPY_IN, stream)
    device.launch(f"kernel {i}", l1_08.KERNEL, stream, args=(buffers[i],))
    device.memcpy_async(host_out[i], buffers[i], l1_08.COPY_OUT, stream)
device.device_synchronize()  # the host reads host_out only after this
''',
    "row_sum_fix": '''
return r"""
extern "C" __global__ void row_sum(const float* x, float* out, int cols) {
  __shared__ float partial[256];
  int row = blockIdx.x, t = threadIdx.x;
  float s = 0.0f;
  for (int c = t; c < cols; c += blockDim.x) s += x[row * cols + c];
  partial[t] = s;
  __syncthreads();                       // every slot written before the tree reads any
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (t < k) partial[t] += partial[t + k];
    __syncthreads();                     // every thread, each level: outside the if
  }
  if (t == 0) out[row] = partial[0];
}
"""
''',
}

MISTAKES = {
    "overlap": [
        ('''
stream = device.create_stream("work")
for i in range(len(buffers)):
    device.memcpy_async(buffers[i], host_in[i], l1_08.COPY_IN, stream)
    device.launch(f"kernel {i}", l1_08.KERNEL, stream, args=(buffers[i],))
    device.memcpy_async(host_out[i], buffers[i], l1_08.COPY_OUT, stream)
device.device_synchronize()
''', "nothing overlapped"),
        ('''
copies, kernels = device.create_stream("copies"), device.create_stream("kernels")
for i in range(len(buffers)):
    device.memcpy_async(buffers[i], host_in[i], l1_08.COPY_IN, copies)
    device.launch(f"kernel {i}", l1_08.KERNEL, kernels, args=(buffers[i],))
    device.memcpy_async(host_out[i], buffers[i], l1_08.COPY_OUT, copies)
device.device_synchronize()
''', "Work in two streams is not ordered"),
        ('''
for i in range(len(buffers)):
    stream = device.create_stream(f"chunk {i}")
    device.memcpy_async(buffers[i], host_in[i], l1_08.COPY_IN, stream)
    device.launch(f"kernel {i}", l1_08.KERNEL, stream, args=(buffers[i],))
    device.memcpy_async(host_out[i], buffers[i], l1_08.COPY_OUT, stream)
''', "before the last result reached host_out"),
        ('''
for i in range(len(buffers)):
    device.memcpy(buffers[i], host_in[i], l1_08.COPY_IN)
    device.launch(f"kernel {i}", l1_08.KERNEL, args=(buffers[i],))
    device.memcpy(host_out[i], buffers[i], l1_08.COPY_OUT)
''', "legacy default stream"),
        ('''
streams = [device.create_stream("A"), device.create_stream("B")]
for i in range(len(buffers)):
    device.memcpy_async(buffers[i], host_in[i], l1_08.COPY_IN, streams[i % 2])
for i in range(len(buffers)):
    device.launch(f"kernel {i}", l1_08.KERNEL, streams[i % 2], args=(buffers[i],))
for i in range(len(buffers)):
    device.memcpy_async(host_out[i], buffers[i], l1_08.COPY_OUT, streams[i % 2])
device.device_synchronize()
''', "waited until 6 behind the copy into buffers[2]"),
        ('''
copies, compute = device.create_stream("copies"), device.create_stream("compute")
for i in range(len(buffers)):
    device.memcpy_async(buffers[i], host_in[i], l1_08.COPY_IN, copies)
    copied = device.create_event(f"copied {i}")
    device.event_record(copied, copies)
    device.stream_wait_event(compute, copied)
    device.launch(f"kernel {i}", l1_08.KERNEL, compute, args=(buffers[i],))
    computed = device.create_event(f"computed {i}")
    device.event_record(computed, compute)
    device.stream_wait_event(copies, computed)
    device.memcpy_async(host_out[i], buffers[i], l1_08.COPY_OUT, copies)
device.device_synchronize()
''', "behind the copy back of chunk 0 in stream 'copies'"),
    ],
    "row_sum_fix": [
        ('''
return l1_08.BUGGY_ROW_SUM
''', "not every thread of the block reaches"),
        ('''
return l1_08.BUGGY_ROW_SUM.replace("      __syncthreads();\\n    }\\n", "    }\\n    __syncthreads();\\n")
''', "a race"),
        ('''
source = l1_08.BUGGY_ROW_SUM.replace("for (int c = t; c < cols; c += blockDim.x) s += x[row * cols + c];",
                                     "if (t < cols) s = x[row * cols + t];")
source = source.replace("partial[t] = s;\\n", "partial[t] = s;\\n  __syncthreads();\\n")
return source.replace("      __syncthreads();\\n    }\\n", "    }\\n    __syncthreads();\\n")
''', "first 128 columns only"),
        ('''
return l1_08.BUGGY_ROW_SUM.replace('extern "C" ', "")
''', "extern"),
    ],
}
