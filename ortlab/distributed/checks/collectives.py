"""The ring collectives checked across ranks: the rank functions a launch runs (each collective against
torch.distributed's own, hostile inputs refused alike on every rank) and the table of their results. Used by
L2_03 and the tests; the collectives themselves are ortlab/distributed/collectives.py.
"""
import torch
import torch.distributed as dist

from ortlab.distributed.collectives import (all_to_all, CollectiveError, CollectiveTrace, ring_all_gather,
                                            ring_all_reduce, ring_bytes_per_rank, ring_reduce_scatter)
from ortlab.viz import Table


# ---------------------------------------------------------------------------------------------
# Rank functions.

GLOO_ALTERNATIVES = {
    "all_reduce(op=ReduceOp.AVG)": "all_reduce with ReduceOp.SUM, then divide by the world size",
    "reduce_scatter (list form)": "reduce_scatter_tensor (one flat input, dim 0 cut per rank)",
    "all_to_all (list form)": "all_to_all_single (one tensor, with input/output split sizes)",
}


def _first_line(exc):
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def error_texts(cases, catch, describe=str):
    """Run each of {name: call} on every rank; {name: describe(error)} for the `catch` errors each
    raises ('no error' for a call that works), after a barrier, so no rank leaves while another is
    still inside a collective."""
    found = {}
    for name, call in cases.items():
        try:
            call()
            # gloo may report a call's error from its worker thread after the call returned (seen under load:
            # AVG's refusal surfaced at the next wait); a barrier here keeps it with the call that caused it
            dist.barrier()
            found[name] = "no error"
        except catch as exc:
            found[name] = describe(exc)
    try:
        dist.barrier()
    except catch:  # gloo reporting an error already recorded above once more, late (seen once, under load)
        pass
    return found


def gloo_capability_errors(rank, world_size):
    """Rank function: try the three collectives gloo does not implement; return {call: error text}.

    The texts teach backend capabilities (NCCL has all three); GLOO_ALTERNATIVES says what to use.
    A call that unexpectedly works is reported as 'no error'. Each rank tries them in a gloo group of
    its own (one member), so a refusal gloo reports late, from its worker thread, can only reach the
    rank that made the call: tried in the shared group, a late refusal on one rank and an early one on
    the other left the ranks' barriers out of step, and one rank waited forever (seen once, under load).
    """
    own = [dist.new_group([r], backend="gloo") for r in range(world_size)][rank]  # every rank makes every group
    calls = {
        "all_reduce(op=ReduceOp.AVG)": lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.AVG, group=own),
        "reduce_scatter (list form)": lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2)], group=own),
        "all_to_all (list form)": lambda: dist.all_to_all([torch.empty(2)], [torch.ones(2)], group=own),
    }
    found = {}
    for name, call in calls.items():
        try:
            call()
            dist.barrier(group=own)  # a late refusal surfaces here, still on this rank and this call
            found[name] = "no error"
        except RuntimeError as exc:
            found[name] = _first_line(exc)
    return found


def example_tensor(rank, shape, seed=0):
    """Rank `rank`'s input for the checks: standard normal numbers from a generator seeded by rank."""
    generator = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randn(tuple(shape), generator=generator)


def all_to_all_splits(world_size):
    """Rows rank r sends to rank j in the all-to-all check: (r + 2j) % 4, uneven, zero included."""
    return [[(r + 2 * j) % 4 for j in range(world_size)] for r in range(world_size)]


def all_to_all_input(rank, world_size, cols=3, seed=0):
    """Rank `rank`'s all-to-all chunks (chunk j for rank j), with all_to_all_splits rows each."""
    splits = all_to_all_splits(world_size)[rank]
    return list(torch.split(example_tensor(rank, (sum(splits), cols), seed + 7), splits))


def _hostile(rank, world_size):
    """Bad input inside a process group: the error each mirror raises (same on every rank)."""
    cases = {
        "reduce_scatter not divisible": lambda: ring_reduce_scatter(torch.ones(world_size + 1)),
        "all_gather shapes differ": lambda: ring_all_gather(torch.ones(2, 2 + rank)),
        "all_to_all wrong count": lambda: all_to_all([torch.ones(1)] * (world_size + 1)),
        "all_reduce bool": lambda: ring_all_reduce(torch.ones(3, dtype=torch.bool)),
    }
    return error_texts(cases, CollectiveError)


def _all_reduce_pair(rank, world_size, numel, seed):
    data = example_tensor(rank, (numel,), seed)
    trace = CollectiveTrace()
    mirror = ring_all_reduce(data.clone(), trace=trace)
    stock = data.clone()
    dist.all_reduce(stock)
    return {"input": data, "mirror": mirror, "stock": stock, "trace": trace.as_dict()}


def _reduce_scatter_pair(rank, world_size, rows, cols, seed):
    data = example_tensor(rank, (cols, world_size * rows), seed + 1).t()  # not contiguous, on purpose
    trace = CollectiveTrace()
    mirror = ring_reduce_scatter(data, trace=trace)
    stock = torch.empty(rows, cols)
    dist.reduce_scatter_tensor(stock, data.contiguous())
    return {"input": data, "mirror": mirror, "stock": stock, "trace": trace.as_dict()}


def _all_gather_pair(rank, world_size, rows, cols, seed):
    data = example_tensor(rank, (rows, cols), seed + 2)
    trace = CollectiveTrace()
    mirror = ring_all_gather(data, trace=trace)
    stock = torch.empty(world_size * rows, cols)
    dist.all_gather_into_tensor(stock, data.clone())
    uneven_data = example_tensor(rank, (rank + 1, cols), seed + 3)
    uneven_trace = CollectiveTrace()
    uneven = ring_all_gather(uneven_data, trace=uneven_trace)
    return {"input": data, "mirror": mirror, "stock": stock, "trace": trace.as_dict(),
            "uneven_input": uneven_data, "uneven_mirror": uneven, "uneven_trace": uneven_trace.as_dict()}


def _all_to_all_pair(rank, world_size, cols, seed):
    chunks = all_to_all_input(rank, world_size, cols, seed)
    trace = CollectiveTrace()
    mirror = all_to_all(chunks, trace=trace)
    splits = all_to_all_splits(world_size)
    received = [splits[j][rank] for j in range(world_size)]
    stock = torch.empty(sum(received), cols)
    dist.all_to_all_single(stock, torch.cat(chunks), output_split_sizes=received,
                           input_split_sizes=splits[rank])
    return {"input": chunks, "mirror": mirror, "stock": list(torch.split(stock, received)),
            "trace": trace.as_dict()}


def collectives_check(rank, world_size, numel=10, rows=2, cols=3, seed=0, errors=True):
    """Rank function: every mirror next to the stock collective on the same data, for one launch.

    Returns {'all_reduce', 'reduce_scatter', 'all_gather', 'all_to_all': {input, mirror, stock, trace}
    (all_gather also with uneven chunks, mirror only), 'hostile': {case: error text}, and, when `errors`,
    'gloo_errors': gloo_capability_errors' texts}. Inputs come from example_tensor, so the caller can
    rebuild every rank's data and compute the one-process answer.
    """
    result = {"rank": rank, "world_size": world_size,
              "all_reduce": _all_reduce_pair(rank, world_size, numel, seed),
              "all_reduce_even": _all_reduce_pair(rank, world_size, world_size * 4, seed + 11),
              "reduce_scatter": _reduce_scatter_pair(rank, world_size, rows, cols, seed),
              "all_gather": _all_gather_pair(rank, world_size, rows, cols, seed),
              "all_to_all": _all_to_all_pair(rank, world_size, cols, seed),
              "hostile": _hostile(rank, world_size)}
    if errors:
        result["gloo_errors"] = gloo_capability_errors(rank, world_size)
    return result


# ---------------------------------------------------------------------------------------------
# The launch's results as one table.


def _largest(pairs):
    """max |a - b| over (a, b) pairs of tensors or of lists of tensors."""
    worst = 0.0
    for a, b in pairs:
        a, b = (a, b) if isinstance(a, (list, tuple)) else ([a], [b])
        for x, y in zip(a, b):
            if x.numel():
                worst = max(worst, float((x - y).abs().max()))
    return worst


def _gap(value):
    """A difference as printed in tables: 0 when exact, else one significant digit."""
    return "0" if value == 0 else f"{value:.0e}"


def _one_process_answers(results):
    """What one process computes from every rank's inputs, per rank, for each collective."""
    world = len(results)
    total = sum(r["all_reduce"]["input"] for r in results)
    rs_total = sum(r["reduce_scatter"]["input"] for r in results)
    rows = rs_total.shape[0] // world
    gathered = torch.cat([r["all_gather"]["input"] for r in results])
    return {"all_reduce": [total] * world,
            "reduce_scatter": [rs_total[i * rows:(i + 1) * rows] for i in range(world)],
            "all_gather": [gathered] * world,
            "all_to_all": [[results[j]["all_to_all"]["input"][i] for j in range(world)] for i in range(world)]}


def check_table(results):
    """A Table from collectives_check's results (one per rank): for each collective, the mirror's
    largest difference from the stock op and from one process's answer, and the bytes each rank sent
    against ring_bytes_per_rank's formula."""
    if not isinstance(results, (list, tuple)) or not results or not all(isinstance(r, dict) for r in results):
        raise CollectiveError("check_table takes the list launch(collectives_check, N) returned")
    world, answers, rows = len(results), _one_process_answers(results), []
    for op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        mirrors = [r[op]["mirror"] for r in results]
        vs_stock = _largest((m, r[op]["stock"]) for m, r in zip(mirrors, results))
        vs_one = _largest(zip(mirrors, answers[op]))
        sent = sorted({r[op]["trace"]["bytes_sent"] for r in results})
        size = {"all_reduce": results[0][op]["input"], "reduce_scatter": results[0][op]["input"],
                "all_gather": results[0][op]["stock"]}.get(op)
        formula = "" if size is None else f"{ring_bytes_per_rank(op, size.numel() * size.element_size(), world):g}"
        rows.append((op, _gap(vs_stock), _gap(vs_one), "/".join(map(str, sent)), formula))
    return Table(("collective", "mirror vs stock", "mirror vs one process", "bytes sent per rank",
                  "ring formula"), rows)
