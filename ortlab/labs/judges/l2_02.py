"""The checks of L2_02's exercises (run where the learner's code cannot reach them).

Both read ortlab.memory.plan of buffers_model(): the mirror of ORT's allocation planner
(onnxruntime/core/framework/allocation_planner.cc) and memory pattern (mem_pattern_planner.h). Its block
is ORT's own first arena request for the same model (tests/labs/test_exercise_facts_l2_02.py).
"""
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l2_02 import ROWS, buffers_model, predicted_buffers, predicted_bytes
from ortlab.memory import plan
from ortlab.memory.allocation_planner import K_REUSE


def _plan(rows=4):
    return plan(buffers_model(), {"x": (rows, 3)})


def _node_outputs(p):
    return [(pc, node, out.name) for pc, node in enumerate(p.order) for out in node.outputs if out.exists()]


def _freed_before(p, pc, shape):
    """The buffers (owner names) of planned shape `shape` that are free when the node at `pc` runs, newest
    first: the freelist as the planner sees it, two freed by one node the later input first."""
    owner, last = {v.name: (v.reuses or v.name) for v in p.values}, {}
    for v in p.values:
        if v.kind in ("kAllocate", K_REUSE) and v.defined_at is not None and v.defined_at < pc:
            last[owner[v.name]] = max(last.get(owner[v.name], -1), v.last_use if v.last_use is not None else -1)
    free = [b for b, end in last.items() if end < pc and list(p.value(b).shape) == list(shape)]
    return sorted(free, key=lambda b: (-last[b], -_input_slot(p, last[b], b)))


def _input_slot(p, pc, buffer):
    """The input slot through which the node at `pc` last reads a value living in `buffer` (-1: none)."""
    node = p.order[pc]
    slots = [i for i, a in enumerate(node.inputs) if a.exists() and (p.value(a.name).reuses or a.name) == buffer]
    return max(slots, default=-1)


def buffer_of(remote, fn):
    got = remote.call(predicted_buffers, fn)
    p = _plan()
    outputs = _node_outputs(p)
    names = [name for _, _, name in outputs]
    unknown = sorted(set(got) - set(names))
    if unknown:
        raise CheckFailed(f"{unknown[0]!r} is not a node output of buffers_model(); give one entry for each of "
                          f"{', '.join(names)}")
    for pc, node, name in outputs:
        v = p.value(name)
        truth = v.reuses if v.kind == K_REUSE else None
        if name not in got:
            raise CheckFailed(f"{name!r} is missing: give every node output, None for a buffer of its own")
        said = got[name]
        if said == truth:
            continue
        where = f"{name!r} (made by {node.name}, {node.op_type}, at pc {pc})"
        if v.kind == "kAllocateOutput":
            raise CheckFailed(f"{where} is a graph output: kAllocateOutput, never reused (the caller keeps it), "
                              "so None")
        if said is not None and said in names and p.value(said).kind == K_REUSE:
            raise CheckFailed(f"{where}: you said {said!r}, but {said} itself lives in {p.value(said).reuses}'s "
                              "buffer; name the value that owns the buffer (the first of the chain)")
        if truth is None:
            if said in [a.name for a in node.inputs]:
                readers = [pc2 for pc2, n in enumerate(p.order) if pc2 > pc and said in [a.name for a in n.inputs]]
                if readers:
                    raise CheckFailed(f"{where}: {said!r} is read again at pc {readers[0]}, so {node.op_type} may "
                                      "not write over it in place: a buffer of its own (None)")
            if said is not None and said in names:
                mine, theirs = p.value(name).shape, p.value(said).shape
                if list(mine) != list(theirs):
                    raise CheckFailed(f"{where}: {said}'s buffer is free, the same bytes, but its planned shape "
                                      f"is {list(theirs)}, not {list(mine)}: the freelist takes only the same "
                                      "symbolic shape, so a buffer of its own (None)")
            raise CheckFailed(f"{where}: it gets a buffer of its own (None): no input it may write over, no free "
                              f"buffer of its shape; you said {said!r}")
        if v.inplace:
            raise CheckFailed(f"{where} is written in place over {truth}'s buffer: {node.op_type} declares "
                              f"{'Alias' if node.op_type == 'Reshape' else 'MayInplace'}(0, 0) and this is "
                              "its input's last read")
        free = _freed_before(p, pc, v.shape)
        raise CheckFailed(f"{where} takes {truth}'s buffer from the freelist; you said {said!r}. The buffers "
                          f"of its shape free at pc {pc}, most recently freed first: {', '.join(free) or '-'} "
                          "(two freed by one node: the later input's first)")
    return None


def block_bytes(remote, fn):
    got = remote.call(predicted_bytes, fn)
    p = _plan(ROWS)
    truth = p.peak_bytes
    if got == truth:
        return None
    planned = [v for v in p.values if v.planned]
    own = sum(v.size for v in planned)
    raw = ROWS * 3 * 4
    if got == own:
        raise CheckFailed(f"{got:,} is every planned buffer's bytes added up; the pattern lets buffers whose "
                          "program-counter intervals do not overlap share bytes (look at the 'buffer pcs' column)")
    if got % 256 or got == truth // planned[0].size * raw:
        raise CheckFailed(f"{got:,} is not what ORT asks for: each tensor's bytes are rounded up to a multiple "
                          f"of 256 ({raw:,} -> {-(-raw // 256) * 256:,}) before it is placed")
    if got > truth and (got - truth) % planned[0].size == 0:
        raise CheckFailed(f"{got:,} counts buffers outside the pattern: the graph input (the caller's) and the "
                          "graph output (allocated at run time) are not in the block, nor are values that "
                          "live in another value's buffer")
    raise CheckFailed(f"{got:,} bytes is not the block; find the program counter where the most buffers of "
                      "their own are held (their 'buffer pcs' intervals), each 256-rounded")
