"""Reference answers to the exercises of notebooks/L1_02_execution_providers.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "memcpy_nodes": '''
device_reads, host_reads, device_made, host_made = set(), set(), set(), set()
for node in graph.nodes:
    on_device = node.ep != "CPUExecutionProvider"
    for i, value in enumerate(node.inputs):
        if value:  # '' is an optional input left out
            (device_reads if on_device and i not in node.cpu_inputs else host_reads).add(value)
    for value in node.outputs:
        (device_made if on_device else host_made).add(value)
copies = []
for value in sorted(device_reads):
    if value in graph.initializers:
        continue  # duplicated for the device side, no node
    if value in host_made or (value in graph.inputs and value in host_reads):
        copies.append(("MemcpyFromHost", value))  # one copy per value, whatever the number of readers
for value in sorted(device_made & host_reads):  # a graph output nobody reads on the host: copied by the run
    copies.append(("MemcpyToHost", value))
return copies
''',
    "placements": '''
cpu, triton = "CPUExecutionProvider", "TritonExecutionProvider"
nodes = ["matmul", "bias_gelu", "layer_norm", "softmax", "reduce_sum", "relu", "cast", "softmax64"]
on_triton = {"bias_gelu", "layer_norm", "softmax", "reduce_sum"}  # a Triton kernel that takes float32
return {"triton_first": {n: triton if n in on_triton else cpu for n in nodes},
        "cpu_first": {n: cpu for n in nodes}}  # the CPU EP claims first, and it has every kernel
''',
}

_MEMCPY_START = '''
device_reads, host_reads, device_made, host_made = set(), set(), set(), set()
for node in graph.nodes:
    on_device = node.ep != "CPUExecutionProvider"
    for i, value in enumerate(node.inputs):
        if value:
            (device_reads if on_device and i not in node.cpu_inputs else host_reads).add(value)
    for value in node.outputs:
        (device_made if on_device else host_made).add(value)
copies = []
'''

MISTAKES = {
    "memcpy_nodes": [
        ('''
host_made = {v for n in graph.nodes if n.ep == "CPUExecutionProvider" for v in n.outputs}
device_made = {v for n in graph.nodes if n.ep != "CPUExecutionProvider" for v in n.outputs}
copies = []
for node in graph.nodes:
    for i, value in enumerate(node.inputs):
        if node.ep != "CPUExecutionProvider" and i not in node.cpu_inputs and value in host_made:
            copies.append(("MemcpyFromHost", value))  # one copy per reader
        if node.ep == "CPUExecutionProvider" and value in device_made:
            copies.append(("MemcpyToHost", value))
return copies
''', "one copy per value, not one per reader"),
        (_MEMCPY_START + '''
for value in sorted(device_reads):
    if value in graph.initializers:
        continue
    if value in host_made or (value in graph.inputs and value in host_reads):
        copies.append(("MemcpyFromHost", value))
for value in sorted(device_made & (host_reads | set(graph.outputs))):  # graph outputs copied back by a node
    copies.append(("MemcpyToHost", value))
return copies
''', "utils::CopyOutputsAcrossDevices"),
        ('''
device_reads, host_reads, device_made, host_made = set(), set(), set(), set()
for node in graph.nodes:
    on_device = node.ep != "CPUExecutionProvider"
    for i, value in enumerate(node.inputs):
        if value:
            (device_reads if on_device else host_reads).add(value)  # every input of a device node read there
    for value in node.outputs:
        (device_made if on_device else host_made).add(value)
copies = []
for value in sorted(device_reads):
    if value in graph.initializers:
        continue
    if value in host_made or (value in graph.inputs and value in host_reads):
        copies.append(("MemcpyFromHost", value))
for value in sorted(device_made & host_reads):
    copies.append(("MemcpyToHost", value))
return copies
''', "reads 'axes' in CPU memory"),
        (_MEMCPY_START + '''
for value in sorted(device_reads):
    if value in graph.initializers:
        continue
    if value in host_made or value in graph.inputs:  # every graph input read on the device
        copies.append(("MemcpyFromHost", value))
for value in sorted(device_made & host_reads):
    copies.append(("MemcpyToHost", value))
return copies
''', "utils::CopyInputsAcrossDevices"),
        (_MEMCPY_START + '''
for value in sorted(device_reads):
    if value in host_made or value in graph.initializers or (value in graph.inputs and value in host_reads):
        if value not in graph.initializers or value in host_reads:  # an initializer read on both sides
            copies.append(("MemcpyFromHost", value))
for value in sorted(device_made & host_reads):
    copies.append(("MemcpyToHost", value))
return copies
''', "duplicated for the device, with no node"),
    ],
    "placements": [
        ('''
cpu, triton = "CPUExecutionProvider", "TritonExecutionProvider"
nodes = ["matmul", "bias_gelu", "layer_norm", "softmax", "reduce_sum", "relu", "cast", "softmax64"]
on_triton = {"bias_gelu", "layer_norm", "softmax", "reduce_sum", "softmax64"}
return {"triton_first": {n: triton if n in on_triton else cpu for n in nodes},
        "cpu_first": {n: cpu for n in nodes}}
''', "takes float32 only"),
        ('''
cpu, triton = "CPUExecutionProvider", "TritonExecutionProvider"
nodes = ["matmul", "bias_gelu", "layer_norm", "softmax", "reduce_sum", "relu", "cast", "softmax64"]
on_triton = {"bias_gelu", "layer_norm", "softmax"}
return {"triton_first": {n: triton if n in on_triton else cpu for n in nodes},
        "cpu_first": {n: cpu for n in nodes}}
''', "changes where one input lives, not which EP runs the node"),
        ('''
cpu, triton = "CPUExecutionProvider", "TritonExecutionProvider"
nodes = ["matmul", "bias_gelu", "layer_norm", "softmax", "reduce_sum", "relu", "cast", "softmax64"]
on_triton = {"bias_gelu", "layer_norm", "softmax", "reduce_sum"}
placed = {n: triton if n in on_triton else cpu for n in nodes}
return {"triton_first": placed, "cpu_first": placed}
''', "the first EP that claims a node keeps it"),
        ('''
cpu, triton = "CPUExecutionProvider", "TritonExecutionProvider"
nodes = ["matmul", "bias_gelu", "layer_norm", "softmax", "reduce_sum", "relu", "cast", "softmax64"]
on_triton = {"layer_norm", "softmax", "reduce_sum"}
return {"triton_first": {n: triton if n in on_triton else cpu for n in nodes},
        "cpu_first": {n: cpu for n in nodes}}
''', "has a BiasGelu kernel"),
    ],
}
