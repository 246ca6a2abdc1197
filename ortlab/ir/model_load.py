"""Reading a model file as ORT's Model::Load does, with its external data (onnxruntime/core/graph/model.cc,
and onnxruntime/core/framework/tensorprotoutils.cc for data stored next to the model): every failure is a
GraphError that says what is wrong with the file and what to do.
"""
from pathlib import Path

import onnx

from ortlab.ir.errors import GraphError


def load_model(path):
    """onnx.load with an OrtlabError that says what went wrong (a missing file, a missing
    external-data file, bytes that are not a model)."""
    if not isinstance(path, (str, Path)):
        raise GraphError(f"load_model() takes a path (str or pathlib.Path), not {type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise GraphError(f"{path} is a folder, not a model file; give the path of the .onnx file")
    if not path.is_file():
        raise GraphError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise GraphError(f"{path} is not a readable ONNX model ({type(exc).__name__}); "
                         "is it a .onnx file?") from None
    missing = missing_external_data(model, path.parent)
    if missing:
        tensor, file = missing[0]
        more = f" (and {len(missing) - 1} more tensors)" if len(missing) > 1 else ""
        raise GraphError(f"{path}: the data of initializer '{tensor}'{more} is stored outside the model "
                         f"in {file}, which does not exist; put that file next to the model (external "
                         "data paths are relative to the model's folder) or save the model again with "
                         "its weights inside")
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as exc:
        raise GraphError(f"{path}: its external data could not be read ({type(exc).__name__}: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
    return model


def missing_external_data(model, folder):
    """[(tensor name, path)] of the external-data files a model refers to that do not exist
    (initializers and Constant-like attributes, subgraphs included)."""
    missing = []
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            file = Path(folder) / location
            if not location or not file.is_file():
                missing.append((tensor.name, file))
    return missing


def _tensors(graph):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)
