"""Registry: the one table type behind every "register by decorator" in ortlab.

Gradient builders, graph transformers and rewrite rules, kernels and graph-doctor checks
each live in a Registry. ORT keeps such tables in C++: KernelRegistry
(onnxruntime/core/framework/kernel_registry.cc), GradientBuilderRegistry
(orttraining/orttraining/core/graph/gradient_builder_registry.cc) and the transformer
lists of onnxruntime/core/optimizer/graph_transformer_utils.cc. ortlab gives them one
shape: `register` with an explicit duplicate policy, `lookup` that lists what is
registered on a miss, `using` for a temporary swap that is always undone, `unregister`.
Op keys are (op type, domain) pairs with one spelling of the ONNX domain (ortlab.onnx_defs).
"""
from collections.abc import Mapping
from contextlib import contextmanager
import difflib

from ortlab.errors import OrtlabError
from ortlab.onnx_defs import op_key, op_name

_MISSING = object()


class RegistryError(OrtlabError):
    """A registration clashes with one already there, or a key is not registered."""


class NotRegisteredError(RegistryError, KeyError):
    """lookup() found nothing under a key; the message lists what is registered."""

    def __str__(self):  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


def _same_definition(old, new):
    """A re-run notebook cell defines a new object with the same module and qualified name."""
    names = [(getattr(v, "__module__", None), getattr(v, "__qualname__", None)) for v in (old, new)]
    return old is new or (names[0] == names[1] and names[0][1] is not None)


class Registry(Mapping):
    """A named mapping from keys to registered things, filled by decorators.

    duplicates: what `register` does with a key that is already taken by another definition:
      "error"   raise, unless the call says override=True (kernels: replacing a built-in is a
                decision, as in ORT's KernelRegistry, which refuses a second kernel for a key);
      "replace" replace it (gradient builders, transformers, checks: the last one written wins).
    Re-registering the same definition (a notebook cell run twice) always replaces.
    op_keys: keys are (op type, domain) pairs, normalised by ortlab.onnx_defs.op_key and
    printed as `Softmax` / `com.microsoft:Gelu`; otherwise keys are names (str).
    """

    def __init__(self, name, *, duplicates="error", op_keys=True, error=NotRegisteredError, hint="",
                 miss=None):
        if duplicates not in ("error", "replace"):
            raise RegistryError(f"duplicates must be 'error' or 'replace', not {duplicates!r}")
        self.name, self.duplicates, self.op_keys = name, duplicates, op_keys
        self.error, self.hint = error, hint
        self.miss = miss  # optional (registry, key, where) -> message, for a registry's own wording
        self._entries = {}

    # keys
    def key(self, key, domain=None):
        """The normalised key: op_key(op_type, domain) for op registries, the name otherwise."""
        if not self.op_keys:
            if not isinstance(key, str):
                raise RegistryError(f"{self.name} entries are keyed by name (str), not {type(key).__name__} {key!r}")
            return key
        op_type, domain = key if isinstance(key, tuple) and len(key) == 2 else (key, domain or "")
        if not isinstance(op_type, str) or not isinstance(domain or "", str):
            raise RegistryError(f"{self.name} entries are keyed by an op type (str) or an (op type, domain) "
                                f"pair of str, not {key!r}")
        return op_key(op_type, domain)

    def describe(self, key):
        """A key printed the one ortlab way."""
        return op_name(*key) if self.op_keys else str(key)

    # registration
    def register(self, key, value, *, override=False):
        """File `value` under `key`, following the duplicate policy; returns value."""
        key = self.key(key)
        old = self._entries.get(key, _MISSING)
        if (old is not _MISSING and self.duplicates == "error" and not override
                and not _same_definition(old, value)):
            raise RegistryError(
                f"{self.name}: {self.describe(key)} is already registered ({_label(old)}); "
                f"pass override=True to replace it, or use {self.name}.using(...) for a temporary swap")
        self._entries[key] = value
        return value

    def unregister(self, key, domain=None):
        """Remove and return what is registered under key (None when nothing is)."""
        return self._entries.pop(self.key(key, domain), None)

    @contextmanager
    def using(self, key, value):
        """Register `value` under `key` inside a `with` block, then restore exactly what was there."""
        key = self.key(key)
        old = self._entries.get(key, _MISSING)
        self._entries[key] = value
        try:
            yield value
        finally:
            if old is _MISSING:
                self._entries.pop(key, None)
            else:
                self._entries[key] = old

    # lookup
    def lookup(self, key, domain=None, where=""):
        """What is registered under key; on a miss, an error naming the close matches and all keys."""
        normal = self.key(key, domain)
        if normal in self._entries:
            return self._entries[normal]
        raise self.error((self.miss or Registry.miss_message)(self, normal, where))

    def known(self):
        """Every registered key, printed, sorted."""
        return sorted(self.describe(k) for k in self._entries)

    def close_matches(self, key):
        """Registered keys a missed key was probably meant to be: same op in another domain, or close spelling."""
        same_op = [self.describe(k) for k in self._entries if self.op_keys and k[0] == key[0]]
        return same_op or difflib.get_close_matches(self.describe(key), self.known(), n=3)

    def miss_message(self, key, where=""):
        close = self.close_matches(key)
        message = f"no {self.name} is registered for {self.describe(key)}{where}"
        message += f" (did you mean {', '.join(close)}?)." if close else "."
        if self.hint:
            message += f" {self.hint}"
        return message + f" Registered: {', '.join(self.known()) or '(nothing)'}"

    # Mapping
    def __getitem__(self, key):
        return self.lookup(key)

    def get(self, key, default=None):
        return self._entries.get(self.key(key), default)

    def __contains__(self, key):
        try:
            return self.key(key) in self._entries
        except RegistryError:
            return False

    def __iter__(self):
        return iter(list(self._entries))

    def __len__(self):
        return len(self._entries)

    def __repr__(self):
        shown = ", ".join(self.describe(k) for k in list(self._entries)[:8])
        more = f", ... {len(self) - 8} more" if len(self) > 8 else ""
        return f"<Registry {self.name!r}: {len(self)} entries ({shown}{more})>"


def _label(value):
    return getattr(value, "__qualname__", None) or type(value).__name__
