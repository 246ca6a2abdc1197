"""Which rank am I, of how many: the (rank, world_size) a layer or sampler is built for.

Given explicitly, they are checked; left out, they are read from the default process group
(torch.distributed's get_rank / get_world_size, as Megatron's layers and torch's samplers do).
"""
import torch.distributed as dist


def rank_and_world_size(rank, world_size, error, group=None,
                        hint="build it inside a launched function (ortlab.distributed.launch)"):
    """(rank, world_size): as given, or from the process group; `error` (an OrtlabError class) says
    what is wrong: no group to read them from, not ints, or a rank outside [0, world_size)."""
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise error(f"no process group: pass rank= and world_size=, or {hint}")
        rank = dist.get_rank(group) if rank is None else rank
        world_size = dist.get_world_size(group) if world_size is None else world_size
    for value, what in ((rank, "rank"), (world_size, "world_size")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    if world_size < 1 or not 0 <= rank < world_size:
        raise error(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    return rank, world_size
