"""Distributed training on real local processes with torch.distributed.

`launch(fn, world_size)` runs an importable function on N local ranks, rendezvous on loopback only,
and returns each rank's return value (see ortlab.distributed.launcher).
"""
from ortlab.distributed.launcher import LaunchError, LaunchResult, launch

__all__ = ["LaunchError", "LaunchResult", "launch"]
