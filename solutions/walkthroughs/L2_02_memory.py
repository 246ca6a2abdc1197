"""Reference answers to the exercises of notebooks/L2_02_memory.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "buffer_of": '''
return {"a": None, "b": None, "c": None, "t": None, "s": "c", "m": "c", "p": None, "r": "p", "q": "a",
        "y": None}
''',
    "block_bytes": '''
size = -(-100_000 * 3 * 4 // 256) * 256  # one [100000, 3] float tensor, rounded up to 256 bytes
return 4 * size  # a, b, c and t are held at pc 3; p later takes t's bytes
''',
}

_RIGHT = {"a": None, "b": None, "c": None, "t": None, "s": "c", "m": "c", "p": None, "r": "p", "q": "a", "y": None}


def _with(**changed):
    return f"return {dict(_RIGHT, **changed)!r}\n"


MISTAKES = {
    "buffer_of": [
        (_with(b="a"), "read again"),                    # Sigmoid in place over a, which mul reads later
        (_with(m="s"), "owns the buffer"),               # the direct input rather than the chain's owner
        (_with(p="t"), "symbolic shape"),                # t's [3, n] buffer has the bytes but not the shape
        (_with(q="c"), "most recently freed first"),     # the older of the two buffers freed at pc 6
        (_with(y="p"), "graph output"),                  # a graph output is never reused
        (_with(r=None), "Alias"),                        # Reshape's output is its input
        ('return {"a": None}\n', "'b' is missing"),
    ],
    "block_bytes": [
        ("return 5 * 1_200_128\n", "share bytes"),        # every kAllocate buffer added up
        ("return 4 * 100_000 * 3 * 4\n", "multiple of 256"),  # sizes not rounded
        ("return 6 * 1_200_128\n", "outside the pattern"),  # x and y counted too
        ("return '4.8 MB'\n", "whole number of bytes"),
    ],
}
