"""Collectives built only from point-to-point send/recv: readable mirrors of NCCL's ring algorithms.

Mirrors NCCL's ring collectives (nccl/src/device/all_reduce.h runRing, reduce_scatter.h, all_gather.h;
the schedule is described in NCCL's docs "Collective Operations") and the pairwise exchange of
all-to-all (nccl/src/device/sendrecv.h, as used by torch's all_to_all_single on NCCL):

- the tensor is seen as one flat buffer cut into `world_size` chunks (uneven sizes allowed: the first
  `numel % world_size` chunks are one element longer, as torch.tensor_split cuts);
- ring reduce-scatter: N-1 steps; at step s rank r sends chunk (r-s-1) % N to rank r+1 and adds the chunk
  (r-s-2) % N it receives from rank r-1 into its own copy. After N-1 steps rank r holds the full sum of
  chunk r;
- ring all-gather: N-1 steps; at step s rank r sends chunk (r-s) % N (the one it finished last) to r+1 and
  stores chunk (r-s-1) % N from r-1;
- ring all-reduce = reduce-scatter then all-gather, so each rank sends 2(N-1) chunks: 2(N-1)/N of the
  tensor, whatever N is (the reason NCCL's ring is bandwidth-optimal);
- all-to-all: N-1 pairwise steps; at step s rank r sends its chunk for rank r+s and receives rank r-s's
  chunk for it (the chunk shapes are exchanged first, so uneven splits need no split sizes).

Before any payload moves, each function sends one row per rank (dtype, shape) once around the ring, so a
rank whose tensor differs is named by the same CollectiveError on every rank (a recv of the wrong size would
make gloo abort the process); those bytes are counted in the trace's `meta_bytes_sent`, not `bytes_sent`.

Each function can fill a `CollectiveTrace`: a snapshot of what this rank holds after every step (which
ranks' data each chunk sums, its size and values: plain data) and the bytes it sent. `plot_collective`
draws the snapshots of every rank as a grid (ranks x steps), `format_collective` prints them.

`collectives_check` is the rank function that runs every mirror next to the stock collective
(`all_reduce`, `reduce_scatter_tensor`, `all_gather_into_tensor`, `all_to_all_single` with uneven splits)
on the same data, plus gloo's capability errors and bad input, for one launch.
"""
import numbers

import torch
import torch.distributed as dist

from ortlab.errors import OrtlabError

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                    torch.int8, torch.uint8, torch.int32, torch.int64)
MAX_DIMS = 8


class CollectiveError(OrtlabError):
    """A collective mirror got an input it cannot use, or was called outside a process group."""


# ---------------------------------------------------------------------------------------------
# The trace: what one rank holds after every step, and what it sent.


class CollectiveTrace:
    """What one rank did in one collective: snapshots after every step and the bytes it sent.

    Pass one to a mirror (`ring_all_reduce(t, trace=CollectiveTrace())`); the mirror sets `name`, `rank`,
    `world_size` and appends one snapshot per step (step 0 is the state before any message). A snapshot is
    a dict: step, phase ('start', 'reduce-scatter', 'all-gather', 'exchange'), sent / received
    ([chunk, peer] or None), origins (for each chunk, the sorted ranks whose data it sums), sizes (elements
    per chunk) and, when `values` is true, values (each chunk's elements as a flat list).
    `bytes_sent` counts the payload this rank sent (what the ring formulas count), not the few bytes of
    dtypes and shapes every mirror exchanges first to compare the ranks' inputs, counted in `meta_bytes_sent`.
    """

    def __init__(self, values=True):
        self.values = values
        self.name, self.rank, self.world_size = None, None, None
        self.snapshots = []
        self.bytes_sent = 0
        self.meta_bytes_sent = 0
        self.messages = 0

    def start(self, name, rank, world_size):
        """Begin a collective: set who runs it and forget earlier snapshots."""
        self.name, self.rank, self.world_size = name, rank, world_size
        self.snapshots, self.bytes_sent, self.meta_bytes_sent, self.messages = [], 0, 0, 0
        return self

    def count(self, tensor):
        """Add one message of `tensor` to the bytes sent."""
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self.messages += 1

    def snapshot(self, phase, chunks, origins, sent=None, received=None):
        """Record what this rank holds now (chunks: list of tensors; origins: list of rank lists)."""
        record = {"step": len(self.snapshots), "phase": phase, "sent": sent, "received": received,
                  "origins": [sorted(o) for o in origins], "sizes": [int(c.numel()) for c in chunks]}
        if self.values:
            record["values"] = [c.detach().reshape(-1).double().tolist() for c in chunks]
        self.snapshots.append(record)

    def as_dict(self):
        """Plain data (picklable, for a rank function's return value)."""
        return {"name": self.name, "rank": self.rank, "world_size": self.world_size,
                "snapshots": list(self.snapshots), "bytes_sent": self.bytes_sent,
                "meta_bytes_sent": self.meta_bytes_sent, "messages": self.messages}

    def __repr__(self):
        return (f"CollectiveTrace({self.name!r}, rank={self.rank}, world_size={self.world_size}, "
                f"steps={max(len(self.snapshots) - 1, 0)}, bytes_sent={self.bytes_sent})")


class _NoTrace(CollectiveTrace):
    """A trace that records nothing (used when the caller passes none)."""

    def count(self, tensor):
        """Count nothing."""

    def snapshot(self, phase, chunks, origins, sent=None, received=None):
        """Record nothing."""


def _start(trace, name, rank, world_size):
    if trace is None:
        return _NoTrace(values=False).start(name, rank, world_size)
    if not isinstance(trace, CollectiveTrace):
        raise CollectiveError(f"trace must be a CollectiveTrace (or None), got {type(trace).__name__}")
    return trace.start(name, rank, world_size)


# ---------------------------------------------------------------------------------------------
# Checks.


def _check_tensor(tensor, what):
    """Refuse what a collective cannot carry: not a tensor, an unsupported dtype, a sparse layout."""
    if not isinstance(tensor, torch.Tensor):
        raise CollectiveError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}; "
                              f"convert it with torch.as_tensor(...)")
    if tensor.layout != torch.strided:
        raise CollectiveError(f"{what} is a {tensor.layout} tensor: collectives carry dense tensors; "
                              f"call .to_dense() first")
    if tensor.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        hint = " (view a complex tensor with torch.view_as_real)" if tensor.is_complex() else ""
        raise CollectiveError(f"{what} has dtype {tensor.dtype}, which a SUM collective cannot carry; "
                              f"use one of {names}{hint}")
    return tensor


def _tensor_first(tensor, what):
    """Outside a process group, a bad tensor is named before the missing group (it is the first thing to
    fix); inside one, every rank's check happens in _agree so that all ranks stop together."""
    if not (dist.is_available() and dist.is_initialized()):
        _check_tensor(tensor, what)


def process_group():
    """(rank, world_size) of the default process group; CollectiveError when there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        raise CollectiveError(
            "no process group: a collective needs the ranks to have joined one. Call it inside a function "
            "run by ortlab.distributed.launch(fn, world_size=2), or call dist.init_process_group first")
    return dist.get_rank(), dist.get_world_size()


def _exchange(send, recv, to, source, trace):
    """Send `send` to rank `to` while receiving `recv` from rank `source` (isend + recv, then wait)."""
    request = dist.isend(send.contiguous(), to)
    dist.recv(recv, source)
    request.wait()
    trace.count(send)


# ---------------------------------------------------------------------------------------------
# Agreement: every rank describes its input in one small row, the rows go around the ring once, and every
# rank checks them all, so a mismatch ends in the same CollectiveError on every rank instead of a recv of
# the wrong size (gloo aborts the process) or a rank left waiting. Mirrors what torch's DDP does before its
# first broadcast (torch/csrc/distributed/c10d/comm.cpp verify_params_across_processes).

BAD_INPUT = -2  # a rank's row when its own input failed a local check


def _describe(tensor):
    """[dtype index, numel, ndim, shape (first MAX_DIMS dims, -1 padded)]: one rank's input as a row."""
    row = [SUPPORTED_DTYPES.index(tensor.dtype), tensor.numel(), tensor.dim(), *tensor.shape[:MAX_DIMS]]
    return row + [-1] * (MAX_DIMS + 3 - len(row))


def _shape_text(row):
    """'(10,) float32' from a row of _describe."""
    shape = tuple(row[3:3 + row[2]]) if row[2] <= MAX_DIMS else f"{row[2]}-d, {row[1]} elements"
    return f"{shape} {str(SUPPORTED_DTYPES[row[0]]).replace('torch.', '')}"


def _gather_rows(row, rank, world, trace):
    """Every rank's row (MAX_DIMS + 3 int64), gathered around the ring: N-1 messages of 88 bytes, counted
    in trace.meta_bytes_sent, never in bytes_sent."""
    table = torch.full((world, MAX_DIMS + 3), -1, dtype=torch.int64)
    table[rank] = torch.tensor(row, dtype=torch.int64)
    _all_gather_phase(list(table), [[r] for r in range(world)], rank, world, _NoTrace(values=False),
                      lambda i: [i])
    trace.meta_bytes_sent += (world - 1) * table[0].numel() * table[0].element_size()
    return [r.tolist() for r in table]


def _agree(name, check, rank, world, trace):
    """Run this rank's local `check` (returns its row or raises CollectiveError), share the rows, and
    raise on every rank when any rank's input was bad. Returns every rank's row."""
    try:
        row, problem = check(), None
    except CollectiveError as exc:
        row, problem = [BAD_INPUT] + [-1] * (MAX_DIMS + 2), exc
    rows = _gather_rows(row, rank, world, trace)
    if problem is not None:
        raise problem
    bad = [r for r, other in enumerate(rows) if other[0] == BAD_INPUT]
    if bad:
        raise CollectiveError(f"{name}: rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} got an "
                              f"input it cannot use (its own error says what), so no rank sends anything")
    return rows


def _same_on_every_rank(name, rows, what="tensor"):
    """CollectiveError naming each rank's shape when the ranks' inputs differ in shape or dtype."""
    if any(row != rows[0] for row in rows):
        found = "; ".join(f"rank {r}: {_shape_text(row)}" for r, row in enumerate(rows))
        odd = [r for r, row in enumerate(rows) if row != rows[0]]
        who = f"rank {odd[0]} differs" if len(odd) == 1 else f"ranks {', '.join(map(str, odd))} differ"
        raise CollectiveError(f"{name} needs the same {what} shape and dtype on every rank; got {found} "
                              f"({who} from rank 0). Give every rank a {what} of the same shape and dtype")


# ---------------------------------------------------------------------------------------------
# The two ring phases, shared by all-reduce, reduce-scatter and all-gather.


def _reduce_scatter_phase(chunks, origins, rank, world, trace):
    """N-1 ring steps; afterwards chunk `rank` holds the sum of every rank's chunk `rank`."""
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_index, recv_index = (rank - step - 1) % world, (rank - step - 2) % world
        incoming = torch.empty_like(chunks[recv_index])
        _exchange(chunks[send_index], incoming, right, left, trace)
        chunks[recv_index].add_(incoming)
        # the left neighbour's chunk sums its own data and what it received in the steps before
        senders = {(rank - 1 - j) % world for j in range(step + 1)}
        origins[recv_index] = sorted(set(origins[recv_index]) | senders)
        trace.snapshot("reduce-scatter", chunks, origins, sent=[send_index, right],
                       received=[recv_index, left])


def _all_gather_phase(chunks, origins, rank, world, trace, complete):
    """N-1 ring steps; afterwards every rank holds every rank's finished chunk.

    `complete(i)` is what chunk i holds once finished (all ranks after a reduce-scatter, rank i alone
    in a plain all-gather)."""
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_index, recv_index = (rank - step) % world, (rank - step - 1) % world
        _exchange(chunks[send_index], chunks[recv_index], right, left, trace)
        origins[recv_index] = complete(recv_index)
        trace.snapshot("all-gather", chunks, origins, sent=[send_index, right], received=[recv_index, left])


# ---------------------------------------------------------------------------------------------
# The collectives.


def ring_all_reduce(tensor, trace=None):
    """All-reduce (SUM) `tensor` in place with NCCL's ring: reduce-scatter then all-gather. Returns it.

    Any size: the flat tensor is cut into world_size chunks, uneven when it does not divide. Each rank
    sends 2(N-1) chunks, 2(N-1)/N of the tensor (`bytes_sent`). Mirrors nccl/src/device/all_reduce.h
    (runRing). First the ranks' shapes and dtypes go once around the ring (88 bytes a message, counted in
    `meta_bytes_sent` only): a rank whose tensor differs is named on every rank, before any payload moves.
    """
    _tensor_first(tensor, "tensor")
    rank, world = process_group()
    trace = _start(trace, "ring all-reduce", rank, world)
    rows = _agree("ring_all_reduce", lambda: _describe(_check_tensor(tensor, "tensor")), rank, world, trace)
    _same_on_every_rank("ring_all_reduce", rows)
    flat = tensor.detach().reshape(-1).clone()
    chunks = list(torch.tensor_split(flat, world))
    origins = [[rank] for _ in range(world)]
    trace.snapshot("start", chunks, origins)
    _reduce_scatter_phase(chunks, origins, rank, world, trace)
    _all_gather_phase(chunks, origins, rank, world, trace, lambda i: list(range(world)))
    with torch.no_grad():
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def _split_rows(tensor, world, what):
    if tensor.dim() == 0 or tensor.shape[0] % world:
        size = "a 0-d tensor" if tensor.dim() == 0 else f"dim 0 of size {tensor.shape[0]}"
        raise CollectiveError(
            f"{what} has {size}, which does not divide into {world} equal chunks (one per rank), as "
            f"reduce_scatter_tensor needs; pad dim 0 to a multiple of {world}, or use ring_all_reduce, "
            f"which accepts any size")
    return list(torch.tensor_split(tensor, world, dim=0))


def ring_reduce_scatter(tensor, trace=None):
    """Reduce-scatter (SUM) with the ring: returns this rank's chunk of the sum (dim 0 cut in N).

    Like dist.reduce_scatter_tensor(output, tensor): dim 0 must divide by world_size. Each rank sends N-1
    chunks, (N-1)/N of the tensor. Mirrors nccl/src/device/reduce_scatter.h (runRing). The ranks' shapes
    are compared first, as in ring_all_reduce (counted in `meta_bytes_sent` only).
    """
    _tensor_first(tensor, "tensor")
    rank, world = process_group()
    trace = _start(trace, "ring reduce-scatter", rank, world)

    def check():
        _split_rows(_check_tensor(tensor, "tensor"), world, "tensor")
        return _describe(tensor)

    _same_on_every_rank("ring_reduce_scatter", _agree("ring_reduce_scatter", check, rank, world, trace))
    chunks = _split_rows(tensor.detach().clone(memory_format=torch.contiguous_format), world, "tensor")
    origins = [[rank] for _ in range(world)]
    trace.snapshot("start", chunks, origins)
    _reduce_scatter_phase(chunks, origins, rank, world, trace)
    return chunks[rank].clone()


def _row_shapes(chunk, rank, world, trace):
    """Every rank's chunk shape, gathered around the ring; CollectiveError (on every rank) if they clash."""
    def check():
        _check_tensor(chunk, "chunk")
        if chunk.dim() > MAX_DIMS or chunk.dim() == 0:
            raise CollectiveError(f"chunk must have 1 to {MAX_DIMS} dims, got shape {tuple(chunk.shape)}; "
                                  f"use chunk.reshape(1) for a number")
        return _describe(chunk)

    rows = _agree("ring_all_gather", check, rank, world, trace)
    shapes = [tuple(row[3:3 + row[2]]) for row in rows]
    if len({row[0] for row in rows}) > 1 or len({s[1:] for s in shapes}) > 1:
        found = ", ".join(f"rank {r}: {_shape_text(row)}" for r, row in enumerate(rows))
        raise CollectiveError(f"the ranks' chunks must share dtype and every dim but the first to be "
                              f"gathered along dim 0; got {found}")
    return shapes


def ring_all_gather(chunk, trace=None):
    """All-gather with the ring: every rank's `chunk` concatenated along dim 0 in rank order.

    Like dist.all_gather_into_tensor, but the chunks may differ in dim 0 (their shapes go around the ring
    first, counted in meta_bytes_sent, not in bytes_sent). Each rank sends N-1 chunks. Mirrors
    nccl/src/device/all_gather.h.
    """
    _tensor_first(chunk, "chunk")
    rank, world = process_group()
    trace = _start(trace, "ring all-gather", rank, world)
    shapes = _row_shapes(chunk, rank, world, trace)
    chunks = [chunk.detach().clone() if r == rank else torch.zeros(shape, dtype=chunk.dtype)
              for r, shape in enumerate(shapes)]
    origins = [[rank] if r == rank else [] for r in range(world)]
    trace.snapshot("start", chunks, origins)
    _all_gather_phase(chunks, origins, rank, world, trace, lambda i: [i])
    return torch.cat(chunks, dim=0)


def _check_chunks(chunks, world):
    if not isinstance(chunks, (list, tuple)):
        raise CollectiveError(f"chunks must be a list of {world} tensors (chunk j goes to rank j), "
                              f"got {type(chunks).__name__}")
    if len(chunks) != world:
        raise CollectiveError(f"chunks must hold one tensor per rank ({world}), got {len(chunks)}")
    for j, chunk in enumerate(chunks):
        _check_tensor(chunk, f"chunks[{j}]")
        if chunk.dim() > MAX_DIMS:
            raise CollectiveError(f"chunks[{j}] has {chunk.dim()} dims; at most {MAX_DIMS} are supported")
    if len({c.dtype for c in chunks}) > 1:
        raise CollectiveError(f"chunks must share one dtype, got {sorted({str(c.dtype) for c in chunks})}")
    return list(chunks)


def _shape_message(chunk):
    message = torch.full((MAX_DIMS + 1,), -1, dtype=torch.int64)
    message[:chunk.dim() + 1] = torch.tensor([chunk.dim(), *chunk.shape])
    return message


def all_to_all(chunks, trace=None):
    """All-to-all from pairwise exchanges: rank r sends chunks[j] to rank j; returns the list received
    (element j from rank j).

    N-1 steps; at step s rank r sends to r+s and receives from r-s (each pair talks once). Chunks may have
    any sizes (MoE's uneven splits, zero included): each step first sends the chunk's shape (and the ranks'
    dtypes are compared once before; both counted in meta_bytes_sent). Mirrors the
    send/recv loop NCCL uses for all-to-all (torch/csrc/cuda/nccl.cpp all2all_single_unequal_split).
    """
    rank, world = process_group()
    trace = _start(trace, "all-to-all", rank, world)
    rows = _agree("all_to_all", lambda: _describe(_check_chunks(chunks, world)[0]), rank, world, trace)
    if len({row[0] for row in rows}) > 1:
        found = ", ".join(f"rank {r}: {str(SUPPORTED_DTYPES[row[0]]).replace('torch.', '')}"
                          for r, row in enumerate(rows))
        raise CollectiveError(f"all_to_all needs one dtype on every rank (a chunk is received into a "
                              f"buffer of the receiver's dtype); got {found}")
    chunks = list(chunks)
    slots = [c.detach().clone() for c in chunks]
    origins = [[rank] for _ in range(world)]
    trace.snapshot("start", slots, origins)
    for step in range(1, world):
        to, source = (rank + step) % world, (rank - step) % world
        shape = torch.empty(MAX_DIMS + 1, dtype=torch.int64)
        _exchange(_shape_message(chunks[to]), shape, to, source, _NoTrace(values=False))
        trace.meta_bytes_sent += shape.numel() * shape.element_size()
        ndim = int(shape[0])
        incoming = torch.empty(shape[1:1 + ndim].tolist(), dtype=chunks[0].dtype)
        _exchange(chunks[to], incoming, to, source, trace)
        slots[source], origins[source] = incoming, [source]
        trace.snapshot("exchange", slots, origins, sent=[to, to], received=[source, source])
    return slots


# ---------------------------------------------------------------------------------------------
# Bytes per rank, the formulas.


def ring_bytes_per_rank(collective, nbytes, world_size):
    """Bytes each rank sends in a ring collective on a tensor of `nbytes` (the input of all-reduce and
    reduce-scatter, the output of all-gather), when it divides evenly: the textbook volumes.

    all-reduce 2(N-1)/N * nbytes; reduce-scatter and all-gather (N-1)/N * nbytes.
    """
    factors = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
    if not isinstance(collective, str) or collective not in factors:
        raise CollectiveError(f"collective must be one of {sorted(factors)}, got {collective!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not 0 <= nbytes < 2.0 ** 63:
        raise CollectiveError(f"nbytes must be a non-negative, finite number of bytes below 2**63 "
                              f"(tensor.numel() * tensor.element_size()), got {nbytes!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or not 1 <= world_size < 2 ** 31:
        raise CollectiveError(f"world_size must be a positive int (the number of ranks, an int32 in NCCL and "
                              f"gloo), got {world_size!r}")
    return factors[collective] * (world_size - 1) * nbytes / world_size


# ---------------------------------------------------------------------------------------------
# Pictures and text.


def _trace_name(snapshots_per_rank):
    """The collective's name from the first rank's trace (None for bare lists of snapshots)."""
    first = snapshots_per_rank[0]
    return first.name if isinstance(first, CollectiveTrace) else (
        first.get("name") if isinstance(first, dict) else None)


def _snapshot_lists(snapshots_per_rank):
    """Each rank's list of snapshots, from traces, trace dicts or lists of snapshots; checked."""
    if not isinstance(snapshots_per_rank, (list, tuple)) or not snapshots_per_rank:
        raise CollectiveError("snapshots_per_rank must be a non-empty list with one entry per rank "
                              "(a CollectiveTrace, its as_dict(), or its list of snapshots)")
    lists = []
    for rank, entry in enumerate(snapshots_per_rank):
        if isinstance(entry, CollectiveTrace):
            entry = entry.snapshots
        elif isinstance(entry, dict):
            entry = entry.get("snapshots")
        if not isinstance(entry, (list, tuple)) or not entry or not all(
                isinstance(s, dict) and "origins" in s and "sizes" in s for s in entry):
            raise CollectiveError(f"snapshots_per_rank[{rank}] is not a trace: pass what a mirror recorded "
                                  f"with trace=CollectiveTrace() (its as_dict() from a rank function)")
        lists.append(list(entry))
    if len({len(s) for s in lists}) > 1:
        raise CollectiveError(f"the ranks recorded different numbers of steps {[len(s) for s in lists]}: "
                              f"pass the traces of one collective, one per rank")
    return lists


def origin_label(origins, world_size):
    """How a chunk is named in pictures: '0+2' for a partial sum, 'Σ' for the full sum, '-' for empty."""
    if not origins:
        return "-"
    if len(origins) == world_size and world_size > 1 and len(origins) > 1:
        return "Σ"
    return "+".join(str(o) for o in origins)


def origin_colour(origins, world_size):
    """An RGB colour for a chunk: each rank its own colour, a partial sum their mix, the full sum grey."""
    import matplotlib  # heavy: matplotlib

    palette = matplotlib.colormaps["tab10"]
    if not origins:
        return (1.0, 1.0, 1.0)
    if len(origins) == world_size and world_size > 1:
        return (0.35, 0.35, 0.35)
    rgb = [palette(o % 10)[:3] for o in origins]
    return tuple(sum(c[i] for c in rgb) / len(rgb) for i in range(3))


def _step_title(snapshot):
    if snapshot["phase"] == "start":
        return "start"
    return f"{snapshot['step']}: {snapshot['phase']}"


def format_collective(snapshots_per_rank, title=None):
    """The text form of a collective: for every step, what each rank holds ('0+1' sums, 'Σ' all ranks).

    `<` marks the chunk received in that step, with the peer it came from.
    """
    lists = _snapshot_lists(snapshots_per_rank)
    world = len(lists)
    title = title or _trace_name(snapshots_per_rank)
    lines = [title] if title else []
    for step in range(len(lists[0])):
        lines.append(f"step {_step_title(lists[0][step])}")
        for rank, snapshots in enumerate(lists):
            snap = snapshots[step]
            cells = []
            for index, (origins, size) in enumerate(zip(snap["origins"], snap["sizes"])):
                mark = "<" if snap["received"] and snap["received"][0] == index else " "
                cells.append(f"{origin_label(origins, world):>5}{mark}({size})")
            note = f"  from rank {snap['received'][1]}" if snap["received"] else ""
            lines.append(f"  rank {rank}: [" + " | ".join(cells) + "]" + note)
    return "\n".join(lines)


def plot_collective(snapshots_per_rank, title=None):
    """A grid of what every rank holds (rows) after every step (columns), chunks coloured by origin.

    Each chunk is a box as wide as its size, coloured by the ranks whose data it sums (grey: all of them),
    labelled '0+1' or 'Σ'; the chunk received in that step has a thick edge. Returns the figure.
    """
    import matplotlib.pyplot as plt  # heavy: matplotlib
    from matplotlib.patches import Rectangle  # heavy: matplotlib

    lists = _snapshot_lists(snapshots_per_rank)
    world, steps = len(lists), len(lists[0])
    fig, axes = plt.subplots(world, steps, figsize=(1.9 * steps + 0.6, 0.8 * world + 0.8), squeeze=False)
    for rank, snapshots in enumerate(lists):
        for step, snap in enumerate(snapshots):
            ax = axes[rank][step]
            total = max(sum(snap["sizes"]), 1)
            left = 0.0
            for index, (origins, size) in enumerate(zip(snap["origins"], snap["sizes"])):
                width = size / total
                received = bool(snap["received"]) and snap["received"][0] == index
                ax.add_patch(Rectangle((left, 0), width, 1, facecolor=origin_colour(origins, world),
                                       edgecolor="black", linewidth=2.5 if received else 0.6))
                if width > 0:
                    ax.text(left + width / 2, 0.5, origin_label(origins, world), ha="center", va="center",
                            fontsize=8, color="white" if origins else "black")
                left += width
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_xticks([])
            ax.set_yticks([])
            if rank == 0:
                ax.set_title(_step_title(snap), fontsize=8)
            if step == 0:
                ax.set_ylabel(f"rank {rank}", fontsize=8)
    fig.suptitle(title or _trace_name(snapshots_per_rank) or "collective", fontsize=10)
    fig.tight_layout()
    return fig
