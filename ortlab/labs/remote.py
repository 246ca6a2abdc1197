"""The line between a learner's code and the checks that judge it: calls that carry only data.

A check (ortlab.labs.judges) never runs in the same place as the learner's code when a lab is graded:
the grader's own process runs the check, and each time the check needs the learner's code it asks the
learner's kernel to run a *probe* (a function registered here by a lab module: call this function on
these inputs, run this transformer on this model, launch these ranks) and gets back the outputs as
data. Data is encoded to JSON by `encode` and read back by `decode`, which builds only plain values:
numbers, strings, lists, tuples, dicts, numpy arrays (never pickled), torch tensors and ONNX protos
(parsed from their bytes). Anything else comes back as an `Opaque` value that keeps only its type's
name. Whatever the learner's code does to its own process (wrap `display`, replace a check, patch
numpy) changes only the data it sends; whether that data is right is decided where it cannot reach.

In a notebook (not grading) the same checks run in the notebook's process through `LocalRemote`,
which still passes every value through `encode` and `decode`, so a check sees the same data either way.
"""
import base64
import importlib
import json

import numpy as np

RESULT_MIME = "application/vnd.ortlab.probe+json"
PROBES = {}   # "module:function" -> the probe, registered by the lab modules
TUPLES = {}   # namedtuple name -> type, so that Alloc(...) comes back as an Alloc
_ONNX_KINDS = ("ModelProto", "GraphProto", "NodeProto", "FunctionProto", "TensorProto", "AttributeProto")
_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"}


class RemoteError(Exception):
    """A request or a reply that is not what the protocol allows (a bug, or a tampered kernel)."""


class RemoteRaised(Exception):
    """The learner's code raised on the other side; the subclass is named after what it raised."""


class Opaque:
    """A value that is not data (a function, a Graph, a module...): only its type's name comes back."""

    def __init__(self, text=""):
        self.text = text

    def __repr__(self):
        return f"<{type(self).__name__} {self.text}>".replace(" >", ">")


def _named(base, name, cache={}):  # noqa: B006 - a cache of the made-up classes
    key = (base, name)
    if key not in cache:
        cache[key] = type(str(name)[:80] or base.__name__, (base,), {})
    return cache[key]


def register_tuple(cls):
    """Let namedtuple `cls` cross the line as itself (a plain tuple otherwise); returns cls."""
    TUPLES[cls.__name__] = cls
    return cls


def probe(fn):
    """Register `fn` as a probe: something a check may ask the learner's side to run (returns fn)."""
    PROBES[f"{fn.__module__}:{fn.__name__}"] = fn
    return fn


# --- the learner's objects -----------------------------------------------------------------------------

class Learner:
    """One of the learner's objects, as a check sees it: a name in the notebook (grading), or the object
    itself (a check called in the notebook). A check never calls it: it hands it to a probe."""

    def __init__(self, name=None, obj=None):
        self.name, self.obj = name, obj

    def __repr__(self):
        return f"Learner({self.name!r})" if self.name else f"Learner({type(self.obj).__name__})"


def learner(value, name=None):
    """`value` marked as the learner's (kept as it is when it already is a Learner)."""
    return value if isinstance(value, Learner) else Learner(name, value)


# --- the codec -----------------------------------------------------------------------------------------

def encode(value, learners=None):
    """`value` as JSON-able data. Learner objects become {"t": "learner", "name": ...} when `learners`
    (a list) is None, else their index in `learners` (for the in-process path)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) is int or type(value) is float:
        return value
    if isinstance(value, Learner):
        if learners is None:
            if value.name is None:
                raise RemoteError("a learner's object without a name cannot be sent to the kernel")
            return {"t": "learner", "name": value.name}
        learners.append(value)
        return {"t": "learner", "index": len(learners) - 1}
    if isinstance(value, np.generic) and np.dtype(value.dtype).name in _DTYPES:
        return {"t": "npscalar", **_array(np.asarray(value))}
    if isinstance(value, np.ndarray) and value.dtype.name in _DTYPES:
        return {"t": "array", **_array(value)}
    kind = type(value).__name__
    module = type(value).__module__ or ""
    if module.startswith("torch") and kind in ("Tensor", "Parameter"):
        array = value.detach().cpu().numpy()
        if array.dtype.name in _DTYPES:
            return {"t": "tensor", **_array(array)}
    if module.startswith("onnx") and kind in _ONNX_KINDS:
        return {"t": "onnx", "kind": kind, "data": base64.b64encode(value.SerializeToString()).decode()}
    if isinstance(value, (bytes, bytearray)):
        return {"t": "bytes", "data": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, tuple):
        items = [encode(v, learners) for v in value]
        named = type(value).__name__ if hasattr(value, "_fields") else None
        return {"t": "tuple", "v": items, **({"name": named} if named else {})}
    if isinstance(value, list):
        return {"t": "list", "v": [encode(v, learners) for v in value]}
    if isinstance(value, dict):
        return {"t": "dict", "v": [[encode(k, learners), encode(v, learners)] for k, v in value.items()]}
    if isinstance(value, (int, float)):  # subclasses (an IntEnum, a bool-like): their plain value
        return int(value) if isinstance(value, int) else float(value)
    return {"t": "opaque", "type": kind[:80], "text": repr(value)[:80] if _reprable(value) else ""}


def _reprable(value):
    return isinstance(value, (set, frozenset, range, complex, type))


def _array(array):
    return {"dtype": array.dtype.name, "shape": [int(d) for d in array.shape],
            "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}  # C order bytes


def _from_array(data):
    dtype = data.get("dtype")
    if dtype not in _DTYPES:
        raise RemoteError(f"an array of dtype {dtype!r} is not data")
    shape = tuple(int(d) for d in data["shape"])
    raw = base64.b64decode(data["data"], validate=True)
    return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()


def decode(data, learners=None):
    """The value `encode` made `data` from (learner objects from `learners` when given)."""
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if not isinstance(data, dict) or "t" not in data:
        raise RemoteError(f"not encoded data: {type(data).__name__}")
    tag = data["t"]
    if tag == "list":
        return [decode(v, learners) for v in data["v"]]
    if tag == "tuple":
        items = tuple(decode(v, learners) for v in data["v"])
        cls = TUPLES.get(data.get("name"))
        return cls(*items) if cls is not None and len(items) == len(cls._fields) else items
    if tag == "dict":
        return {_key(decode(k, learners)): decode(v, learners) for k, v in data["v"]}
    if tag == "array":
        return _from_array(data)
    if tag == "npscalar":
        return _from_array(data)[()]
    if tag == "tensor":
        import torch  # heavy: torch

        return torch.from_numpy(_from_array(data))
    if tag == "onnx":
        import onnx  # lazy: `import ortlab.labs` loads no onnx (0.2 s); only ONNX answers need it

        if data.get("kind") not in _ONNX_KINDS:
            raise RemoteError(f"not an ONNX proto: {data.get('kind')!r}")
        proto = getattr(onnx, data["kind"])()
        proto.ParseFromString(base64.b64decode(data["data"], validate=True))
        return proto
    if tag == "bytes":
        return base64.b64decode(data["data"], validate=True)
    if tag == "opaque":
        return _named(Opaque, data.get("type") or "object")(str(data.get("text", ""))[:80])
    if tag == "learner":
        if learners is not None and "index" in data:
            return learners[int(data["index"])]
        return Learner(name=str(data["name"]))
    raise RemoteError(f"unknown data tag {tag!r}")


def _key(key):
    try:
        hash(key)
    except TypeError:
        raise RemoteError(f"a dict key must be hashable, got {type(key).__name__}") from None
    return key


# --- running a probe (on the learner's side) -------------------------------------------------------------

def run_probe(name, args, resolve):
    """The reply to a request: {"ok": encoded result} or {"raised": {"type", "message"}}.
    `resolve(Learner)` gives the learner's object (or raises NameError)."""
    fn = PROBES.get(name)
    if fn is None:
        module = name.split(":")[0]
        if module.startswith("ortlab.labs."):
            try:
                importlib.import_module(module)
            except Exception:
                pass
        fn = PROBES.get(name)
    if fn is None:
        return {"raised": {"type": "RemoteError", "message": f"no probe {name!r}"}}
    try:
        values = [_resolved(a, resolve) for a in args]
        result = fn(*values)
    except Exception as exc:  # the learner's code may raise anything
        return {"raised": {"type": type(exc).__name__, "message": str(exc)[:2000]}}
    try:
        return {"ok": encode(result)}
    except RecursionError:
        return {"raised": {"type": "ValueError", "message": "the result is nested too deeply to be data"}}


def _resolved(value, resolve):
    """`value` with each Learner in it (in lists, tuples and dict values) replaced by resolve(it)."""
    if isinstance(value, Learner):
        return resolve(value)
    if isinstance(value, list):
        return [_resolved(v, resolve) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_resolved(v, resolve) for v in value)
    if isinstance(value, dict):
        return {k: _resolved(v, resolve) for k, v in value.items()}
    return value


def serve(request, token):
    """Run one request in the learner's kernel (the grader's cell calls this) and display the reply."""
    from IPython import get_ipython  # optional: IPython
    from IPython.display import display  # optional: IPython

    request = json.loads(request)
    namespace = get_ipython().user_ns

    def resolve(item):
        if item.name not in namespace:
            raise NameError(f"name '{item.name}' is not defined")
        return namespace[item.name]

    try:
        args = decode(request["args"])
    except Exception as exc:
        reply = {"raised": {"type": "RemoteError", "message": f"bad request: {exc}"}}
    else:
        reply = run_probe(request["probe"], args, resolve)
    display({RESULT_MIME: {"token": token, "reply": reply}, "text/plain": "(data for the grader)"}, raw=True)


def request(probe_name, args):
    """The JSON text of a request to run `probe_name` (a "module:function") on `args`."""
    return json.dumps({"probe": probe_name, "args": encode(list(args))})


def answer(reply, learners=None):
    """The value of a reply, or the learner's exception raised again here (named as theirs)."""
    if not isinstance(reply, dict):
        raise RemoteError("a reply must be a dict")
    if "ok" in reply:
        return decode(reply["ok"], learners)
    raised = reply.get("raised")
    if not isinstance(raised, dict):
        raise RemoteError("a reply holds 'ok' or 'raised'")
    kind, message = str(raised.get("type", "Exception"))[:80], str(raised.get("message", ""))
    if kind == "NotImplementedError":
        raise NotImplementedError(message)
    if kind == "NameError":
        raise NameError(message)
    if kind == "RemoteError":
        raise RemoteError(message)
    raise _named(RemoteRaised, kind)(message)


def function(remote, fn):
    """The learner's function `fn` as a function of data: each call runs it through `remote`."""
    return lambda *args: remote.call(call, fn, *args)


def name_of(fn):
    """'module:function' of a probe, for a request."""
    return f"{fn.__module__}:{fn.__name__}"


# --- where the checks run ----------------------------------------------------------------------------

class LocalRemote:
    """Probes run in this process (a check called in the notebook), with the same encode/decode."""

    def call(self, fn, *args):
        learners = []
        data = json.loads(json.dumps(encode(list(args), learners)))
        values = decode(data, learners)
        reply = run_probe(name_of(fn), values, lambda item: item.obj)
        return answer(json.loads(json.dumps(reply)))


@probe
def call(fn, *args):
    """The learner's function on `args`: its return value."""
    return fn(*args)


@probe
def value(obj):
    """The learner's value itself."""
    return obj


@probe
def call_with_arguments(fn, *args):
    """(the learner's function on `args`, the arguments after the call): did it change what it was given?"""
    return fn(*args), list(args)
