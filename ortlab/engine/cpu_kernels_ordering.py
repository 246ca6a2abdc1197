"""Ordering CPU kernels where ORT 1.19.2 computes differently from onnx.reference (TopK, ArgMax/ArgMin,
ReduceMax/ReduceMin with ties, NaN and signed zeros), and ORT_VS_SPEC: every place where ORT's CPU
kernels contradict the ONNX spec or leave open what the spec leaves open, one row each, shown by L0_04
and pinned by tests/engine/test_engine_special_values.py.
"""
import numpy as np

from ortlab.engine.cpu_execution_provider import ReferenceKernel
from ortlab.engine.errors import KernelFailure
from ortlab.engine.kernel_registry import CPU, register_op_kernel
from ortlab.engine.cpu_kernels import is_custom_dtype


# --- ORT against the ONNX spec ----------------------------------------------------------------
# Where ORT 1.19.2's CPU kernels contradict the ONNX spec (or the spec leaves the result open and
# ORT's answer is not onnx.reference's), the kernels here still compute what ORT computes. One row
# per difference: (op, inputs, what the spec or onnx.reference says, what ORT does, ORT source file).
# tests/engine/test_engine_special_values.py checks each kernel against ORT on such inputs.
ORT_VS_SPEC = [
    ("Cast", "to float8 e4m3fnuz / e5m2fnuz, a negative value that underflows",
     "0 (FNUZ has no negative zero)", "0x80, which is NaN in FNUZ", "include/onnxruntime/core/framework/float8.h"),
    ("TopK", "ties (equal values, 0.0 and -0.0 included)", "the lower index first (spec)",
     "the lower index first; onnx.reference's order among ties is numpy's", "core/providers/cpu/math/top_k.cc"),
    ("TopK", "NaN in the input", "not specified",
     "NaN compares false with everything: where it lands follows ORT's selection (a scan for k=1, a "
     "binary heap for small k, else std::nth_element and std::sort)", "core/providers/cpu/math/top_k.cc"),
    ("TopK", "sorted=0", "the order of the k values is not specified",
     "the heap's or std::nth_element's order, whichever path ORT takes", "core/providers/cpu/math/top_k.cc"),
    ("ArgMax, ArgMin", "NaN in the reduced row", "not specified (numpy: the first NaN)",
     "NaN never wins a comparison: the index of the max/min of the other values, 0 when the row starts "
     "with NaN", "core/providers/cpu/reduction/reduction_ops.h (ReduceAggregatorArgMax, ...LastIndex)"),
    ("ReduceMax, ReduceMin", "NaN in the reduced row", "not specified (numpy: NaN)",
     "Eigen's vectorized std::max/std::min: NaN kept only where it enters first (the first element, or "
     "first in a 4-lane packet when reducing the last axes); otherwise skipped",
     "core/providers/cpu/reduction/reduction_ops.h (ReduceAggregatorMax, FastReduceKR/RK)"),
    ("Relu", "-0.0", "max(0, x): 0.0 (onnx.reference gives 0.0)", "-0.0 (Eigen cwiseMax keeps x when x < 0 is false)",
     "core/providers/cpu/activation/activations.h (Relu)"),
    ("Sqrt", "float32 -0.0, +inf, denormals, in the 4-lane packets (all but the n % 4 last elements)",
     "IEEE sqrt: -0.0, +inf, the denormal's root",
     "Eigen's fast SSE sqrt (rsqrt and one Newton step): +0.0, NaN, 0.0; finite results within 1 ulp of "
     "IEEE (the hardware's rsqrt decides the last bit)", "core/providers/cpu/math/element_wise_ops.cc (Sqrt)"),
    ("Ceil, Floor", "float32/float64 results that are zero, in the SSE packets (all but the n % lanes last)",
     "IEEE: Ceil(-0.5) = -0.0, Floor(-0.0) = -0.0", "+0.0", "core/providers/cpu/math/element_wise_ops.cc"),
    ("PRelu", "NaN or infinite slope", "x where x >= 0", "max(x, 0) + slope * min(x, 0): NaN for x = 2 with slope NaN, "
     "and for x = 0 with slope inf", "core/providers/cpu/math/element_wise_ops.cc (PRelu)"),
    ("OneHot", "an index outside [-depth, depth - 1]; off value -0.0", "not specified (onnx.reference wraps); -0.0",
     "a row of off values; -0.0 kept", "core/providers/cpu/tensor/onehot.cc"),
    ("Erf", "float32 NaN", "NaN", "+1 or -1 (the NaN's sign): MLAS clamps |x| first", "core/mlas/lib/erf.cpp"),
    ("Hardmax", "NaN in a row", "not specified (onnx.reference: 1 at the first NaN)",
     "1 at the first element equal to Eigen's row max: a row whose max is NaN is all zeros",
     "core/providers/cpu/math/hardmax.cc"),
    ("QuantizeLinear", "NaN, +-inf, values past the type's range (int8/uint8)",
     "saturate to the range; NaN not specified",
     "saturates; NaN gives the type's minimum (MLAS AVX-512 / SSE vectors; the SSE scalar tail would "
     "give 0)",
     "core/mlas/lib/quantize.cpp"),
    ("Dropout", "opsets 7 to 11, inference (no training): the mask output", "not specified (the docs say only that Y "
     "copies X in test mode); opset 12 on: all True", "all False (0 in T before opset 10); all True from opset 12",
     "core/providers/cpu/tensor/identity_op.h (IdentityOp<true>)"),
    ("ReduceMean", "an empty reduced set", "not specified (numpy: NaN)", "0",
     "core/providers/cpu/reduction/reduction_ops.h"),
    ("Div, Mod", "integers divided by 0, or the type's minimum by -1", "undefined",
     "the process dies with SIGFPE (the engine refuses with an OrtlabError)",
     "core/providers/cpu/math/element_wise_ops.cc"),
]


# --- TopK -------------------------------------------------------------------------------------
# ORT's TopK orders positions with a comparator on (value, index): `a > b or (a == b and i < j)`
# for the largest (`<` for the smallest). With NaN this is not an order (NaN compares false), so
# where NaN lands follows the algorithm: the functions below repeat ORT's three paths and the
# libstdc++ algorithms it calls, on a Python list of positions.
def _better(values, largest):
    """ORT's GreaterValueCmp / LesserValueCmp over positions into `values` (top_k.cc)."""
    if largest:
        return lambda i, j: values[i] > values[j] or (values[i] == values[j] and i < j)
    return lambda i, j: values[i] < values[j] or (values[i] == values[j] and i < j)


def _heapify(heap, i, k, cmp):
    """top_k.cc HeapifyIthPosition: push heap[i] down while a child beats it (the root is the worst)."""
    while True:
        left, right = 2 * i + 1, 2 * i + 2
        if right < k:
            i_beats_left = cmp(heap[i], heap[left])
            if i_beats_left and cmp(heap[right], heap[left]):
                heap[i], heap[left], i = heap[left], heap[i], left
            elif i_beats_left or cmp(heap[i], heap[right]):
                heap[i], heap[right], i = heap[right], heap[i], right
            else:
                return
        elif left < k and cmp(heap[i], heap[left]):
            heap[i], heap[left], i = heap[left], heap[i], left
        else:
            return


def _topk_heap(values, k, largest, sorted_):
    """top_k.cc's priority-queue path: a k-heap of the first k positions, then each later value
    that beats the root replaces it; popped worst-first into the back when sorted, else heap order."""
    cmp, n = _better(values, largest), len(values)
    heap = [0] * k
    for pos in range(k):
        heap[k - pos - 1] = pos
        _heapify(heap, k - pos - 1, k, cmp)
    strictly = (lambda a, b: a > b) if largest else (lambda a, b: a < b)
    for pos in range(k, n):
        if strictly(values[pos], values[heap[0]]):
            heap[0] = pos
            _heapify(heap, 0, k, cmp)
    if not sorted_:
        return heap
    out = [0] * k
    for taken in range(k):
        out[k - taken - 1] = heap[0]
        heap[0] = heap[k - taken - 1]
        _heapify(heap, 0, k - taken - 1, cmp)
    return out


def _median_to_first(a, result, x, y, z, cmp):
    """libstdc++ std::__move_median_to_first."""
    if cmp(a[x], a[y]):
        pick = y if cmp(a[y], a[z]) else z if cmp(a[x], a[z]) else x
    else:
        pick = x if cmp(a[x], a[z]) else z if cmp(a[y], a[z]) else y
    a[result], a[pick] = a[pick], a[result]


def _partition_pivot(a, first, last, cmp):
    """libstdc++ std::__unguarded_partition_pivot: median of three to `first`, then Hoare partition."""
    _median_to_first(a, first, first + 1, first + (last - first) // 2, last - 1, cmp)
    pivot, lo, hi = a[first], first + 1, last
    while True:
        while cmp(a[lo], pivot):
            lo += 1
        hi -= 1
        while cmp(pivot, a[hi]):
            hi -= 1
        if not lo < hi:
            return lo
        a[lo], a[hi] = a[hi], a[lo]
        lo += 1


def _linear_insert(a, last, cmp, first):
    """libstdc++ std::__unguarded_linear_insert (stopped at `first`, where C++ would read past it)."""
    value, prev = a[last], last - 1
    while prev >= first and cmp(value, a[prev]):
        a[last], last, prev = a[prev], prev, prev - 1
    a[last] = value


def _insertion_sort(a, first, last, cmp):
    """libstdc++ std::__insertion_sort."""
    for i in range(first + 1, last):
        if cmp(a[i], a[first]):
            a[first:i + 1] = [a[i]] + a[first:i]
        else:
            _linear_insert(a, i, cmp, first)


def _adjust_heap(a, first, hole, length, value, cmp):
    """libstdc++ std::__adjust_heap then std::__push_heap (a max-heap under cmp)."""
    top = child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if cmp(a[first + child], a[first + child - 1]):
            child -= 1
        a[first + hole], hole = a[first + child], child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole], hole = a[first + child - 1], child - 1
    parent = (hole - 1) // 2
    while hole > top and cmp(a[first + parent], value):
        a[first + hole], hole = a[first + parent], parent
        parent = (hole - 1) // 2
    a[first + hole] = value


def _pop_heap(a, first, last, result, cmp):
    value, a[result] = a[result], a[first]
    _adjust_heap(a, first, 0, last - first, value, cmp)


def _heap_select(a, first, middle, last, cmp):
    """libstdc++ std::__heap_select: make_heap on [first, middle), then every later element that
    beats the heap's top is popped in."""
    length = middle - first
    for parent in range((length - 2) // 2, -1, -1) if length >= 2 else ():
        _adjust_heap(a, first, parent, length, a[first + parent], cmp)
    for i in range(middle, last):
        if cmp(a[i], a[first]):
            _pop_heap(a, first, middle, i, cmp)


def nth_element(a, nth, cmp):
    """libstdc++ std::nth_element (introselect: median-of-3 partitions, heap select past a depth of
    2*log2(n), insertion sort below 4 elements)."""
    first, last = 0, len(a)
    if nth == last:
        return
    depth = 2 * (last.bit_length() - 1)
    while last - first > 3:
        if depth == 0:
            _heap_select(a, first, nth + 1, last, cmp)
            a[first], a[nth] = a[nth], a[first]
            return
        depth -= 1
        cut = _partition_pivot(a, first, last, cmp)
        first, last = (cut, last) if cut <= nth else (first, cut)
    _insertion_sort(a, first, last, cmp)


def _introsort(a, first, last, depth, cmp):
    while last - first > 16:
        if depth == 0:  # std::partial_sort(first, last, last): heap select, then sort_heap
            _heap_select(a, first, last, last, cmp)
            for end in range(last - 1, first, -1):
                _pop_heap(a, first, end, end, cmp)
            return
        depth -= 1
        cut = _partition_pivot(a, first, last, cmp)
        _introsort(a, cut, last, depth, cmp)
        last = cut


def std_sort(a, first, last, cmp):
    """libstdc++ std::sort: introsort down to 16-element runs, then insertion sort."""
    if last - first < 2:
        return
    _introsort(a, first, last, 2 * ((last - first).bit_length() - 1), cmp)
    if last - first > 16:
        _insertion_sort(a, first, first + 16, cmp)
        for i in range(first + 16, last):
            _linear_insert(a, i, cmp, first)
    else:
        _insertion_sort(a, first, last, cmp)


def topk_positions(values, k, largest=True, sorted_=True):
    """The positions ORT's TopK returns for one slice `values` (a list), in its output order.

    top_k.cc: k == 1 scans, keeping the first strictly better value; k < 4 or
    log2(k) / log2(n) < 0.725 keeps a binary heap; otherwise std::nth_element, then std::sort
    of the first k when sorted."""
    n = len(values)
    if k == 1:
        best, strictly = 0, (lambda a, b: a > b) if largest else (lambda a, b: a < b)
        for pos in range(1, n):
            if strictly(values[pos], values[best]):
                best = pos
        return [best]
    if k < 4 or np.log2(k) / np.log2(n) < 0.725:
        return _topk_heap(values, k, largest, sorted_)
    cmp, order = _better(values, largest), list(range(n))
    nth_element(order, k - 1, cmp)
    if sorted_:
        std_sort(order, 0, k, cmp)
    return order[:k]


def ort_topk(x, k, axis=-1, largest=True, sorted_=True):
    """(values, int64 indices) of ORT's TopK: ties give the lower index first; NaN and sorted=0
    follow ORT's selection path (topk_positions). Without NaN and sorted, a stable sort gives the
    same result, computed vectorized."""
    axis = axis % x.ndim
    moved = np.moveaxis(x, axis, -1)
    if k == 0 or moved.size == 0:
        shape = moved.shape[:-1] + (k,)
        return np.moveaxis(np.empty(shape, x.dtype), -1, axis), np.moveaxis(np.empty(shape, np.int64), -1, axis)
    has_nan = x.dtype.kind == "f" and np.isnan(x).any()
    if sorted_ and not has_nan:
        if largest:  # stable descending: reverse, stable ascending, reverse back
            order = moved.shape[-1] - 1 - np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
        else:
            order = np.argsort(moved, axis=-1, kind="stable")
        index = order[..., :k].astype(np.int64)
    else:
        rows = moved.reshape(-1, moved.shape[-1])
        index = np.array([topk_positions(row.tolist(), k, largest, sorted_) for row in rows], np.int64)
        index = index.reshape(moved.shape[:-1] + (k,))
    values = np.take_along_axis(moved, index, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(index, -1, axis)


@register_op_kernel("TopK", provider=CPU)
class OrtTopK(ReferenceKernel):
    """TopK as ORT: ties give the lower index first, NaN and sorted=0 follow ORT's selection
    (see topk_positions); onnx.reference orders ties by numpy's sort and refuses sorted=0.
    k comes from the input (opset >= 10) or the attribute (opset 1).
    ORT: onnxruntime/core/providers/cpu/math/top_k.cc."""

    def compute(self, ctx):
        attribute, x = self.info.attribute, ctx.input(0)
        if x.dtype.kind not in "biuf" or is_custom_dtype(x.dtype):
            return super().compute(ctx)
        k = int(np.asarray(ctx.input(1)).reshape(-1)[0]) if self.info.node.since_version >= 10 \
            else attribute("k")
        axis = attribute("axis", -1)
        if not -x.ndim <= axis < x.ndim:
            return super().compute(ctx)  # the reference's own refusal
        if k < 0:
            raise KernelFailure(f"value of k must not be negative (k = {k})")
        if x.size == 0 and x.shape[axis] != 0 and int(np.prod(x.shape[:axis % x.ndim])) == 0:
            raise KernelFailure(f"TopK of shape {list(x.shape)} along axis {axis}: no rows before the axis. ORT "
                                "1.19.2's top_k.cc divides the size by the row count (0 / 0) and the process dies "
                                "with SIGFPE; give the input at least one row or skip the node.")
        if k > x.shape[axis]:
            raise KernelFailure(f"k argument [{k}] should not be greater than specified axis dim value "
                                f"[{x.shape[axis]}]")
        return ort_topk(x, k, axis, bool(attribute("largest", 1)), bool(attribute("sorted", 1)))


# --- ArgMax, ArgMin ---------------------------------------------------------------------------
def ort_arg_extreme(x, axis, keepdims=True, largest=True, last=False):
    """ORT's ArgMax/ArgMin: start at the first element, move to a later one only when it compares
    strictly better (better or equal with select_last_index). NaN never compares true: it is
    skipped, and wins only as the first element. ORT: core/providers/cpu/reduction/reduction_ops.h
    (ReduceAggregatorArgMax, ReduceAggregatorArgMaxLastIndex, and the Min ones)."""
    moved = np.moveaxis(x, axis, 0)
    best, arg = moved[0].copy(), np.zeros(moved.shape[1:], np.int64)
    for i in range(1, moved.shape[0]):
        value = moved[i]
        if largest:
            take = value >= best if last else value > best
        else:
            take = value <= best if last else value < best
        best, arg = np.where(take, value, best), np.where(take, np.int64(i), arg)
    return np.expand_dims(arg, axis) if keepdims else arg


class OrtArgExtreme(ReferenceKernel):
    """ArgMax / ArgMin as ORT (see ort_arg_extreme); onnx.reference uses numpy's argmax, which
    returns the first NaN."""

    largest = True

    def compute(self, ctx):
        x, attribute = ctx.input(0), self.info.attribute
        axis = attribute("axis", 0)
        if x.dtype.kind not in "biuf" or is_custom_dtype(x.dtype) or not -x.ndim <= axis < max(x.ndim, 1) \
                or x.ndim == 0 or x.shape[axis] == 0:
            return super().compute(ctx)
        return ort_arg_extreme(x, axis % x.ndim, bool(attribute("keepdims", 1)), self.largest,
                               bool(attribute("select_last_index", 0)))


@register_op_kernel("ArgMax", provider=CPU)
class OrtArgMax(OrtArgExtreme):
    """ArgMax as ORT (ort_arg_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""


@register_op_kernel("ArgMin", provider=CPU)
class OrtArgMin(OrtArgExtreme):
    """ArgMin as ORT (ort_arg_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""

    largest = False


# --- ReduceMax, ReduceMin ---------------------------------------------------------------------
def _pick(largest):
    """std::max / std::min on arrays, as Eigen's pmax/pmin lanes: the second wins only when it
    compares strictly better, so NaN on the right is skipped and NaN on the left stays."""
    if largest:
        return lambda a, b: np.where(a < b, b, a)
    return lambda a, b: np.where(b < a, b, a)


def fold_extreme(moved, largest):
    """Left fold of std::max/min over axis 0 (ORT's update() loops and FastReduceRK)."""
    pick, acc = _pick(largest), moved[0]
    for value in moved[1:]:
        acc = pick(acc, value)
    return acc


def eigen_redux_extreme(rows, start, largest):
    """Eigen's vectorized maxCoeff()/minCoeff() of each row [R, n] whose first element sits at
    element offset `start` in a 16-byte aligned buffer (SSE: 4 float / 2 double lanes): the elements
    before the first aligned one and after the last full packet are folded in after the packets;
    packets run in two accumulators over pairs, merged, then the lanes (0 with 2, 1 with 3), each
    step std::max/min. ORT's aggall: Eigen's redux_impl (LinearVectorizedTraversal), SSE predux_max."""
    pick, lanes, n = _pick(largest), 16 // rows.dtype.itemsize, rows.shape[1]
    head = min((-start) % lanes, n)
    size = (n - head) // lanes * lanes
    if size == 0:
        return fold_extreme(np.moveaxis(rows, 1, 0), largest)
    packet = lambda i: rows[:, i:i + lanes]  # noqa: E731
    acc0 = packet(head)
    if size > lanes:
        acc1 = packet(head + lanes)
        pairs_end = head + size // (2 * lanes) * 2 * lanes
        for i in range(head + 2 * lanes, pairs_end, 2 * lanes):
            acc0, acc1 = pick(acc0, packet(i)), pick(acc1, packet(i + lanes))
        acc0 = pick(acc0, acc1)
        if head + size > pairs_end:
            acc0 = pick(acc0, packet(pairs_end))
    if lanes == 4:
        acc0 = pick(acc0[:, :2], acc0[:, 2:])
    result = pick(acc0[:, 0], acc0[:, 1])
    for i in list(range(head)) + list(range(head + size, n)):
        result = pick(result, rows[:, i])
    return result


def _fast_groups(shape, axes):
    """ORT's fast-reduce shape: [kept?, size] runs of consecutive dims, kept or reduced alike
    (reduction_ops.cc OptimizeShapeForFastReduce; dims of 1 stay)."""
    groups = []
    for d, size in enumerate(shape):
        kept = d not in axes
        if groups and groups[-1][0] == kept:
            groups[-1][1] *= size
        else:
            groups.append([kept, size])
    return groups


def packetwise_extreme(moved, largest):
    """Eigen's packetwise_redux over axis 0 (rowwise().maxCoeff() of a column-major block): the
    first slice, then groups of four combined as (a, b), (c, d), then pairs, then the rest one by one."""
    pick, n = _pick(largest), moved.shape[0]
    acc, i, size4 = moved[0], 1, (n - 1) & ~3
    while i < size4:
        acc = pick(acc, pick(pick(moved[i], moved[i + 1]), pick(moved[i + 2], moved[i + 3])))
        i += 4
    for value in moved[i:]:
        acc = pick(acc, value)
    return acc


def rows_extreme(rows, starts, largest):
    """eigen_redux_extreme of each row [R, n], row r starting at element offset starts[r]."""
    result = np.empty(rows.shape[0], rows.dtype)
    lanes = 16 // rows.dtype.itemsize
    for start in range(lanes):
        chosen = np.flatnonzero(starts % lanes == start)
        if chosen.size:
            result[chosen] = eigen_redux_extreme(rows[chosen], start, largest)
    return result


def _reduce_krk(x3, largest):
    """FastReduceKRK: out[j] (C values at offset j*C) = rowwise extreme of the [C, B] block j;
    the output's full 4-lane (2-lane) packets take packetwise_extreme, the other values a fold."""
    a, _, c = x3.shape
    moved = np.moveaxis(x3, 1, 0)
    packed, folded = packetwise_extreme(moved, largest), fold_extreme(moved, largest)
    lanes = 16 // x3.dtype.itemsize
    head = np.minimum((-(np.arange(a) * c)) % lanes, c)[:, None]
    end = head + (c - head) // lanes * lanes
    col = np.arange(c)[None, :]
    return np.where((col >= head) & (col < end), packed, folded)


def _reduce_rkr(x3, largest):
    """FastReduceRKR: out[d] starts at the block's first element; each of the d0 contiguous runs
    of d2 values is reduced by Eigen's redux, and replaces it when strictly better."""
    d0, d1, d2 = x3.shape
    pick = _pick(largest)
    out = x3[0, :, 0].copy()
    for i in range(d0):
        starts = i * d1 * d2 + np.arange(d1) * d2
        out = pick(out, rows_extreme(x3[i], starts, largest))
    return out


def ort_reduce_extreme(x, axes, keepdims, largest):
    """ORT's ReduceMax/ReduceMin of a float32/float64 tensor over `axes` (sorted, non-negative),
    by ORT's fast-reduce shape (runs of kept / reduced dims merged): all reduced, or the last axes
    (KR), run Eigen's vectorized redux on each contiguous row; KRK with >= 2 outer blocks and RKR
    with >= 2 kept values take _reduce_krk / _reduce_rkr; everything else folds along the
    flattened reduced axes in order (ORT's update() loops and FastReduceRK). NaN follows
    std::max/min: kept where it enters on the left. The KRK/RKR thresholds are ORT's for a thread
    pool of 1 or 2 threads (max(2, threads)).
    ORT: core/providers/cpu/reduction/reduction_ops.cc (CommonFastReduceSwitch, NoTransposeReduce1Loop),
    reduction_ops.h (ReduceAggregatorMax, ReduceAggregatorMin)."""
    groups = _fast_groups(x.shape, axes)
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape)) if keepdims else \
        tuple(n for d, n in enumerate(x.shape) if d not in axes)
    sizes = [size for _, size in groups]
    kinds = "".join("K" if kept else "R" for kept, _ in groups)
    if kinds in ("R", "KR"):
        rows = x.reshape(-1, sizes[-1])
        return rows_extreme(rows, np.arange(rows.shape[0]) * rows.shape[1], largest).reshape(out_shape)
    if kinds == "KRK" and sizes[0] >= 2:
        return _reduce_krk(x.reshape(sizes), largest).reshape(out_shape)
    if kinds == "RKR" and sizes[1] >= 2:
        return _reduce_rkr(x.reshape(sizes), largest).reshape(out_shape)
    kept_axes = [d for d in range(x.ndim) if d not in axes]
    moved = np.transpose(x, list(axes) + kept_axes).reshape((-1,) + tuple(x.shape[d] for d in kept_axes))
    return fold_extreme(moved, largest).reshape(out_shape)


class OrtReduceExtreme(ReferenceKernel):
    """ReduceMax / ReduceMin of float32/float64 holding NaN or -0.0 as ORT (ort_reduce_extreme);
    onnx.reference uses numpy, which returns NaN whenever the row holds one. Other inputs, and
    empty reductions, keep the reference."""

    largest = True

    def compute(self, ctx):
        x, attribute = ctx.input(0), self.info.attribute
        if x.dtype not in (np.float32, np.float64) or x.size == 0 or x.ndim == 0 or \
                not (np.isnan(x).any() or (np.signbit(x) & (x == 0)).any()):
            return super().compute(ctx)
        if self.info.node.since_version >= 18:
            given = ctx.input(1)
            axes = [] if given is None else [int(a) for a in np.asarray(given).reshape(-1)]
            if not axes and attribute("noop_with_empty_axes", 0):
                return super().compute(ctx)
        else:
            axes = list(attribute("axes") or [])
        if any(not -x.ndim <= a < x.ndim for a in axes):
            return super().compute(ctx)
        axes = sorted({a % x.ndim for a in axes}) or list(range(x.ndim))
        return ort_reduce_extreme(x, axes, bool(attribute("keepdims", 1)), self.largest)


@register_op_kernel("ReduceMax", provider=CPU)
class OrtReduceMax(OrtReduceExtreme):
    """ReduceMax as ORT (ort_reduce_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""


@register_op_kernel("ReduceMin", provider=CPU)
class OrtReduceMin(OrtReduceExtreme):
    """ReduceMin as ORT (ort_reduce_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""

    largest = False
