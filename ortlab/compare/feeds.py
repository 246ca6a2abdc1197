"""The feeds compare() generates: a size for each dynamic dimension (checked against the model's own
names), sizes checked before anything is allocated, seeded values, and integer divisors that are never 0
(ORT's integer Div and Mod kernels trap on a zero divisor: SIGFPE, which kills the process)."""
import difflib
import numbers

import numpy as np
from onnx import TensorProto, helper

from ortlab.compare.report import CompareError

DEFAULT_DIM = 2          # a dim_param's size unless the caller names one
INT_RANGE = (0, 2)       # generated integer feeds: 0 or 1, a valid index on any axis of size >= 2
DIVISOR_RANGE = (1, 3)   # an integer feed that is a divisor: 1 or 2, never 0
MAX_FEED_BYTES = 1 << 30  # generated feeds, all together: ORT, the engine and the planner each hold copies
# The inputs (by position) whose integer value must not be 0: x / 0 and x % 0 trap in ORT's CPU kernels;
# Range's delta 0 is refused on both sides, so a generated delta is never 0 either.
DIVISOR_SLOTS = {"Div": (1,), "Mod": (1,), "Range": (2,)}
PASS_THROUGH = {"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Transpose",
                "Abs", "Neg"}  # ops whose input 0 reaches their output with its zeros kept
GENERATED = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.STRING,
             TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
             TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}


def graph_inputs(model):
    """The graph inputs a caller feeds (not initializers), as ValueInfoProtos."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _dim_key(vi, axis, dim):
    """A dynamic dimension's name: its dim_param, or 'input[axis]' when it has none."""
    return dim.dim_param or f"{vi.name}[{axis}]"


def dynamic_dims(model):
    """The names of the model's dynamic dimensions, in input order (each once)."""
    names = []
    for vi in graph_inputs(model):
        if vi.type.HasField("tensor_type"):
            for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
                if not dim.HasField("dim_value") and _dim_key(vi, axis, dim) not in names:
                    names.append(_dim_key(vi, axis, dim))
    return names


def check_dims(model, dims):
    """dims as {name: size}, each name a dynamic dimension of the model and each size an int >= 0."""
    if dims is None:
        return {}
    if not isinstance(dims, dict):
        raise CompareError(f"dims must be a dict {{dimension name: size}}, not {type(dims).__name__}")
    known = dynamic_dims(model)
    for name, size in dims.items():
        if name not in known:
            raise CompareError(_unknown_dim(name, known))
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
            raise CompareError(f"dimension {name!r} needs a size of 0 or more (an int), not {size!r}")
    return {name: int(size) for name, size in dims.items()}


def _unknown_dim(name, known):
    if not known:
        return (f"the model has no dynamic dimension {name!r}: every input's shape is fixed, so there is "
                "nothing to size (drop --dim)")
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"the model has no dynamic dimension {name!r}{hint}; its dynamic dimensions are: {', '.join(known)}"


def check_seed(seed):
    """The seed of numpy's generator: an int of 0 or more."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise CompareError(f"the seed must be an integer of 0 or more (numpy's generators take no other), "
                           f"got {seed!r}")
    return int(seed)


def feed_specs(model, dims):
    """[(name, shape, dtype)] of the feeds to generate, and {dynamic dim: size chosen}; sizes checked."""
    specs, chosen, total = [], {}, 0
    for vi in graph_inputs(model):
        shape, dtype = _shape(vi, dims, chosen), _dtype(vi)
        size = int(np.prod(shape, dtype=object)) * max(dtype.itemsize, 1)
        total += size
        if size > MAX_FEED_BYTES or total > MAX_FEED_BYTES:
            raise CompareError(_too_big(vi, dtype, shape, size, total))
        specs.append((vi.name, shape, dtype))
    return specs, chosen


def _shape(vi, dims, chosen):
    if not vi.type.HasField("tensor_type"):
        kind = (vi.type.WhichOneof("value") or "untyped value").replace("_type", "").replace("_", " ")
        raise CompareError(f"input {vi.name!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a tensor; "
                           "compare() generates tensor feeds only")
    shape = []
    for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            if dim.dim_value < 0:
                raise CompareError(f"input {vi.name!r} declares a negative size ({dim.dim_value}) on axis "
                                   f"{axis}: fix the model (a dynamic dimension has a dim_param, or nothing)")
            shape.append(dim.dim_value)
        else:
            key = _dim_key(vi, axis, dim)
            shape.append(dims.get(key, DEFAULT_DIM))
            chosen[key] = shape[-1]
    return shape


def _dtype(vi):
    elem = vi.type.tensor_type.elem_type
    if elem not in GENERATED:
        name = TensorProto.DataType.Name(elem) if elem in TensorProto.DataType.values() else str(elem)
        raise CompareError(f"input {vi.name!r} has element type {name}, for which compare() cannot generate "
                           "feeds (numpy has no such type); it generates float, int, bool and string feeds")
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def _too_big(vi, dtype, shape, size, total):
    name = vi.name
    fixed = all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)
    if size > MAX_FEED_BYTES and fixed:
        return (f"input {name!r} {dtype}{shape} would take {size:,} bytes; compare() generates at most "
                f"{MAX_FEED_BYTES:,} bytes of feeds, and this shape is fixed in the model: compare a smaller "
                "model (or one whose large dimensions are dynamic)")
    if size > MAX_FEED_BYTES:
        return (f"input {name!r} {dtype}{shape} would take {size:,} bytes; compare() generates at most "
                f"{MAX_FEED_BYTES:,} bytes of feeds: give its dynamic dimensions smaller sizes (--dim NAME=N)")
    return (f"the feeds would take {total:,} bytes once input {name!r} {dtype}{shape} is added; compare() "
            f"generates at most {MAX_FEED_BYTES:,}: give the dynamic dimensions smaller sizes (--dim NAME=N)")


def divisor_inputs(model):
    """The graph inputs whose values reach a divisor (Div's or Mod's second input, Range's delta), through
    ops that keep zeros (Cast, Reshape, ...), in the graph and in its subgraphs."""
    producers, slots = {}, []
    for node in _all_nodes(model.graph):
        producers.update((out, node) for out in node.output)
        slots += [node.input[i] for i in DIVISOR_SLOTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx")
                  and i < len(node.input)]
    found = set()
    for name in slots:
        for _ in range(len(producers) + 1):  # a walk back, never longer than the graph
            node = producers.get(name)
            if node is None or node.op_type not in PASS_THROUGH or not node.input:
                break
            name = node.input[0]
        found.add(name)
    return found & {vi.name for vi in graph_inputs(model)}


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _all_nodes(body)


def generate_feeds(model, dims=None, seed=0):
    """Seeded feeds for the graph inputs that are not initializers: floats standard normal, integers in
    [0, 2) (a divisor's in [1, 3)), bools random; a dim_param (or unknown dim) takes dims[name] or 2.
    Returns (feeds, note)."""
    specs, chosen = feed_specs(model, check_dims(model, dims))
    rng, divisors = np.random.default_rng(check_seed(seed)), divisor_inputs(model)
    feeds = {name: _values(rng, shape, dtype, name in divisors) for name, shape, dtype in specs}
    listed = ", ".join(f"{n} {a.dtype}{list(a.shape)}" for n, a in feeds.items())
    note = "generated feeds (seeded; floats normal, integers 0 or 1): " + (listed or "none")
    integer_divisors = sorted(n for n in divisors if np.issubdtype(feeds[n].dtype, np.integer))
    if integer_divisors:
        note += "; divisors 1 or 2: " + ", ".join(integer_divisors)
    if chosen:
        note += "; dynamic dims chosen: " + ", ".join(f"{k}={v}" for k, v in chosen.items())
    return feeds, note


def _values(rng, shape, dtype, divisor):
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == np.object_:  # ONNX strings
        return rng.integers(0, 2, shape).astype(str).astype(object)
    return rng.integers(*(DIVISOR_RANGE if divisor else INT_RANGE), shape).astype(dtype)


def describe_feeds(feeds):
    """One line naming each feed: its type and shape, and its values when few, else their range."""
    parts = []
    for name, array in feeds.items():
        array = np.asarray(array)
        text = f"{name} {array.dtype}{list(array.shape)}"
        if 0 < array.size <= 8:
            text += " " + np.array2string(array.ravel(), separator=" ", precision=3)
        elif array.size and np.issubdtype(array.dtype, np.number):
            text += f" in [{array.min():.3g}, {array.max():.3g}]"
        parts.append(text)
    return ", ".join(parts) or "no feeds"
