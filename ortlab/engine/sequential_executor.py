"""SequentialExecutor: run the plan's steps in order, releasing values after their last use.

Mirrors onnxruntime/core/framework/sequential_executor.cc (ExecuteKernel: build an
OpKernelContext, call Compute, then RecycleNodeInputs, which releases the values whose last
reader this node was) and onnxruntime/core/framework/utils.cc (ExecuteGraph: feeds copied to
the device of their readers first, fetches returned to the host after).
"""
import time

from ortlab.engine.errors import EngineError, KernelFailure
from ortlab.engine.op_kernel import CONST_INPUTS, FunctionKernel, OpKernelContext, output_defs, wrote_to_const
from ortlab.errors import OrtlabError


def needed_steps(state, fetch_names):
    """The steps that compute `fetch_names` (RunOptions.only_execute_path_to_fetches)."""
    wanted, keep = set(fetch_names), []
    for step in reversed(state.steps):
        if any(state.value_names[s] in wanted for s in step.outputs if s >= 0):
            keep.append(step)
            wanted.update(state.value_names[s] for s in step.inputs if s >= 0)
            wanted.update(name for name, _ in step.implicit)
    return keep[::-1]


def run_step(frame, step):
    """One kernel call: Compute, returned values stored as outputs, every output checked present."""
    ctx = OpKernelContext(frame, step, step.kernel)
    try:
        results = step.kernel.compute(ctx)
        if results is not None:
            _store(ctx, step, results)
    except OrtlabError as exc:
        if isinstance(exc, KernelFailure) and step.label() in str(exc):
            raise
        raise KernelFailure(f"Non-zero status code returned while running {step.label()}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 (a kernel's own failure, reported with its node)
        hint = f"; {CONST_INPUTS}" if wrote_to_const(exc) else ""
        raise KernelFailure(f"Non-zero status code returned while running {step.label()}. Status Message: "
                            f"{type(exc).__name__}: {exc}{hint}") from exc
    values = frame.values
    for out in ctx.defs:
        if out.slot >= 0 and values[out.slot] is None:
            missing = [o.name for o in ctx.defs if o.slot >= 0 and values[o.slot] is None]
            raise KernelFailure(f"{step.label()}: the kernel produced no value for output(s) {missing}; write "
                                "each with ctx.output(i, shape) or return it")


def _store(ctx, step, results):
    """A kernel's returned values as its outputs: one value, or a tuple/list with one per output."""
    results = results if isinstance(results, (tuple, list)) else (results,)
    count = len(step.outputs)
    if len(results) > count and isinstance(step.kernel, FunctionKernel):
        raise KernelFailure(f"{step.label()}: the kernel returned {len(results)} values, the node has "
                            f"{count} output(s)")  # (a built-in may return the optional ones the node leaves
    for index in range(min(len(results), count)):  # off: onnx.reference does)
        ctx.put(index, results[index])


class SequentialExecutor:
    """Runs a SessionState's plan on one frame; records one profile event per node when asked."""

    def __init__(self, state, logger, profiler=None):
        self.state, self.logger, self.profiler = state, logger, profiler
        for step in state.steps:  # what each node's outputs are checked against, once per session
            output_defs(step)

    def execute(self, frame, steps, run_options):
        profiler = self.profiler
        for step in steps:
            if run_options.terminate:
                raise EngineError("Exiting due to terminate flag being set to true.")
            start = time.perf_counter() if profiler else 0.0
            run_step(frame, step)
            if profiler:
                profiler.node_event(step, frame, start, time.perf_counter())
            for slot in step.releases:
                frame.release(slot)
        for provider in self.state.providers.values():
            provider.synchronize()
