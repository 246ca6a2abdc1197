"""DeepSpeed's ZeRO 1, 2 and 3 on the same toy job as ortlab's `zero`: the production implementation beside
the readable one.

Runs deepspeed/runtime/zero/stage_1_and_2.py (DeepSpeedZeroOptimizer) and stage3.py
(DeepSpeedZeroOptimizer_Stage3) through `deepspeed.initialize`, on the CPU accelerator DeepSpeed selects when
there is no GPU, over the launcher's gloo process group (no oneCCL needed). `make setup` installs DeepSpeed in
a folder of its own that only these ranks put on sys.path (tools/deepspeed-requirements.txt says why). The
first use on a machine JIT-compiles DeepSpeed's shared-memory comm op (`deepspeed_shm_comm`, about 40 s, cached in
~/.cache/torch_extensions).

One default matters for the comparison: DeepSpeed clips gradients to a global norm of 1.0 unless the config
says otherwise (`GRADIENT_CLIPPING_DEFAULT = 1.0` in deepspeed/runtime/constants.py). A job ported from a
plain torch loop that never clipped then trains differently without any message. `deepspeed_check` passes
`gradient_clipping` explicitly; with 0 DeepSpeed equals one process and ortlab's `zero`, with its default it
equals one process that calls `clip_grad_norm_(params, 1.0)` before each step (`reference_run(clip=1.0)`).
"""
import importlib.util
import math
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from ortlab.distributed.zero import STAGES, ZeroError
from ortlab.distributed.checks.zero import clean_name, trainable_params, toy_batch, toy_model

DEEPSPEED_DEFAULT_CLIPPING = 1.0


def deepspeed_dir():
    """Where `make setup` installs DeepSpeed: a folder of its own in the environment (<prefix>/deepspeed),
    kept off sys.path so that ORTModule's `import deepspeed` does not find it (tools/deepspeed-requirements.txt)."""
    return Path(sys.prefix) / "deepspeed"


def deepspeed_available():
    """Whether DeepSpeed can be imported by a rank: installed in deepspeed_dir(), or in the environment."""
    return ((deepspeed_dir() / "deepspeed" / "__init__.py").is_file()
            or importlib.util.find_spec("deepspeed") is not None)


def _import_deepspeed():
    """Import DeepSpeed in this process (a rank's), putting deepspeed_dir() on sys.path when needed."""
    if importlib.util.find_spec("deepspeed") is None and (deepspeed_dir() / "deepspeed").is_dir():
        sys.path.append(str(deepspeed_dir()))
    if importlib.util.find_spec("deepspeed") is None:
        raise ZeroError(f"DeepSpeed is not installed: run `make setup`, which installs it into "
                        f"{deepspeed_dir()} (tools/deepspeed-requirements.txt)")
    import deepspeed  # optional: deepspeed
    return deepspeed


def deepspeed_config(stage, micro_batch, clipping=None):
    """The DeepSpeed config of one run: ZeRO `stage` with a client optimizer (fp32, no loss scaling);
    `clipping=None` leaves DeepSpeed's default (clip to norm 1.0), a number sets `gradient_clipping`."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ZeroError(f"stage must be 1, 2 or 3, got {stage!r}")
    config = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10 ** 9}
    if clipping is not None:
        config["gradient_clipping"] = clipping
    return config


def _start(stages):
    """Check the stages, import DeepSpeed and adopt the launcher's process group: the module, ready."""
    if not isinstance(stages, (tuple, list)) or not stages:
        raise ZeroError(f"stages must be a non-empty tuple of 1, 2 or 3, got {stages!r}")
    for stage in stages:
        deepspeed_config(stage, 2)  # checks the stage before anything starts
    deepspeed = _import_deepspeed()
    deepspeed.init_distributed(dist_backend=dist.get_backend())
    return deepspeed


def _engine(deepspeed, stage, lr, seed, clipping):
    """(engine, DeepSpeed's optimizer) for toy_model(seed) with a client torch Adam."""
    model = toy_model(seed)
    optimizer = torch.optim.Adam(trainable_params(model), lr=lr)
    engine, ds_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                      config=deepspeed_config(stage, 2, clipping))
    return engine, ds_optimizer


def _step(engine, rank, world_size, seed):
    """One training step on this rank's rows of toy_batch; the loss as a float."""
    tokens, targets = toy_batch(world_size, seed=seed)
    rows = slice(rank * 2, rank * 2 + 2)
    loss = engine(tokens[rows], targets[rows])
    engine.backward(loss)  # DeepSpeed's backward: its hooks reduce(-scatter) the gradients
    engine.step()          # the partitioned update, the parameter all-gather, and zero_grad
    return loss.item()


def _train(deepspeed, rank, world_size, stage, steps, lr, seed, clipping):
    engine, ds_optimizer = _engine(deepspeed, stage, lr, seed, clipping)
    losses = [_step(engine, rank, world_size, seed) for _ in range(steps)]
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):  # a no-op below stage 3
        full = {clean_name(n): p.detach().clone() for n, p in engine.module.named_parameters()}
    return {"stage": stage, "losses": losses, "params": full,
            "optimizer": type(ds_optimizer).__name__, "clipping": engine.gradient_clipping()}


def _label(stage, clipping):
    return f"deepspeed_zero{stage}" + ("" if clipping == 0 else
                                       " (default config)" if clipping is None else f" (clipping {clipping:g})")


def deepspeed_check(rank, world_size, stages=STAGES, steps=3, lr=0.05, seed=0, clippings=(0.0,)):
    """Rank function: zero_check's job (TiedToyModel, Adam, this rank's rows of toy_batch) trained by
    DeepSpeed's ZeRO at each of `stages`, once per `gradient_clipping` value in `clippings` (0: off, as a
    plain torch loop; None: DeepSpeed's default config, which clips to 1.0).

    Returns {label: {'stage', 'losses' (this rank's), 'params' (final, gathered, by name), 'optimizer'
    (DeepSpeed's class), 'clipping' (what the engine used), 'seconds'}}, labelled 'deepspeed_zero<s>' with
    clipping off and 'deepspeed_zero<s> (default config)' with None; checks.zero.check_table reads it.
    """
    if not isinstance(clippings, (tuple, list)) or not clippings or not all(
            c is None or (isinstance(c, (int, float)) and not isinstance(c, bool) and c >= 0) for c in clippings):
        raise ZeroError(f"clippings must be a non-empty tuple of norms >= 0 or None, got {clippings!r}")
    deepspeed = _start(stages)
    out = {}
    for clipping in clippings:
        for stage in stages:
            started = time.perf_counter()
            run = _train(deepspeed, rank, world_size, stage, steps, lr, seed, clipping)
            out[_label(stage, clipping)] = {**run, "seconds": time.perf_counter() - started}
    return out


def _first_line(message, width=200):
    line = (str(message).strip().splitlines() or [""])[0]
    return line if len(line) <= width else line[:width - 3] + "..."


def fp16_optimizer_on_deepspeed(rank, world_size, stage=1):
    """Rank function: ORT's FP16_Optimizer (onnxruntime/training/optim/fp16_optimizer.py) given a DeepSpeed
    ZeRO optimizer, as section 5 of the ONNX Runtime Training Guidelines pairs them, then one training
    step through the engine.

    Returns {'optimizer' (DeepSpeed's class, qualified as ORT's registry keys it), 'same object' (whether
    FP16_Optimizer returned it unmodified), 'warnings' (the first line of each warning it gave), 'deepspeed'
    (the version), 'step ran'}."""
    deepspeed = _start((stage,))
    from onnxruntime.training.optim import FP16_Optimizer  # heavy: onnxruntime

    engine, ds_optimizer = _engine(deepspeed, stage, lr=0.05, seed=0, clipping=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = FP16_Optimizer(ds_optimizer)
    loss = _step(engine, rank, world_size, seed=0)
    cls = type(ds_optimizer)
    return {"optimizer": f"{cls.__module__}.{cls.__qualname__}", "same object": returned is ds_optimizer,
            "warnings": [_first_line(w.message) for w in caught], "deepspeed": deepspeed.__version__,
            "step ran": math.isfinite(loss)}
