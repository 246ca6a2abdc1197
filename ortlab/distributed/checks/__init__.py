"""Each distributed mirror checked across ranks: the rank functions a launch runs, the one-process
references they are compared with, and the tables of their results (L2_03 and the tests use them).

One module per mirror, named after it: collectives, data_parallel, tensor_parallel, moe, zero.
The mirrors themselves are the modules of the same names one floor up, in ortlab/distributed/.
"""
from ortlab.distributed.checks import collectives, data_parallel, moe, tensor_parallel, zero

__all__ = ["collectives", "data_parallel", "moe", "tensor_parallel", "zero"]
