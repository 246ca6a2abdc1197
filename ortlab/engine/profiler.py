"""The engine's profiler: ORT's Chrome-trace events, so ortlab.profiling reads both runtimes alike.

Mirrors onnxruntime/core/common/profiler.cc and the events sequential_executor.cc records: per
node a '<name>_kernel_time' event (category 'Node', args op_name, provider, output_size,
output_type_shape), per run 'model_run' and 'SequentialExecutor::Execute' (category 'Session').
EndProfiling writes '<prefix>_<date>_<time>.json' and returns its path.
"""
import json
import os
import time
from datetime import datetime
from pathlib import Path

from ortlab.engine.errors import InvalidArgument
from ortlab.engine.execution_frame import nbytes


def check_prefix(prefix):
    """The folder of `prefix` must exist and be writable now, at session creation. ORT 1.19.2 opens the
    file only at EndProfiling, and with a missing folder returns the path of a file it never wrote."""
    folder = Path(prefix).parent
    if not folder.is_dir():
        raise InvalidArgument(f"profile_file_prefix {prefix!r}: the folder {str(folder)!r} does not exist (or is "
                              "not a folder), so the profile could not be written at end_profiling() (ORT 1.19.2 "
                              "then returns the name of a file it never wrote); create the folder or choose "
                              "another prefix")
    if not os.access(folder, os.W_OK):
        raise InvalidArgument(f"profile_file_prefix {prefix!r}: the folder {str(folder)!r} is not writable; "
                              "choose a prefix in a folder you can write to")


class Profiler:
    """Collects events in microseconds from the session's start; the prefix's folder is checked now."""

    def __init__(self, prefix):
        check_prefix(prefix)
        self.prefix, self.events = prefix, []
        self._names, self._types = {}, {}  # per step and per dtype: what every event repeats
        self.start = time.perf_counter()

    def _us(self, t):
        return (t - self.start) * 1e6

    def node_event(self, step, frame, start, end):
        values = frame.values
        outputs = [values[s] for s in step.outputs if s >= 0]
        shapes = [{self._type_name(getattr(v, "dtype", "?")): list(getattr(v, "shape", ()))} for v in outputs]
        name, op_name, provider, index = self._node_names(step)
        self.events.append({"cat": "Node", "name": name, "ph": "X", "pid": 0, "tid": 0,
                            "ts": self._us(start), "dur": (end - start) * 1e6,
                            "args": {"op_name": op_name, "provider": provider, "node_index": index,
                                     "output_size": str(sum(nbytes(v) for v in outputs)),
                                     "output_type_shape": shapes}})

    def _node_names(self, step):
        """What a node's events always say about it (its event name, op, EP, index), worked out on its first
        event: the profiler's own cost, per node, is part of the run it measures."""
        found = self._names.get(id(step))
        if found is None or found[0] is not step:
            node = step.node
            found = self._names[id(step)] = (step, (f"{node.name or node.output_names[0]}_kernel_time",
                                                    node.op_type, step.provider.type, str(node.index)))
        return found[1]

    def _type_name(self, dtype):
        """str(dtype) ('float32'; a torch dtype without 'torch.'), remembered per dtype."""
        found = self._types.get(dtype)
        if found is None:
            found = self._types[dtype] = str(dtype).replace("torch.", "")
        return found

    def session_event(self, name, start, end):
        self.events.append({"cat": "Session", "name": name, "ph": "X", "pid": 0, "tid": 0,
                            "ts": self._us(start), "dur": (end - start) * 1e6, "args": {}})

    def end(self):
        """Write the trace; returns its path (ORT: InferenceSession::EndProfiling)."""
        path = Path(f"{self.prefix}_{datetime.now():%Y-%m-%d_%H-%M-%S}.json")
        try:
            path.write_text(json.dumps(self.events))
        except OSError as exc:  # the folder went away or became read-only since the session was made
            raise InvalidArgument(f"end_profiling could not write {str(path)!r}: {exc.strerror}; check the "
                                  "folder of profile_file_prefix") from None
        return str(path)
