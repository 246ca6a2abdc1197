"""Benchmark: ms per TinyGPT training step on ortlab's engine vs ORT vs PyTorch, and where the
engine's time goes (kernel time vs per-node overhead, from its own profile).

    python -m ortlab.benchmarks.engine [--steps 30] [--batch 4] [--seq 8]

The same model, weights and batches run three ways: plain PyTorch; MiniORTModule on onnxruntime's
sessions (runtime='ort'); MiniORTModule on ortlab.engine (runtime='ortlab', gradient_builder='ortlab').
The two MiniORTModules share everything but the runtime, so the difference is the engine.
"""
import argparse
import copy
import time

import torch

from ortlab import models
from ortlab.engine.profiler import Profiler
from ortlab.training import SGD, MiniORTModule, train
from ortlab.viz import Table

WARMUP = 3


def _median_ms(history):
    times = sorted(history.step_times[WARMUP:]) or history.step_times
    return 1e3 * times[len(times) // 2]


def step_times(steps=30, batch=4, seq=8, seed=0):
    """{runtime: (median ms per step, History)} for torch, ORT and ortlab's engine."""
    torch.manual_seed(seed)
    module = models.get("gpt", dropout=0.0)
    batches = [module.example_inputs(batch=batch, seq=seq, seed=s) for s in range(4)]
    runs = {"PyTorch": copy.deepcopy(module),
            "ORT (MiniORTModule, runtime='ort')": MiniORTModule(copy.deepcopy(module), "ortlab", level="basic"),
            "ortlab.engine (runtime='ortlab')": MiniORTModule(copy.deepcopy(module), "ortlab", level="basic",
                                                             runtime="ortlab")}
    found = {}
    for name, model in runs.items():
        history = train(model, batches, SGD(model.parameters(), lr=0.05), steps, progress=False)
        found[name] = (_median_ms(history), history, model)
    return found


def engine_breakdown(model, batch, runs=5):
    """(Table of where the engine's time goes, Profile) for one MiniORTModule on ortlab's runtime."""
    manager = model._training_manager()
    sessions = {"forward": manager.forward_session, "backward": manager.backward_session}
    for sess in sessions.values():
        sess.profiler = sess.executor.profiler = Profiler("ortlab_bench")
    for _ in range(runs):
        model(*batch).backward()
    rows = []
    for name, sess in sessions.items():
        events = sess.profiler.events
        kernels = sum(e["dur"] for e in events if e["cat"] == "Node") / runs
        total = sum(e["dur"] for e in events if e["name"] == "model_run") / runs
        nodes = len(sess.state.steps)
        rows.append((name, nodes, f"{total / 1e3:.2f}", f"{kernels / 1e3:.2f}", f"{(total - kernels) / 1e3:.2f}",
                     f"{(total - kernels) / nodes:.1f}"))
        sess.profiler = sess.executor.profiler = None
    return Table(("session", "nodes", "run ms", "kernel ms", "overhead ms", "overhead µs/node"), rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=8)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    found = step_times(args.steps, args.batch, args.seq)
    ort_ms = found["ORT (MiniORTModule, runtime='ort')"][0]
    print(Table(("runtime", "ms/step (median)", "x ORT"),
                [(name, f"{ms:.1f}", f"{ms / ort_ms:.1f}") for name, (ms, _, _) in found.items()]))
    losses = [h.losses for _, h, _ in found.values()]
    print(f"same losses on all three (rtol 1e-4): "
          f"{all(abs(a - b) <= 1e-4 * abs(b) for curve in losses[1:] for a, b in zip(curve, losses[0]))}")
    model = found["ortlab.engine (runtime='ortlab')"][2]
    batch = models.get("gpt", dropout=0.0).example_inputs(batch=args.batch, seq=args.seq, seed=0)
    print(engine_breakdown(model, batch))
    print(f"({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    main()
