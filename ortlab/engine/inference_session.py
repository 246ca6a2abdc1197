"""InferenceSession: ortlab's runtime with the calling convention of onnxruntime.InferenceSession.

Mirrors onnxruntime/core/session/inference_session.cc. Initialize builds one ortlab.ir Graph and
changes it in place, as ORT does; in ORT's order: load the graph; run the graph transformers of the
optimization level on it; resolve it (the engine's own type inference); partition the nodes
among the EPs (graph_partitioner.py); insert Memcpy nodes (transformer_memcpy.py); build the
SessionState (one kernel per node, the plan). (ORT runs its level-1 transformers before partitioning
and the EP-specific ones after, on the assigned graph; here all levels run first, told which EPs the
session has.) Run checks the feeds as ORT does, fills an
ExecutionFrame, lets the SequentialExecutor run the plan, and returns the fetches on the host.
run_with_iobinding runs with an IOBinding (io_binding.py): its inputs are the feeds, its outputs
the frame's pre-placed fetches.
"""
import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ortlab.engine.errors import InvalidArgument, InvalidGraph, NotImplementedKernel
import ortlab.engine.cpu_execution_provider  # noqa: F401 (registers the CPU EP)
import ortlab.engine.cpu_kernels  # noqa: F401 (these three register ORT's CPU kernels where
import ortlab.engine.cpu_kernels_signal  # noqa: F401 (DFT, STFT in the signal's own type)
import ortlab.engine.cpu_kernels_pool  # noqa: F401 (MaxPool: ceil_mode and Indices)
import ortlab.engine.cpu_kernels_ordering  # noqa: F401  onnx.reference computes differently, in this order)
import ortlab.engine.cpu_kernels_elementwise  # noqa: F401
import ortlab.engine.cpu_kernels_subgraph  # noqa: F401 (Loop, Scan, SequenceMap)
import ortlab.engine.cpu_kernels_opsets  # noqa: F401 (ops whose meaning changed between opsets)
import ortlab.engine.cpu_kernels_indices  # noqa: F401 (index range checks of Gather*, Scatter*, Sequence*)
import ortlab.engine.cpu_kernels_integer_math  # noqa: F401 (integer Pow as ORT computes it)
import ortlab.engine.triton_execution_provider  # noqa: F401 (registers the Triton EP)
from ortlab.engine.execution_frame import EMPTY_OPTIONAL, ExecutionFrame, data_ptr
from ortlab.engine.execution_provider import EXECUTION_PROVIDERS, ExecutionProvider
from ortlab.engine.graph_partitioner import input_dtypes, partition
from ortlab.engine.io_binding import IOBinding
from ortlab.engine.kernel_registry import CPU
from ortlab.engine.logger import Logger
from ortlab.engine.memory_pattern import pattern_for, reuse_for
from ortlab.engine.options import RunOptions, SessionOptions
from ortlab.engine.profiler import Profiler
from ortlab.engine.run_stats import RunStats
from ortlab.engine.sequential_executor import SequentialExecutor, needed_steps
from ortlab.engine.session_state import SessionState
from ortlab.engine.transformer_memcpy import MemcpyTransformer
from ortlab.ir import Graph
from ortlab.ir.model_load import load_model as load_path
from ortlab.ir.node_arg import NodeArg as GraphValue  # the IR's; NodeArg below is ORT's Python one
from ortlab.memory import BFCArena
from ortlab.memory.session_graph import SessionGraph, declarations, planning_view
from ortlab.transformers import GraphTransformerManager
from ortlab.errors import OrtlabError, as_names


# Kernels that take their output's shape from the graph, not from their inputs (ORT 1.19.2:
# orttraining/orttraining/training_ops/cpu/nn/pool_gradient_op.cc); no shape inference covers them.
GRAPH_SHAPED_OUTPUTS = ("MaxPoolGrad", "AveragePoolGrad")


class NodeArg:
    """What get_inputs() / get_outputs() return: name, type ('tensor(float)') and shape, as ORT's."""

    def __init__(self, name, type, shape):
        self.name, self.type, self.shape = name, type, shape

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def load_model(model_or_path):
    """A private copy of the model (the caller's is never modified)."""
    if isinstance(model_or_path, onnx.ModelProto):
        return onnx.ModelProto.FromString(model_or_path.SerializeToString())
    if isinstance(model_or_path, bytes):
        try:
            return onnx.load_from_string(model_or_path)
        except Exception as exc:  # noqa: BLE001
            raise InvalidGraph(f"the bytes given are not an ONNX model: {exc}") from None
    if isinstance(model_or_path, (str, Path)):
        try:
            return load_path(model_or_path)
        except OrtlabError as exc:
            raise InvalidGraph(str(exc)) from None
    raise InvalidArgument(f"InferenceSession takes an onnx.ModelProto, a path or bytes, not "
                          f"{type(model_or_path).__name__}")


def _writable_file(path, what):
    """`path` as a Path when a file can be written there (checked before the session is built, as early as
    possible; ORT fails with only 'SystemError : 21' for a folder), None for ''."""
    if not path:
        return None
    path = Path(path)
    if path.is_dir():
        raise InvalidArgument(f"{what} {str(path)!r} is a folder; give a file path such as "
                              f"{str(path / 'model.optimized.onnx')!r}")
    if not path.parent.is_dir():
        raise InvalidArgument(f"{what} {str(path)!r}: the folder {str(path.parent)!r} does not exist (or is not a "
                              "folder); create it or choose another path")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InvalidArgument(f"{what} {str(path)!r} is not writable; choose a path you can write to")
    return path


def make_providers(providers, logger=None):
    """EP objects in the order given (ORT's priority order: earlier claims first), each made with its
    provider options (`(name, {options})` entries); a name given twice is ignored with a warning; the
    CPU EP is appended last when not named, as ORT registers it (inference_session.cc, Initialize)."""
    providers = [CPU] if providers is None else providers
    entries = providers if isinstance(providers, (list, tuple)) else [providers]
    made = []
    for entry in entries:
        name, options = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, {})
        if isinstance(name, ExecutionProvider):
            provider = name
        elif not isinstance(name, str) or not isinstance(options, dict):
            raise InvalidArgument(f"providers must be EP names (str) or (name, {{options}}) pairs, not "
                                  f"{type(entry).__name__} {entry!r}")
        else:
            cls = EXECUTION_PROVIDERS.lookup(name, where=" (ortlab.engine knows the EPs registered with "
                                                         "@register_execution_provider)")
            try:
                provider = cls(**options)
            except TypeError as exc:
                raise InvalidArgument(f"{name} does not take the provider options {options}: {exc}") from None
        if any(p.type == provider.type for p in made):
            if logger:
                logger.warning("inference_session.cc", f"Duplicate provider {provider.type} encountered, ignoring.")
            continue
        made.append(provider)
    if not any(p.type == CPU for p in made):
        made.append(EXECUTION_PROVIDERS.lookup(CPU)())
    return made


def _type_string(arg):
    return f"tensor({helper.tensor_dtype_to_string(arg.elem_type)[len('TensorProto.'):].lower()})" \
        if arg.elem_type else "unknown"


class InferenceSession:
    """ortlab's runtime: InferenceSession(model_or_path, sess_options=None, providers=None).

    `providers`: EP names (or (name, options) pairs) in priority order, default the CPU EP alone; the
    CPU EP is added last when not named (named earlier, it claims first, as in ORT).
    After construction: .state (the SessionState), .assignment ({node index: EP}), .memcpy_count,
    .log (the Logger: every line of initialization and runs, whatever the severity).
    """

    def __init__(self, model_or_path, sess_options=None, providers=None):
        self.options = SessionOptions.from_any(sess_options)
        self.log = Logger(self.options.log_severity_level)
        self.providers = make_providers(providers, self.log)
        self.profiler = Profiler(self.options.profile_file_prefix) if self.options.enable_profiling else None
        optimized_path = _writable_file(self.options.optimized_model_filepath, "optimized_model_filepath")
        start = time.perf_counter()
        model = load_model(model_or_path)
        self.graph = self._load(model)  # the session's one Graph, from load to execution
        self.model = self._transform(model)  # the graph as loaded, after the transformers: what ortlab.memory plans
        declared = declarations(self.graph)  # its declared types, read before the engine re-infers them
        self._resolve(declared)
        self.options.planner()  # an unknown memory planner is refused before anything is built
        order = self.graph.topological_order(self.options.order())  # check the graph sorts before partitioning
        self.assignment = partition(self.graph, self.providers, self.log)
        kernel_infos = {n.index: self._kernel_info(n) for n in self.graph.nodes()}  # after inlining
        self.memcpy_count = MemcpyTransformer(self.providers, self.log).apply(self.graph, self.assignment,
                                                                                 {i: k.kernel_def for i, k in
                                                                                  kernel_infos.items()})
        kernel_infos.update({n.index: self._kernel_info(n) for n in self.graph.nodes() if n.index not in kernel_infos})
        order = self.graph.topological_order(self.options.order())
        self._log_placements(order)
        self._planning_graph = self._planning_view(order, declared)
        self.state = SessionState(self.graph, self.assignment, self.providers, kernel_infos, order, self.log,
                                  self._planning_graph.types, self.options.enable_mem_reuse)
        self.executor = SequentialExecutor(self.state, self.log, self.profiler)
        # what every run checks its feeds against, worked out once (ORT: SessionState's feed names)
        self._feed_names = [n for n in self.graph.inputs if n not in self.graph.initializers]
        self._input_set = set(self.graph.inputs)
        self._patterns = {}  # feed shapes -> MemoryPattern (ORT: SessionState's mem_patterns_ cache)
        if optimized_path is not None:
            try:
                onnx.save(self.state.partitioned_model(), str(optimized_path))
            except OSError as exc:
                raise InvalidArgument(f"optimized_model_filepath {str(optimized_path)!r} could not be written: "
                                      f"{exc.strerror}; choose a file path you can write to") from None
        if self.profiler:
            self.profiler.session_event("session_initialization", start, time.perf_counter())

    # --- initialization ----------------------------------------------------------------------
    def _load(self, model):
        """The session's Graph, loaded as ORT's Graph constructor loads a model (graph.cc): Constant nodes
        become initializers. Every later step (transformers, partitioning, Memcpy, plan, executor) works
        on this one object."""
        try:
            return Graph.from_model(model, constants_as_initializers=True)
        except OrtlabError as exc:
            raise InvalidGraph(f"the model does not load: {exc}") from None

    def _transform(self, model):
        """Run the graph transformers of the session's level on its Graph, in place (ORT's
        InferenceSession::TransformGraph); returns the model the Graph now stands for (`model`
        itself at level 0, where none runs). The nodes are then numbered as that model lists them
        (node k of the Graph is node k of session.model), so that ortlab.memory's plan of session.model
        walks the session's own order."""
        level = self.options.level()
        if level == 0:
            return model
        eps = [p.ort_equivalent for p in self.providers if p.ort_equivalent]
        try:
            GraphTransformerManager.from_registry(level, providers=eps).transform_graph(self.graph)
        except OrtlabError as exc:
            raise InvalidGraph(f"the graph transformers could not process the model: {exc}") from None
        self.graph.renumber(self.graph.proto_order())
        return self.graph.to_model()

    def _resolve(self, declared):
        """Resolve the session's Graph for the engine (Graph::Resolve), its values' types inferred afresh.

        Declared intermediate shapes are hints: the engine's own inference decides what a kernel must
        produce (a builder's value_info can be wrong), so only the inputs', outputs' and initializers' types
        are kept. `declared` (read before) keeps them all: ORT's planner reads them."""
        graph = self.graph
        kept = set(graph.inputs) | set(graph.outputs) | set(graph.initializers)
        for arg in graph.node_args():
            if arg.name not in kept:
                arg.type_proto = None
        graph.clean_node_args()  # those of the values the transformers removed go
        try:
            graph.resolve()
        except OrtlabError as exc:
            raise InvalidGraph(f"the model does not resolve: {exc}") from None
        for name, type_proto in declared.items():  # ORT's pool gradients read dX's shape from the graph:
            producer, arg = graph.producer(name), graph.node_arg(name)  # there the declaration stands
            if (name not in kept and producer is not None and producer.op_type in GRAPH_SHAPED_OUTPUTS
                    and arg.shape is None and type_proto.tensor_type.HasField("shape")):
                arg.type_proto = type_proto

    def _kernel_info(self, node):
        provider = next(p for p in self.providers if p.type == self.assignment[node.index])
        found, why = provider.find_kernel(node, input_dtypes(self.graph, node))
        if found is None:
            raise NotImplementedKernel(f"{provider.type} claimed {node.op_type} node '{node.name}' in "
                                       f"get_capability but has no kernel for it ({why}); claim only nodes "
                                       "kernel_lookup(node) finds a kernel for, or register one")
        return found

    def _log_placements(self, order):
        where = "session_state.cc VerifyEachNodeIsAssignedToAnEp"
        self.log.verbose(where, "Node placements")
        placed = {}
        for node in order:
            placed.setdefault(self.assignment[node.index], []).append(node)
        if len(placed) == 1:
            (ep, nodes), = placed.items()
            self.log.verbose(where, f" All nodes placed on [{ep}]. Number of nodes: {len(nodes)}")
            return
        for ep, nodes in placed.items():
            self.log.verbose(where, f" Node(s) placed on [{ep}]. Number of nodes: {len(nodes)}")
            for node in nodes:
                self.log.verbose(where, f"  {node.op_type} ({node.name})")

    # --- the ORT-shaped API ------------------------------------------------------------------
    def get_providers(self):
        return [p.type for p in self.providers]

    def get_provider_options(self):
        """{EP name: the options it was made with} (ORT: InferenceSession.get_provider_options)."""
        return {p.type: dict(p.options) for p in self.providers}

    def get_inputs(self):
        graph = self.graph
        return [self._node_arg(n) for n in graph.inputs if n not in graph.initializers]

    def get_outputs(self):
        return [self._node_arg(n) for n in self.graph.outputs]

    def _node_arg(self, name):
        arg = self.graph.node_arg(name)
        return NodeArg(name, _type_string(arg), arg.shape)

    def end_profiling(self):
        """Write the profile (ORT's Chrome trace format) and return its path; '' when profiling is off."""
        return self.profiler.end() if self.profiler else ""

    def run(self, output_names, input_feed, run_options=None):
        """Outputs (numpy arrays, on the host) for `output_names` (None or []: all) given `input_feed`."""
        run_options = RunOptions.from_any(run_options)
        fetches = self._check_fetches(output_names)
        feeds = self._check_feeds(input_feed)
        frame = self._execute(feeds, fetches, run_options)
        # a weight comes back as a fresh copy each run; a graph input that is also an output is the caller's own
        # array, as ORT 1.19.2 returns it (tests/engine/test_engine_errors.py pins ORT's behaviour)
        weights = set(self.graph.initializers)
        outputs = [(name, self._to_host(frame.fetch(name))) for name in fetches]
        for name, value in outputs:
            if getattr(getattr(value, "dtype", None), "names", None):
                raise InvalidArgument(f"No corresponding Numpy type for Tensor Type. (output {name!r} is "
                                      f"tensor({_name(self.graph.node_arg(name).elem_type)}), which numpy has no "
                                      "type for; ORT 1.19.2's run() fails the same way.) Cast it to float inside "
                                      "the graph to read it")
        return [np.array(v) if name in weights else v for name, v in outputs]

    def io_binding(self):
        """A new IOBinding for this session (ORT: InferenceSession.io_binding()): bind inputs and outputs
        once, run with run_with_iobinding(binding) as often as wanted."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options=None):
        """Run with the binding's inputs as feeds (no copy) and its outputs as fetches; the results are
        read with iobinding.get_outputs() (ORT: InferenceSession.run_with_iobinding)."""
        if not isinstance(iobinding, IOBinding) or iobinding.session is not self:
            raise InvalidArgument("run_with_iobinding takes an IOBinding made by this session's "
                                  f"io_binding(), not {type(iobinding).__name__}")
        run_options = RunOptions.from_any(run_options)
        iobinding.run(run_options)

    def _execute(self, feeds, fetches, run_options, preplaced=None):
        """Fill a frame with the feeds (and pre-placed fetches), run the plan, record last_run; the frame."""
        start = time.perf_counter()
        found = self._memory_pattern(feeds)
        pattern, reuse = (found, None) if self.options.enable_mem_pattern else (None, found)
        frame = ExecutionFrame(self.state, feeds, pattern, preplaced, reuse)
        steps = needed_steps(self.state, fetches) if run_options.only_execute_path_to_fetches else self.state.steps
        self.executor.execute(frame, steps, run_options)
        frame.copy_outputs_across_devices()
        names = self.state.value_names
        self.last_run = RunStats(
            peak_bytes=frame.peak_bytes, allocations=frame.allocations, steps=len(steps),
            pattern_bytes=pattern.peak_bytes if pattern else 0, placed_in_pattern=frame.placed,
            allocation_trace=frame.trace,
            feed_data_ptrs={names[slot]: data_ptr(frame.values[slot]) for slot in feeds},
            fetch_data_ptrs={name: data_ptr(frame.fetch(name)) for name in fetches},
            preplaced_fetches=[names[slot] for slot in frame.preplaced])
        if self.profiler:
            end = time.perf_counter()
            self.profiler.session_event("SequentialExecutor::Execute", start, end)
            self.profiler.session_event("model_run", start, end)
        return frame

    def arena(self):
        """The last run's host allocations replayed through ortlab.memory's BFCArena (ORT's CPU arena):
        with the memory pattern, the block then what lies outside it; without, every tensor. Its
        `.stats` are ORT's AllocatorStats, `.lines()` the log lines ORT's arena would write."""
        if not hasattr(self, "last_run"):
            raise InvalidArgument("arena() replays the last run's allocations: run the session first")
        arena = BFCArena()
        arena.replay(self.last_run.allocation_trace)
        return arena

    def planning_graph(self):
        """This session's own graph as ORT's allocation planner reads it (an ortlab.memory SessionGraph): the
        graph that runs, in its execution order, with the types ORT infers from the model."""
        return self._planning_graph

    def _planning_view(self, order, declared):
        """planning_view of the graph that runs; without types when ORT's inference cannot type it (the plan
        then reuses no buffer through the freelist, and still releases each value after its last reader)."""
        try:
            return planning_view(self.graph, order, declared)
        except OrtlabError as exc:
            self.log.info("allocation_planner.cc", f"no value types for the allocation plan: {exc}")
            return SessionGraph(self.graph, {}, [])

    def _memory_pattern(self, feeds):
        """For these feed shapes (planned on first use, cached): the MemoryPattern, or with enable_mem_pattern
        off the allocation plan's ReusePlan; None when the graph cannot be planned statically (then logged)."""
        key = (self.options.enable_mem_pattern, tuple(sorted((slot, _feed_shape(v)) for slot, v in feeds.items())))
        if key not in self._patterns:
            found, why = (pattern_for if self.options.enable_mem_pattern else reuse_for)(self, feeds)
            if found is None:
                what = "memory pattern" if self.options.enable_mem_pattern else "allocation plan's reuse"
                self.log.info("session_state.cc GetMemoryPatternGroup", f"{what} not used: {why}")
            self._patterns[key] = found
        return self._patterns[key]

    def _to_host(self, value):
        if hasattr(value, "detach"):
            return value.detach().cpu().numpy()
        return value

    def _check_fetches(self, output_names):
        """The names to fetch; None or an empty list means every graph output, as onnxruntime's Session.run
        (`if not output_names:` in onnxruntime_inference_collection.py)."""
        if output_names is None or (isinstance(output_names, (list, tuple)) and not output_names):
            return list(self.graph.outputs)
        names = as_names(output_names, "output_names", InvalidArgument)
        for name in names:
            if name not in self.graph.outputs:
                raise InvalidArgument(f"Invalid output name:{name} (the model's outputs: {self.graph.outputs})")
        return names

    def _check_feeds(self, input_feed):
        if not isinstance(input_feed, dict):
            raise InvalidArgument(f"input_feed must be a dict {{input name: array}}, not {type(input_feed).__name__}")
        state, required = self.state, self._feed_names
        missing = [n for n in required if n not in input_feed]
        if missing:
            raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed ({list(input_feed)}).")
        feeds = {}
        for name, value in input_feed.items():
            if name not in self._input_set:
                raise InvalidArgument(f"Invalid input name: {name} (the model's inputs: {required})")
            array = self._check_feed(name, value)
            array = EMPTY_OPTIONAL if array is None else array
            provider = state.feed_providers[name]
            feeds[state.index_of[name]] = array if provider.is_cpu_based or not isinstance(array, np.ndarray) \
                else provider.from_host(array)
        return feeds

    def _check_feed(self, name, value):
        """The feed checked against the graph input's type, as ORT's ValidateInputs does: a numpy array for a
        tensor, a list of arrays for a sequence (ORT's TensorSeq), None for an empty optional."""
        arg = self.graph.node_arg(name)
        kind = arg.type_proto.WhichOneof("value") if arg.type_proto is not None else "tensor_type"
        if kind == "optional_type":
            if value is None:
                return None  # an empty optional, as OptionalHasElement reads it
            arg, kind = GraphValue(name, arg.type_proto.optional_type.elem_type), \
                arg.type_proto.optional_type.elem_type.WhichOneof("value")
        if kind == "sequence_type":
            return self._check_sequence_feed(name, value, GraphValue(name, arg.type_proto.sequence_type.elem_type))
        if value is None:
            raise InvalidArgument(f"feed {name!r} is None: only an input of optional type takes None (an empty "
                                  f"optional); {name!r} is a {_type_text(arg.type_proto)}, feed an array")
        if isinstance(value, list):
            value = _list_as_array(name, value, arg)
        return self._check_tensor_feed(name, value, arg)

    def _check_sequence_feed(self, name, value, element):
        """A sequence feed: a list of arrays, each checked against the sequence's element type (ORT's TensorSeq
        refuses an element of another type; shapes may differ from element to element)."""
        if not isinstance(value, list):
            what = "a tensor" if hasattr(value, "shape") else type(value).__name__
            raise InvalidArgument(f"input {name!r} is a {_type_text(self.graph.node_arg(name).type_proto)}: feed "
                                  f"a list of arrays (ORT takes a list, not a tuple), not {what}")
        return [self._check_tensor_feed(f"{name}[{i}]", v, element) for i, v in enumerate(value)]

    def _check_tensor_feed(self, name, value, arg):
        """The feed as a numpy array, checked against `arg` (a NodeArg of tensor type) as ValidateInputs does."""
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        try:
            array = np.asarray(value)
        except Exception as exc:  # noqa: BLE001
            raise InvalidArgument(f"feed {name!r}: cannot make an array of {type(value).__name__}: {exc}") from None
        if arg.elem_type == onnx.TensorProto.STRING and array.dtype.kind in "OUS":
            return array.astype(object)  # tensor(string): numpy str or object arrays, as ORT takes them
        if array.dtype == object:
            raise InvalidArgument(f"feed {name!r}: Unable to handle object of type {type(value).__name__}")
        expected = arg.np_dtype
        if expected is not None and expected.names:  # bfloat16, float8, int4: numpy has no such type
            raise InvalidArgument(f"Unexpected input data type. Actual: (tensor({_feed_type_name(array)})) , "
                                  f"expected: (tensor({_name(arg.elem_type)})) for input {name!r}. ORT 1.19.2's "
                                  f"run() takes no numpy array for a tensor({_name(arg.elem_type)}) input, as numpy "
                                  "has no such type: feed float32 and Cast inside the graph")
        if array.dtype.names:  # an onnx.reference stand-in fed to a numpy type: ORT reads its storage type
            array = array.view(next(iter(array.dtype.fields.values()))[0])
        if expected is not None and array.dtype.newbyteorder("=") != expected:
            raise InvalidArgument(f"Unexpected input data type. Actual: (tensor({_feed_type_name(array)})) , "
                                  f"expected: (tensor({_name(arg.elem_type)})) for input {name!r}")
        if not array.dtype.isnative:
            raise InvalidArgument(
                f"feed {name!r} is {array.dtype.newbyteorder('=')} in non-native byte order ({array.dtype.str}); "
                "ORT 1.19.2 takes such an array without a word and reads its bytes in the machine's order, so "
                f"its results are wrong. Pass {name}.astype(np.{array.dtype.newbyteorder('=')}) (native order)")
        dims = arg.shape
        if dims is not None and len(dims) != array.ndim:
            raise InvalidArgument(f"Invalid rank for input: {name} Got: {array.ndim} Expected: {len(dims)} "
                                  "Please fix either the inputs/outputs or the model.")
        bad = [(i, n, d) for i, (d, n) in enumerate(zip(dims or [], array.shape)) if isinstance(d, int) and d != n]
        if bad:
            rows = "\n".join(f" index: {i} Got: {n} Expected: {d}" for i, n, d in bad)
            raise InvalidArgument(f"Got invalid dimensions for input: {name} for the following indices\n{rows}\n "
                                  "Please fix either the inputs/outputs or the model.")
        return array

    def __repr__(self):
        counts = {ep: len(nodes) for ep, nodes in self.state.placements().items()}
        return (f"ortlab.engine.InferenceSession(graph {self.graph.name!r}, providers={self.get_providers()}, "
                f"nodes per EP={counts}, memcpy nodes={self.memcpy_count})")


def _list_as_array(name, value, arg):
    """A Python list fed for a tensor input, as an array of the input's element type (ORT's Python binding
    converts it so; onnxruntime_pybind_mlvalue.cc). Where ORT would drop fractions silently (floats into an
    integer type), refused."""
    expected = arg.dtype
    if expected is None or arg.elem_type == onnx.TensorProto.STRING:
        return value
    try:
        natural, array = np.asarray(value), np.asarray(value, dtype=expected)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"feed {name!r}: could not create a tensor({_name(arg.elem_type)}) from the given "
                              f"list ({exc}); feed a numpy array") from None
    if natural.dtype.kind in "fc" and array.dtype.kind in "iub" and not np.array_equal(natural, array):
        raise InvalidArgument(f"feed {name!r}: the list holds numbers with a fraction and the input is "
                              f"tensor({_name(arg.elem_type)}); ORT 1.19.2 would drop the fractions without a "
                              "word. Round them yourself and feed an integer array")
    return array


def _feed_shape(value):
    """A feed's shape for the memory pattern's cache key: a tensor's shape, a sequence's element shapes, None for
    an empty optional."""
    if isinstance(value, list):
        return ("sequence", tuple(tuple(np.shape(v)) for v in value))
    return tuple(value.shape) if hasattr(value, "shape") else None


def _type_text(type_proto):
    """ONNX's text of a value's type, e.g. 'sequence(tensor(float))' (onnx.printer's form)."""
    kind = type_proto.WhichOneof("value") if type_proto is not None else None
    if kind == "tensor_type":
        return f"tensor({_name(type_proto.tensor_type.elem_type)})" if type_proto.tensor_type.elem_type \
            else "tensor"
    if kind in ("sequence_type", "optional_type"):
        return f"{kind[:-5]}({_type_text(getattr(type_proto, kind).elem_type)})"
    return kind or "value of unknown type"


def _feed_type_name(array):
    """The element type ORT reads a numpy array as: ONNX's name for its dtype; onnx.reference's stand-ins
    (bfloat16 is (uint16, [('bfloat16', '<u2')])) as their storage type, 'uint16'."""
    dtype = array.dtype.newbyteorder("=")
    dtype = next(iter(dtype.fields.values()))[0].newbyteorder("=") if dtype.names else dtype
    try:
        return _name(helper.np_dtype_to_tensor_dtype(dtype))
    except Exception:  # noqa: BLE001 (a numpy type ONNX has no name for)
        return str(array.dtype)


def _name(elem_type):
    return helper.tensor_dtype_to_string(elem_type)[len("TensorProto."):].lower()
