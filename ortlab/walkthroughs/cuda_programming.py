"""Triton's program model made visible: which program touched which element, and printing
from inside a kernel.

A launch runs `grid` programs (CUDA: a grid of thread blocks); each program handles a BLOCK of
elements as one vector (CUDA: the threads of one block, each doing one lane). tl.program_id is
CUDA's blockIdx, tl.arange(0, BLOCK) plays the role of threadIdx, and `mask` switches off the
lanes past the end, as `if (i < n)` does in a CUDA kernel
(onnxruntime/core/providers/cuda/cu_inc/common.cuh: CALCULATE_ELEMENTWISE_INDEX_OR_EXIT).
"""
import numpy as np
import torch
import triton
import triton.language as tl

from ortlab.env import kernel_device
from ortlab.kernels.executor import launch


@triton.jit
def where_am_i_kernel(program_out, lane_out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    offsets = pid * BLOCK + lanes
    mask = offsets < n
    tl.store(program_out + offsets, pid + lanes * 0, mask=mask)
    tl.store(lane_out + offsets, lanes, mask=mask)


@triton.jit
def print_inside_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.device_print("program", pid)
    tl.device_print("sum of my block", tl.sum(x, axis=0))


def where_am_i(n, block):
    """For each of n elements: the program that handled it and its lane within the block."""
    program = torch.full((n,), -1, dtype=torch.int32, device=kernel_device())
    lane = torch.full_like(program, -1)
    grid = triton.cdiv(n, block)
    launch(where_am_i_kernel, grid, program, lane, n, BLOCK=block)
    return {"grid": grid, "program": program.cpu().numpy(), "lane": lane.cpu().numpy(),
            "idle lanes": grid * block - n}


def program_table(n, block):
    """Rows: program id, the elements it handled, and how many of its lanes were masked off."""
    seen = where_am_i(n, block)
    rows = []
    for pid in range(seen["grid"]):
        elements = np.flatnonzero(seen["program"] == pid)
        rows.append({"program_id": pid, "elements": f"{elements[0]}..{elements[-1]}",
                     "active lanes": len(elements), "masked lanes": block - len(elements)})
    return rows


def print_from_a_kernel(values, block):
    """Launch print_inside_kernel: under the interpreter its prints run as Python prints."""
    x = torch.tensor(values, dtype=torch.float32, device=kernel_device())
    launch(print_inside_kernel, triton.cdiv(len(values), block), x, len(values), BLOCK=block)
