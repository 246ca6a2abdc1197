"""The floor plan: every ortlab import, at top level or inside a function, runs from a higher floor to a
lower one (or stays inside its own package), and no two modules import each other, however indirectly.

The floors, lowest first. A package may import any package listed before it, never one after it.
CONTRIBUTING.md's "Where things are" names the same floors.
"""
import ast
import subprocess
import sys
from collections import defaultdict

import pytest

from repo_paths import ROOT

PACKAGE = ROOT / "ortlab"

FLOORS = (
    "errors", "ortlab", "patch", "env", "onnx_defs", "registry", "capture", "viz", "models",  # shared base
    "notebook_hints",
    "ops",           # what an op is: numpy references, ORT's contrib schemas, the kernel declaration table
    "ir",            # Graph, Node, NodeArg, orders, ORT-flavoured shape inference
    "session",       # the real onnxruntime.InferenceSession, observed
    "profiling", "cuda", "triton_kernels",
    "transformers",  # the graph optimizer and the session-time transforms
    "gradients",     # gradient builders and the gradient graph
    "memory",        # the allocation planner and the offset planners
    "engine",        # the runtime: session state, frame, executor, EPs
    "distributed",   # the distributed mirrors
    "training",      # the mirror of ORTModule: managers, MiniORTModule, optimizers, loop
    "ortmodule",     # the real ORTModule driven and observed
    "walkthroughs",  # notebook helpers, one module per notebook
    "labs", "benchmarks", "compare", "__main__",
)


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted):
    path = ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _targets(node, module, is_package):
    """The ortlab modules one import statement loads (`from ortlab.x import y` loads ortlab.x.y when y is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "ortlab"]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parent = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(parent[:len(parent) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "ortlab":
        return []
    subs = [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")]
    return subs if len(subs) == len(node.names) else [base, *subs]


def import_edges():
    """{(importer, imported)} over every module of ortlab, counting imports inside functions."""
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            edges.update((module, t) for t in _targets(node, module, path.name == "__init__.py") if t != module)
    return edges


def floor(module):
    parts = module.split(".")
    return FLOORS.index(parts[1] if len(parts) > 1 else "ortlab")


def test_every_package_has_a_floor():
    names = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists())}
    names = {"ortlab" if n == "__init__" else n for n in names}
    assert names - set(FLOORS) == set(), "give each new package or top-level module a floor in FLOORS"


def test_no_import_reaches_a_higher_floor():
    upward = sorted(f"{a} -> {b}" for a, b in import_edges() if floor(b) > floor(a))
    assert upward == [], "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def _cycles(edges):
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(root):
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_cycle():
    """A package's __init__ re-exports its modules; a module that imports its own package's __init__ back
    would close a loop, so modules import their siblings by module path."""
    assert _cycles(import_edges()) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert _cycles({("a", "b"), ("b", "c")}) == []


def test_the_floor_check_sees_imports_inside_functions():
    source = "def f():\n    from ortlab.training import loop\n"
    node = ast.parse(source).body[0].body[0]
    assert _targets(node, "ortlab.ir.graph", False) == ["ortlab.training.loop"]
    assert floor("ortlab.training.loop") > floor("ortlab.ir.graph")


@pytest.mark.parametrize("module, absent", [("ortlab.engine.sequential_executor", "ortlab.transformers"),
                                            ("ortlab.ir", "ortlab.engine"),
                                            ("ortlab.memory.allocation_planner", "ortlab.engine")])
def test_importing_a_low_module_loads_nothing_above_it(module, absent):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith({absent!r})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
