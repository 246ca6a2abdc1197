"""What keeps a learner's code from reaching the grader's own code while a lab is graded.

The learner's cells run in a kernel, a separate process, but as the same user: they can write any file
the grader can, including the grader's Python modules and their bytecode caches (__pycache__/*.pyc).
A module the grader imported after such a write would run the learner's code in the judging process. So:

- `prepare` checks that the bytecode caches of ortlab's modules hold their sources' code
  (`forged_caches`: a cache forged earlier, a judge compiled with lines of the learner's added under a
  header copying the source's time and size, is refused rather than loaded), then imports every judge
  (every module of ortlab.labs.judges, with everything they import) and the lab modules the reference's check
  cells import, all *before* the kernel starts;
- while the learner's code can run (`sealed`), a module this process still imports is refused when its
  file, where modules were installed, changed after the seal began, and a bytecode cache written after
  then is never read (the module is compiled from its source; no cache is written).

Native code a learner hands a check (lab10's kernels, built for the CPU runner) is loaded only in a
process of its own (ortlab.labs.cpu_runner), which receives inputs and returns arrays.
"""
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # ortlab/
# every judge: the labs' (labNN) and the walkthroughs' exercises' (l1_05, ...), one module each
JUDGES = tuple(f"ortlab.labs.judges.{p.stem}" for p in sorted((PACKAGE / "labs" / "judges").glob("*.py"))
               if p.stem != "__init__")
_VERIFIED = set()  # (source, its stat, its cache's stat) found to hold the source's code


class ChangedModuleError(ImportError):
    """A module whose file changed while the learner's code could run (the grader does not load it)."""


def prepare(imports=()):
    """Before any learner code runs: the ortlab modules whose bytecode cache does not hold their source's
    code (a forgery), as [(module name, cache path)], checked before anything more is imported; then,
    when there are none, every judge and the reference's `imports` (lines of Python) imported."""
    forged = forged_caches()
    if forged:
        return forged
    for name in JUDGES:
        importlib.import_module(name)
    namespace = {}
    for line in imports:
        try:
            exec(line, namespace)
        except Exception:  # an import this process lacks: the check that needs it says so
            pass
    return []


def forged_caches(package=PACKAGE):
    """[(module name, cache path)] for each module of `package` (ortlab) whose bytecode cache is current for
    its source (same time and size, so Python would load it) but holds other code than its source
    compiles to."""
    package = Path(package)
    forged = []
    for source in sorted(package.rglob("*.py")):
        if "__pycache__" in source.parts:
            continue
        cache = Path(importlib.util.cache_from_source(str(source)))
        try:
            key = (str(source), *_stamp(source.stat()), *_stamp(cache.stat()))
        except OSError:
            continue  # no cache: Python compiles the source
        if key in _VERIFIED:
            continue
        if _cache_matches(source, cache):
            _VERIFIED.add(key)
        else:
            parts = source.relative_to(package.parent).with_suffix("").parts
            forged.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), str(cache)))
    return forged


def _stamp(stat):
    return stat.st_ino, stat.st_mtime_ns, stat.st_size, stat.st_ctime_ns


def _cache_matches(source, cache):
    """False when `cache` is one Python would load for `source` and its code is not the source's."""
    try:
        data, stat, text = cache.read_bytes(), source.stat(), source.read_bytes()
    except OSError:
        return True  # no cache: the module is compiled from its source
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return True  # not a cache this Python reads
    flags = int.from_bytes(data[4:8], "little")
    if flags & 1:  # a hash-based cache: loaded when its hash is the source's (or unchecked)
        current = not flags & 2 or data[8:16] == importlib.util.source_hash(text)
    else:
        current = (int.from_bytes(data[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
                   and int.from_bytes(data[12:16], "little") == stat.st_size & 0xFFFFFFFF)
    if not current:
        return True  # stale: Python compiles the source instead
    try:
        return marshal.loads(data[16:]) == compile(text, str(source), "exec", dont_inherit=True)
    except Exception:  # a cache that is not code, or a source that does not compile
        return False


def _changed_since(path, since):
    """Whether the file at `path` changed at or after `since` (its status-change time, which its owner
    cannot set back as they can its modification time); False when there is no such file."""
    try:
        return os.stat(path).st_ctime >= since
    except OSError:
        return False


class _FreshCacheUnread(importlib.machinery.SourceFileLoader):
    """A source module's loader that does not read a bytecode cache written at or after `since`: Python
    compiles the source instead (SourceLoader.get_code falls back to it when reading the cache fails)."""

    since = float("inf")

    def get_data(self, path):
        if path != self.path and _changed_since(path, self.since):
            raise OSError(f"{path} was written while the lab's code ran")
        return super().get_data(path)


class _Unchanged(importlib.abc.MetaPathFinder):
    """Finds a module as the rest of sys.meta_path would; refuses it when it lies where modules were
    installed before the seal (`roots`: sys.path then) and its file changed after `since`, and never reads
    a bytecode cache written after `since`. Modules in places the grader's own libraries add later (torch
    writes and imports generated modules in temporary folders) are compiled from their source."""

    def __init__(self, since, roots):
        self.since, self.roots = since, roots

    def find_spec(self, name, path=None, target=None):
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.has_location and spec.origin:
            origin = os.path.realpath(spec.origin)
            if origin.startswith(self.roots) and _changed_since(origin, self.since):
                raise ChangedModuleError(f"{spec.origin} changed while the lab's code ran: the grader "
                                         f"does not import it", name=name)
            if type(spec.loader) is importlib.machinery.SourceFileLoader:
                spec.loader = type("FreshCacheUnread", (_FreshCacheUnread,), {"since": self.since})(
                    spec.loader.name, spec.loader.path)
        return spec


@contextlib.contextmanager
def sealed():
    """While the learner's code may run: this process imports nothing changed since now (bytecode caches
    written since are not read, and none is written)."""
    saved = sys.dont_write_bytecode
    roots = tuple(dict.fromkeys(os.path.join(os.path.realpath(entry or os.getcwd()), "")
                                for entry in sys.path if os.path.isdir(entry or os.getcwd())))
    finder = _Unchanged(time.time() - 0.05, roots)  # the clock of file times may run a little behind
    sys.dont_write_bytecode = True
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
        sys.dont_write_bytecode = saved
