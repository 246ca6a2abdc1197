"""What an op is, below every mirror: each op's one numpy definition, the reference kernels onnx.reference
runs for ORT's own ops, ORT's extra schemas, and what a kernel declares.

    reference            each op's maths in numpy (the Triton kernels, the CUDA kernels and the engine check against it)
    contrib_ops          com.microsoft ops and ORT's training ops as onnx.reference OpRun classes (CONTRIB_OPS)
    schemas              ORT's ONNX-domain schemas onnx lacks (LayerNormalization-1, ...), installed explicitly
    kernel_def           KernelDef, as ORT's KernelDefBuilder records it (framework/kernel_def_builder.h)
    kernel_declarations  ORT 1.19.2's CPU kernels' Alias and MayInplace, the table the planner and the engine share
    rows                 laying a tensor out as rows for row-wise kernels
"""
