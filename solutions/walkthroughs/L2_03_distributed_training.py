"""Reference answers to the exercises of notebooks/L2_03_distributed_training.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "ddp_buckets": '''
open_buckets, closed, filled_one = {}, [], set()  # one open bucket per dtype
for name, numel, dtype in grads:
    names, size = open_buckets.get(dtype, ([], 0))
    names, size = names + [name], size + numel * l2_03.ITEM[dtype]
    if size >= (cap if dtype in filled_one else first_cap):  # closes once it holds at least its limit
        closed.append(names)
        filled_one.add(dtype)
        open_buckets.pop(dtype, None)
    else:
        open_buckets[dtype] = (names, size)
buckets = closed + [names for names, _ in open_buckets.values()]
ready = [name for name, _, _ in grads]
return sorted(buckets, key=lambda bucket: ready.index(bucket[0]))
''',
    "all_to_all": '''
world = len(inputs)
starts = [np.cumsum([0] + list(s)) for s in splits]  # rank j's chunk for rank r: rows starts[j][r] to starts[j][r + 1]
outputs = [np.concatenate([inputs[j][starts[j][r]:starts[j][r + 1]] for j in range(world)]) for r in range(world)]
return outputs, [[splits[j][r] for j in range(world)] for r in range(world)]
''',
}

MISTAKES = {
    "ddp_buckets": [
        ('''
open_buckets, closed, filled_one = {}, [], set()
for name, numel, dtype in grads:
    names, size = open_buckets.get(dtype, ([], 0))
    limit = cap if dtype in filled_one else first_cap
    if names and size + numel * l2_03.ITEM[dtype] > limit:
        closed.append(names)
        filled_one.add(dtype)
        names, size = [], 0
    open_buckets[dtype] = (names + [name], size + numel * l2_03.ITEM[dtype])
buckets = closed + [names for names, _ in open_buckets.values()]
ready = [name for name, _, _ in grads]
return sorted(buckets, key=lambda bucket: ready.index(bucket[0]))
''', "a bucket may go over it"),
        ('''
open_buckets, closed = {}, []
for name, numel, dtype in grads:
    names, size = open_buckets.get(dtype, ([], 0))
    names, size = names + [name], size + numel * l2_03.ITEM[dtype]
    if size >= cap:
        closed.append(names)
        open_buckets.pop(dtype, None)
    else:
        open_buckets[dtype] = (names, size)
buckets = closed + [names for names, _ in open_buckets.values()]
ready = [name for name, _, _ in grads]
return sorted(buckets, key=lambda bucket: ready.index(bucket[0]))
''', "smaller limit"),
        ('''
buckets, names, size = [], [], 0
for name, numel, dtype in grads:
    names, size = names + [name], size + numel * l2_03.ITEM[dtype]
    if size >= (cap if buckets else first_cap):
        buckets.append(names)
        names, size = [], 0
return buckets + ([names] if names else [])
''', "one dtype only"),
        ('''
open_buckets, closed, filled_one = {}, [], set()
for name, numel, dtype in grads:
    names, size = open_buckets.get(dtype, ([], 0))
    names, size = names + [name], size + numel
    if size >= (cap if dtype in filled_one else first_cap):
        closed.append(names)
        filled_one.add(dtype)
        open_buckets.pop(dtype, None)
    else:
        open_buckets[dtype] = (names, size)
buckets = closed + [names for names, _ in open_buckets.values()]
ready = [name for name, _, _ in grads]
return sorted(buckets, key=lambda bucket: ready.index(bucket[0]))
''', "the limits are in bytes"),
        ('''
open_buckets, closed, filled_one = {}, [], set()
for name, numel, dtype in grads:
    names, size = open_buckets.get(dtype, ([], 0))
    names, size = names + [name], size + numel * l2_03.ITEM[dtype]
    if size >= (cap if dtype in filled_one else first_cap):
        closed.append(names)
        filled_one.add(dtype)
        open_buckets.pop(dtype, None)
    else:
        open_buckets[dtype] = (names, size)
return closed + [names for names, _ in open_buckets.values()]
''', "the right buckets in the wrong order"),
    ],
    "all_to_all": [
        ('''
return [x for x in inputs], [list(s) for s in splits]
''', "every rank kept its own rows"),
        ('''
world = len(inputs)
starts = [np.cumsum([0] + list(s)) for s in splits]
outputs = [np.concatenate([inputs[(r - k) % world][starts[(r - k) % world][r]:starts[(r - k) % world][r + 1]]
                           for k in range(world)]) for r in range(world)]
return outputs, [[splits[j][r] for j in range(world)] for r in range(world)]
''', "in source-rank order"),
        ('''
world = len(inputs)
outputs = []
for r in range(world):
    starts = np.cumsum([0] + list(splits[r]))
    outputs.append(np.concatenate([inputs[j][starts[j]:starts[j] + splits[j][r]] for j in range(world)]))
return outputs, [[splits[j][r] for j in range(world)] for r in range(world)]
''', "rank 1's chunk for rank 0 is splits[1][0]"),
        ('''
world = len(inputs)
starts = [np.cumsum([0] + list(s)) for s in splits]
outputs = [np.concatenate([inputs[j][starts[j][r]:starts[j][r + 1]] for j in range(world)]) for r in range(world)]
return outputs, [list(s) for s in splits]
''', "the output splits per source"),
        ('''
world = len(inputs)
outputs = [np.concatenate([np.array_split(inputs[j], world)[r] for j in range(world)]) for r in range(world)]
return outputs, [[len(np.array_split(inputs[j], world)[r]) for j in range(world)] for r in range(world)]
''', "rank 0 receives 3 rows"),
    ],
}
