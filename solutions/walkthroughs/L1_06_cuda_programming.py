"""Reference answers to the exercises of notebooks/L1_06_cuda_programming.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "softmax_rows": '''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))  # masked lanes: exp(-inf) = 0
e = tl.exp(x - tl.max(x, axis=0))  # the row max first: exp cannot overflow
tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)
''',
    "gather_grad": '''
p = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
target = tl.load(indices_ptr + p)
dy = tl.load(dy_ptr + p * n_cols + cols, mask=mask)
tl.atomic_add(dx_ptr + target * n_cols + cols, dy, mask=mask)  # other programs may add into the same row
''',
}

MISTAKES = {
    "softmax_rows": [
        ('''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
e = tl.exp(x - tl.max(x, axis=0))
tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)
''', "counts the 27 masked lanes"),
        ('''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
e = tl.exp(x)
tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)
''', "Subtract the row's max first"),
        ('''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
e = tl.where(mask, tl.exp(x - tl.max(x, axis=0)), 0.0)
tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)
''', "its max came out as 0"),
        ('''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
x = tl.load(x_ptr + row * BLOCK + cols, mask=mask, other=-float("inf"))
e = tl.exp(x - tl.max(x, axis=0))
tl.store(y_ptr + row * BLOCK + cols, e / tl.sum(e, axis=0), mask=mask)
''', "not the row's length"),
        ('''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
e = tl.exp(x - tl.max(x, axis=0))
tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0))
''', "mask the store as the load"),
    ],
    "gather_grad": [
        ('''
p = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
target = tl.load(indices_ptr + p)
dy = tl.load(dy_ptr + p * n_cols + cols, mask=mask)
tl.store(dx_ptr + target * n_cols + cols, dy, mask=mask)
''', "only the last of those dY rows"),
        ('''
p = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
target = tl.load(indices_ptr + p)
dy = tl.load(dy_ptr + p * n_cols + cols, mask=mask)
old = tl.load(dx_ptr + target * n_cols + cols, mask=mask)
tl.store(dx_ptr + target * n_cols + cols, old + dy, mask=mask)
''', "(a race)"),
        ('''
p = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
dy = tl.load(dy_ptr + p * n_cols + cols, mask=mask)
tl.atomic_add(dx_ptr + p * n_cols + cols, dy, mask=mask)
''', "it belongs in row indices[p]"),
        ('''
p = tl.program_id(0)
cols = tl.arange(0, BLOCK)
target = tl.load(indices_ptr + p)
dy = tl.load(dy_ptr + p * n_cols + cols)
tl.atomic_add(dx_ptr + target * n_cols + cols, dy)
''', "mask every load and add"),
    ],
}
