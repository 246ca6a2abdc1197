"""Distributed training on real local processes with torch.distributed (gloo on CPU, NCCL on GPUs).

    launch(fn, world_size)        run an importable fn(rank, world_size, *args) on N local ranks,
                                  rendezvous on loopback only; each rank's return value (launcher.py;
                                  one rank's process: rank_worker.py; results and errors: launch_report.py)
    zero(model, opt_cls, stage)   ZeRO stage 1, 2 or 3 around any model: (model, optimizer) (zero.py)

One module per technique, each a readable mirror checked against one process and the stock version:

    collectives       ring all-reduce, reduce-scatter, all-gather, all-to-all from send/recv; pictures
    data_parallel     DDP: broadcast at wrap, gradient buckets, no_sync
    tensor_parallel   Megatron's column/row-parallel linear layers, f and g, an MLP, self-attention
    zero, accounting  ZeRO 1/2/3; memory and bytes per rank measured, the paper's formulas, a calculator
    zero_deepspeed    DeepSpeed's ZeRO 1/2/3 on the same job; its default gradient clipping
    moe               top-k gated experts with capacity, dispatched with all_to_all_single
    pipeline          GPipe and 1F1B schedules, timelines and bubbles; torch's pipelining beside them
    ort               ORT's side: DDP(ORTModule) vs ORTModule(DDP), the load-balancing sampler
"""
from ortlab.distributed.launcher import LaunchError, LaunchResult, launch
from ortlab.distributed.zero import zero  # the function; the module stays importable by its full name

__all__ = ["LaunchError", "LaunchResult", "launch", "zero"]
