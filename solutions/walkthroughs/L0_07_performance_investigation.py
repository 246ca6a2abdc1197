"""Reference answers to the exercises of notebooks/L0_07_performance_investigation.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "self_times": '''
own = [e["dur"] for e in events]
for tid in {e["tid"] for e in events}:
    stack = []  # the events the current one may run inside, outermost first
    for i in sorted((i for i, e in enumerate(events) if e["tid"] == tid),
                    key=lambda i: (events[i]["ts"], -events[i]["dur"])):
        while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= events[i]["ts"]:
            stack.pop()  # that one ended before this one started
        if stack:
            own[stack[-1]] -= events[i]["dur"]  # this op's time is not its direct parent's own
        stack.append(i)
return own
''',
    "fused_matmuls": '''
return {"fused": {"mm_scores", "mm_shared", "mm_first", "mm_scaled"},
        "transposes_left": {"t_heads", "t_shared"}}
''',
}

MISTAKES = {
    "self_times": [
        ('''
return [e["dur"] for e in events]
''', "whole duration"),
        ('''
return [e["dur"] - sum(o["dur"] for o in events if o is not e and o["tid"] == e["tid"]
                       and e["ts"] <= o["ts"] < e["ts"] + e["dur"])  # every op that started inside it
        for e in events]
''', "grandchildren too"),
        ('''
own = [e["dur"] for e in events]
order = sorted(range(len(events)), key=lambda i: events[i]["ts"])
for before, i in zip(order, order[1:]):
    own[before] -= events[i]["dur"]  # each op taken to run inside the one that started before it
return own
''', "did not run inside it"),
        ('''
return {e["name"]: e["dur"] for e in events}
''', "one self time (µs) per event"),
    ],
    "fused_matmuls": [
        ('''
return {"fused": {"mm_scores", "mm_context", "mm_shared", "mm_first", "mm_scaled"},
        "transposes_left": {"t_shared"}}
''', "moves the head axis"),
        ('''
return {"fused": {"mm_scores", "mm_projected", "mm_shared", "mm_first", "mm_scaled"},
        "transposes_left": {"t_heads", "t_shared"}}
''', "constant folding"),
        ('''
return {"fused": {"mm_scores", "mm_first", "mm_scaled"},
        "transposes_left": {"t_heads", "t_shared"}}
''', "does not stop the fusion"),
        ('''
return {"fused": {"mm_scores", "mm_shared", "mm_first"},
        "transposes_left": {"t_heads", "t_shared"}}
''', "MatMulScaleFusion"),
        ('''
return {"fused": {"mm_scores", "mm_shared", "mm_first", "mm_scaled"},
        "transposes_left": {"t_heads"}}
''', "relu still reads"),
    ],
}
