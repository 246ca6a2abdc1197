"""IOBinding: a session's inputs and outputs bound once to buffers, then run as often as wanted.

Mirrors onnxruntime/core/session/IOBinding.h/.cc and the Python IOBinding of
onnxruntime/python/onnxruntime_inference_collection.py (over onnxruntime_pybind_iobinding.cc):
- BindInput keeps the caller's value by name, in bind order; a name bound again is replaced in place.
  From numpy (bind_cpu_input) the value shares the array's memory when it is C-contiguous, and is a
  copy otherwise (pybind's CreateTensor); from a raw pointer (bind_input) it is a view of that memory.
- BindOutput(name, value) keeps a pre-allocated buffer: the run writes the output into it.
  BindOutput(name, device) keeps an empty value: the run allocates it and leaves it in the binding.
- InferenceSession::Run(run_options, io_binding) passes the binding's outputs vector itself as the
  fetches, so whatever run 1 allocated is a pre-allocated fetch for run 2: run 2 writes into the same
  buffer (run 1's result is overwritten), and an output needing another shape fails ExecutionFrame's
  shape verification ("OrtValue shape verification failed. Current shape:{4,8} Requested shape:{6,8}").
- ClearInputs / ClearOutputs forget the bindings; SynchronizeInputs/Outputs wait for the devices.
Where ortlab differs, it says so: a wrong output name fails when bound (ORT: at run), a required input
left unbound fails before the run (ORT: in the first kernel reading it, "Missing Input: X"), a
null pointer is refused (ORT would crash), and get_outputs() returns arrays that own their buffers, where
ORT's pybind returns OrtValues that are views of the binding's slots (one kept across
clear_binding_outputs() dangles in ORT: L1_03 shows the crash in a child process).
"""
import ctypes
import math
from dataclasses import dataclass

import numpy as np
from onnx import helper

from ortlab.engine.errors import InvalidArgument

DEVICE_ALIASES = {"cuda": "GPU", "gpu": "GPU"}  # ORT's device names for a device EP's memory


@dataclass
class BoundOutput:
    """One bound output: the EP whose memory receives it, its buffer (None until a run allocates it
    when bound to a device), and the object owning that buffer (an OrtValue), kept alive."""

    provider: object
    buffer: object = None
    owner: object = None


class IOBinding:
    """Inputs and outputs of one InferenceSession bound to buffers; made by session.io_binding().

    Mirrors core/session/IOBinding.h and the Python IOBinding (onnxruntime_inference_collection.py).
    Values are numpy arrays on the host (torch tensors in a device EP's memory); get_outputs() returns
    the bound buffers themselves, copy_outputs_to_cpu() copies of them.
    """

    def __init__(self, session):
        self.session = session
        self._inputs, self._owners = {}, {}  # name -> the value fed; name -> its owner (an OrtValue)
        self._outputs = {}  # name -> BoundOutput, in bind order (the order of get_outputs())
        self._results = []

    # --- inputs ----------------------------------------------------------------------------------
    def bind_cpu_input(self, name, arr_on_cpu):
        """Bind input `name` to a numpy array, sharing its memory (a copy when it is not C-contiguous)."""
        self._check_input_name(name)
        self._bind_input(name, _host_array(arr_on_cpu, f"bind_cpu_input({name!r})"), None)

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        """Bind input `name` to `shape` elements of `element_type` at address `buffer_ptr`, memory the
        caller keeps alive for as long as the binding is used (no copy)."""
        self._check_input_name(name)
        self._provider(device_type, device_id, host_only=f"bind_input({name!r})")
        where = f"bind_input({name!r})"
        view = _view(buffer_ptr, _element_type(element_type, where), _shape(shape, where), where)
        self._bind_input(name, view, None)

    def bind_ortvalue_input(self, name, ortvalue):
        """Bind input `name` to an onnxruntime.OrtValue on the CPU (its memory, no copy), or to one of
        ortlab's values: a numpy array, or a torch tensor on the CPU."""
        self._check_input_name(name)
        self._bind_input(name, _value_array(ortvalue, f"bind_ortvalue_input({name!r})"), ortvalue)

    def _bind_input(self, name, array, owner):
        self._inputs[name] = array
        self._owners[name] = owner

    def synchronize_inputs(self):
        """Wait until the bound inputs are ready on their devices (nothing to wait for on the CPU)."""
        for provider in self.session.state.providers.values():
            provider.synchronize()

    def clear_binding_inputs(self):
        """Forget every bound input."""
        self._inputs.clear()
        self._owners.clear()

    # --- outputs ---------------------------------------------------------------------------------
    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None):
        """Bind output `name` to a pre-allocated buffer at `buffer_ptr` (with `element_type` and `shape`),
        or, with no pointer, to a device: the run allocates the output there and the binding keeps it."""
        self._check_output_name(name)
        where = f"bind_output({name!r})"
        if buffer_ptr is None:
            self._outputs[name] = BoundOutput(self._provider(device_type, device_id))
            return
        if element_type is None or shape is None:
            raise InvalidArgument(f"{where}: `element_type` and `shape` are to be provided if pre-allocated "
                                  "memory is provided")
        provider = self._provider(device_type, device_id, host_only=where)
        buffer = _view(buffer_ptr, _element_type(element_type, where), _shape(shape, where), where)
        self._outputs[name] = BoundOutput(provider, buffer)

    def bind_ortvalue_output(self, name, ortvalue):
        """Bind output `name` to a pre-allocated onnxruntime.OrtValue on the CPU, or to a writable
        C-contiguous numpy array (or CPU torch tensor): the run writes the output into its memory."""
        self._check_output_name(name)
        where = f"bind_ortvalue_output({name!r})"
        array = ortvalue if isinstance(ortvalue, np.ndarray) else _value_array(ortvalue, where)
        if not (array.flags.writeable and array.flags.c_contiguous) or array.dtype == object:
            raise InvalidArgument(f"{where}: the buffer must be writable and C-contiguous for the run to "
                                  "write into it; pass np.empty(shape, dtype) or an OrtValue from "
                                  "ortvalue_from_shape_and_type")
        self._outputs[name] = BoundOutput(self.session.state.cpu, array, ortvalue)

    def synchronize_outputs(self):
        """Wait until the outputs are written on their devices (nothing to wait for on the CPU)."""
        for provider in self.session.state.providers.values():
            provider.synchronize()

    def clear_binding_outputs(self):
        """Forget every bound output, and the buffers a run allocated for them."""
        self._outputs.clear()
        self._results = []

    def get_outputs(self):
        """The outputs of the last run, in bind order: the bound buffers themselves (no copy)."""
        return list(self._results)

    def copy_outputs_to_cpu(self):
        """Copies on the host (numpy arrays) of the last run's outputs. One of a type numpy lacks (bfloat16,
        float8, int4) fails, as ORT 1.19.2's Python binding does (no numpy type for it)."""
        copies = [np.array(self.session._to_host(value), copy=True) for value in self._results]
        for name, copy in zip(self._outputs, copies):
            if copy.dtype.names:  # onnx.reference's stand-in (ortlab.ir.tensor_value.STAND_INS)
                raise InvalidArgument(f"No corresponding Numpy type for Tensor Type. (output {name!r} is "
                                      f"tensor({self.session.graph.node_arg(name).dtype}), which numpy has no type "
                                      "for; ORT 1.19.2's copy_outputs_to_cpu() fails the same way.) Cast it to "
                                      "float inside the graph to read it")
        return copies

    # --- the run ---------------------------------------------------------------------------------
    def run(self, run_options):
        """What InferenceSession.run_with_iobinding does: feeds and pre-placed fetches into a frame,
        then each output left in its bound buffer (or kept as the buffer of a device binding)."""
        session = self.session
        if not self._outputs:
            raise InvalidArgument("At least one output should be requested. Bind one with "
                                  "bind_output(name) or bind_ortvalue_output(name, buffer)")
        missing = [arg.name for arg in session.get_inputs() if arg.name not in self._inputs]
        if missing:
            raise InvalidArgument(f"Required inputs ({missing}) are not bound (bound: {list(self._inputs)}); "
                                  "bind them with bind_cpu_input(name, array) (ORT fails in the first kernel "
                                  f"that reads one: 'Missing Input: {missing[0]}')")
        feeds = session._check_feeds(dict(self._inputs))
        self._check_output_types()
        fetches = list(self._outputs)
        frame = session._execute(feeds, fetches, run_options, self._preplaced())
        results = [self._collect(name, bound, frame.fetch(name)) for name, bound in self._outputs.items()]
        for bound, result in zip(self._outputs.values(), results):
            bound.buffer = result
        self._results = results

    def _preplaced(self):
        """{slot: buffer} for each output whose buffer lives where its producer writes (ORT: the fetches
        the frame uses directly; others are copied to their device after the run)."""
        state = self.session.state
        producers = {state.value_names[slot]: step.output_providers[i]
                     for step in state.steps for i, slot in enumerate(step.outputs) if slot >= 0}
        found = {}
        for name, bound in self._outputs.items():
            producer = producers.get(name, state.cpu)
            if bound.buffer is not None and producer.is_cpu_based == bound.provider.is_cpu_based:
                found[state.index_of[name]] = bound.buffer
        return found

    def _collect(self, name, bound, value):
        """The output in its bound buffer: copied in when the run wrote elsewhere; with no buffer, the
        value on the bound device (a copy of an initializer). An output that is a graph input is the
        bound input itself, as in ORT (the frame's feeds go in last, over the fetches)."""
        session, target = self.session, bound.provider
        if value is bound.buffer or name in self._inputs:
            return value  # a graph input: the feed itself, its bound buffer left unwritten (as ORT)
        if target.is_cpu_based:
            moved = session._to_host(value)
        else:
            moved = value if hasattr(value, "detach") else target.from_host(value)
        if bound.buffer is not None:
            target.copy_into(bound.buffer, moved)
            return bound.buffer
        return np.array(moved) if name in session.graph.initializers and moved is value else moved

    def _check_output_types(self):
        """A buffer of another type than the graph output's fails as ORT's ValidateOutputs does."""
        for name, bound in self._outputs.items():
            arg = self.session.graph.node_arg(name)
            if bound.buffer is None or arg.np_dtype is None:
                continue
            got, want = np.dtype(bound.provider.dtype_of(bound.buffer)), arg.np_dtype
            if got != want:
                raise InvalidArgument(f"Unexpected output data type. Actual: (tensor({_onnx_name(got)})) "
                                      f", expected: (tensor({_onnx_name(want)})) for output {name!r}; bind a "
                                      f"buffer of type {want}, or bind_output({name!r}) and let the run "
                                      "allocate it")

    # --- checks ----------------------------------------------------------------------------------
    def _check_input_name(self, name):
        inputs = self.session.graph.inputs
        if not isinstance(name, str) or name not in inputs:
            raise InvalidArgument(f"Failed to find NodeArg with name: {name} in the def list (the model's "
                                  f"inputs: {list(inputs)}); bind one of them")

    def _check_output_name(self, name):
        outputs = self.session.graph.outputs
        if not isinstance(name, str) or name not in outputs:
            raise InvalidArgument(f"Invalid output name: {name} (the model's outputs: {list(outputs)}); "
                                  "ortlab checks it when binding, ORT when running")

    def _provider(self, device_type, device_id, host_only=None):
        """The session EP whose memory `device_type` names ('cpu'; 'cuda'/'gpu': a device EP)."""
        if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)) or device_id < 0:
            raise InvalidArgument(f"device_id must be an int >= 0, not {device_id!r}")
        kind = device_type.lower() if isinstance(device_type, str) else None
        if kind == "cpu":
            return self.session.state.cpu
        if kind not in DEVICE_ALIASES:
            raise InvalidArgument(f"Unsupported device type: {device_type!r}; ortlab binds to 'cpu', or to "
                                  "'cuda'/'gpu' (the memory of a device EP of the session)")
        if host_only:
            raise InvalidArgument(f"{host_only}: ortlab binds buffers by pointer in host memory only; use "
                                  "device_type='cpu' (or bind_output(name, 'cuda') with no buffer)")
        found = [p for p in self.session.providers if p.device.type == DEVICE_ALIASES[kind]]
        if not found:
            raise InvalidArgument(f"this session has no EP on device {device_type!r} (its EPs: "
                                  f"{self.session.get_providers()}); bind to 'cpu'")
        return found[0]

    def __repr__(self):
        inputs = {n: _describe(v) for n, v in self._inputs.items()}
        outputs = {n: f"{b.provider.type}: " + ("to be allocated" if b.buffer is None
                                                else _describe(b.buffer)) for n, b in self._outputs.items()}
        return f"IOBinding(inputs={inputs}, outputs={outputs})"


def _describe(value):
    return f"{np.dtype(getattr(value, 'dtype', None) or 'O')}{list(value.shape)}" \
        if isinstance(value, np.ndarray) else type(value).__name__


def _onnx_name(dtype):
    try:
        code = helper.np_dtype_to_tensor_dtype(dtype)
    except Exception:  # noqa: BLE001 (a numpy type ONNX has no name for)
        return str(dtype)
    return helper.tensor_dtype_to_string(code)[len("TensorProto."):].lower()


def _host_array(value, where):
    """A numpy array as ORT's bind_cpu_input takes it: shared when C-contiguous, else a contiguous copy."""
    if not isinstance(value, np.ndarray):
        raise InvalidArgument(f"{where}: Unable to create OrtValue from the given python object "
                              f"({type(value).__name__}); pass a numpy array, e.g. np.asarray(x, np.float32)")
    if value.dtype == object:
        raise InvalidArgument(f"{where}: an object array cannot be bound; pass a numpy array of numbers")
    return value if value.flags.c_contiguous else np.ascontiguousarray(value)


def _value_array(value, where):
    """The host memory of an OrtValue, a numpy array or a CPU torch tensor, as a numpy array (no copy)."""
    if isinstance(value, np.ndarray):
        return _host_array(value, where)
    if hasattr(value, "detach") and hasattr(value, "device"):  # a torch tensor
        if str(value.device) != "cpu":
            raise InvalidArgument(f"{where}: the tensor is on {value.device}; ortlab binds host memory here, "
                                  "bind value.cpu()")
        return _host_array(value.detach().numpy(), where)
    c_value = getattr(value, "_ortvalue", value)
    if type(c_value).__name__ != "OrtValue" or not hasattr(c_value, "numpy"):
        raise InvalidArgument(f"{where}: takes an onnxruntime.OrtValue, a numpy array or a CPU torch tensor, "
                              f"not {type(value).__name__}")
    if not c_value.is_tensor():
        raise InvalidArgument(f"{where}: the OrtValue holds no tensor (a sequence or map); bind a tensor")
    if c_value.device_name().lower() != "cpu":
        raise InvalidArgument(f"{where}: the OrtValue is on {c_value.device_name()}; ortlab binds host "
                              "memory, make it with device_type='cpu'")
    return c_value.numpy()  # on the CPU, a view of the OrtValue's buffer (the same data pointer)


def _element_type(element_type, where):
    """A numpy dtype from a numpy type (np.float32) or dtype, as ORT's bind_input takes it."""
    refused = f"{where}: element_type {element_type!r}: Not a valid numpy type; pass a numpy type such as " \
              "np.float32"
    if isinstance(element_type, (bool, int, np.integer)):
        raise InvalidArgument(refused + " (not an ONNX TensorProto code)")
    try:
        dtype = np.dtype(element_type)
    except TypeError:
        raise InvalidArgument(refused) from None
    if dtype.kind not in "biufc":
        raise InvalidArgument(f"{where}: element_type {dtype} cannot be bound by pointer; pass a numeric "
                              "type")
    return dtype


def _shape(shape, where):
    """A shape as a tuple of ints >= 0."""
    if not isinstance(shape, (list, tuple)) or any(
            isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise InvalidArgument(f"{where}: shape must be a list of ints >= 0, not {shape!r} (ORT: shape.Size() "
                              "must >=0)")
    return tuple(int(d) for d in shape)


def _view(buffer_ptr, dtype, shape, where):
    """A numpy view of `shape` elements of `dtype` at address `buffer_ptr` (memory the caller owns)."""
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype)
    if isinstance(buffer_ptr, bool) or not isinstance(buffer_ptr, (int, np.integer)) or buffer_ptr <= 0:
        raise InvalidArgument(f"{where}: buffer_ptr must be the address of the data (an int > 0, e.g. "
                              f"array.ctypes.data or tensor.data_ptr()), not {buffer_ptr!r}")
    raw = (ctypes.c_byte * (count * dtype.itemsize)).from_address(int(buffer_ptr))
    return np.frombuffer(raw, dtype, count).reshape(shape)
