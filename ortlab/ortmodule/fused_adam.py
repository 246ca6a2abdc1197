"""ORT's FusedAdam and FP16_Optimizer on a CPU build: the closest real thing to each.

`onnxruntime.training.optim.FusedAdam` (orttraining/orttraining/python/training/optim/fused_adam.py)
groups the parameters by dtype, keeps one step count per group and hands four tensor lists to
`fused_ops.multi_tensor_adam` through `MultiTensorApply` (_multi_tensor_apply.py). That kernel is a
CUDA extension (ortmodule/torch_cpp_extensions/cuda/fused_ops/multi_tensor_adam.cu, launched by
multi_tensor_apply.cuh) that a CPU wheel does not build. `cpu_fused_ops()` installs a CPU
transcription of it, so ORT's own `FusedAdam.step()` runs here unchanged.

`FP16_Optimizer` (optim/fp16_optimizer.py) looks the optimizer's class up in
`OptimizerModifierTypeRegistry` (optim/_modifier_registry.py) and patches DeepSpeed, Apex or
Megatron optimizers; anything else comes back untouched, with a warning.
"""
import contextlib
import copy
import importlib
import math
import sys
import types
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from ortlab import models
from ortlab.distributed.zero_deepspeed import deepspeed_available, fp16_optimizer_on_deepspeed
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError, as_list
from ortlab.patch import patched
from ortlab.training.optimizers import OptimizerError, check_hyperparameters
from ortlab.viz import Table

# multi_tensor_apply.cuh: how many tensors / blocks one launch's argument struct can describe,
# indexed by depth - 1 (FusedAdam's lists are g, p, m, v: depth 4).
DEPTH_TO_MAX_TENSORS = (110, 64, 48, 36, 30)
DEPTH_TO_MAX_BLOCKS = (320, 320, 320, 320, 320)
CHUNK_SIZE = 2048 * 32  # FusedAdam.__init__: MultiTensorApply(2048 * 32)
BLOCK_SIZE = 512  # multi_tensor_adam.cu: threads per block (each handles ILP = 4 elements per pass)
MODES = ("ADAM_L2_REGULARIZATION", "ADAMW_TRANSFORMERS", "ADAMW_TORCH")  # adamMode_t 0, 1, 2
FUSED_OPS = "onnxruntime.training.ortmodule.torch_cpp_extensions.fused_ops"
GPU_COMMAND = ("python -m onnxruntime.training.ortmodule.torch_cpp_extensions.install  "
               "# once, on a CUDA build of onnxruntime-training (needs nvcc)\n"
               "from onnxruntime.training.optim import FusedAdam, AdamWMode\n"
               "opt = FusedAdam(model.cuda().parameters(), lr=1e-2, eps=1e-8, weight_decay=0.01, "
               "adam_w_mode=AdamWMode.ADAMW_TORCH)  # = torch.optim.AdamW(lr=1e-2, weight_decay=0.01)")


class FusedAdamError(OrtlabError):
    """The CPU multi_tensor_adam was given lists the CUDA kernel would refuse, or a helper bad input."""


@dataclass
class Launch:
    """One kernel launch of multi_tensor_apply: the (tensor index, chunk index) each block handles."""

    blocks: list = field(default_factory=list)

    @property
    def tensors(self):
        """The tensor indices this launch touches, in order."""
        return sorted({t for t, _ in self.blocks})

    def __repr__(self):
        return f"Launch({len(self.blocks)} blocks over tensors {self.tensors})"


def plan_launches(sizes, chunk_size=CHUNK_SIZE, depth=4):
    """How multi_tensor_apply splits tensors of `sizes` elements into launches: each tensor is cut
    into chunks of chunk_size, one block per chunk; a launch closes when it holds
    DEPTH_TO_MAX_TENSORS[depth-1] tensors (at a tensor's last chunk), DEPTH_TO_MAX_BLOCKS blocks, or
    the last chunk. A tensor cut by a full launch continues in the next one.

    Mirrors multi_tensor_apply() in fused_ops/multi_tensor_apply.cuh.
    """
    sizes = _sizes(sizes)
    chunk_size = _positive(chunk_size, "chunk_size")
    if depth not in range(1, 6):
        raise FusedAdamError(f"depth must be 1..5 (the number of tensor lists), not {depth!r}")
    max_tensors, max_blocks = DEPTH_TO_MAX_TENSORS[depth - 1], DEPTH_TO_MAX_BLOCKS[depth - 1]
    launches, current, tensors_here = [], Launch(), 0
    for t, n in enumerate(sizes):
        tensors_here += 1
        chunks = (n + chunk_size - 1) // chunk_size
        for chunk in range(chunks):
            current.blocks.append((t, chunk))
            last_of_tensor = chunk == chunks - 1
            tensors_full = tensors_here == max_tensors and last_of_tensor
            if tensors_full or len(current.blocks) == max_blocks or (t == len(sizes) - 1 and last_of_tensor):
                launches.append(current)
                current = Launch()
                tensors_here = 0 if last_of_tensor else 1
    return launches


def _sizes(sizes):
    """A list of non-negative ints (element counts), or FusedAdamError."""
    try:
        values = [int(n) for n in sizes]
    except (TypeError, ValueError):
        raise FusedAdamError(f"sizes must be a list of element counts, not {sizes!r}") from None
    if not values or any(n < 0 for n in values):
        raise FusedAdamError(f"sizes must be a non-empty list of counts >= 0, got {values}")
    return values


def _positive(value, what):
    """value as a positive int, or FusedAdamError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise FusedAdamError(f"{what} must be a positive int, not {value!r}")
    return int(value)


def bias_corrections(lr, beta1, beta2, step, bias_correction):
    """(bias_correction1, bias_correction2, lr_corrected) as multi_tensor_adam_cuda computes them on
    the host: 1 - beta**step in double, stored as float; lr * sqrt(bc2) / bc1 in float."""
    f32 = np.float32
    bc1, bc2, lr_corrected = f32(1.0), f32(1.0), f32(lr)
    if bias_correction == 1:
        bc1 = f32(1 - float(f32(beta1)) ** step)
        bc2 = f32(1 - float(f32(beta2)) ** step)
        lr_corrected = f32(lr_corrected * (f32(math.sqrt(bc2)) / bc1))
    return float(bc1), float(bc2), float(lr_corrected)


def adam_functor(g, p, m, v, beta1, beta2, eps, lr, lr_corrected, bc1, bc2, mode, decay):
    """Update one chunk in place: AdamFunctor's arithmetic (multi_tensor_adam.cu), in float32
    (MATH_T) whatever the tensors' dtype, written back in their dtype."""
    r_g, r_p, r_m, r_v = (t.float() for t in (g, p, m, v))
    if mode == 0:  # L2 regularization: the decay joins the gradient
        r_g = r_g + decay * r_p
        r_m = beta1 * r_m + (1 - beta1) * r_g
        r_v = beta2 * r_v + (1 - beta2) * r_g * r_g
        r_p = r_p - (lr_corrected * r_m / (torch.sqrt(r_v) + eps))
    elif mode == 1:  # decoupled decay after the Adam step, as transformers' AdamW
        r_m = beta1 * r_m + (1 - beta1) * r_g
        r_v = beta2 * r_v + (1 - beta2) * r_g * r_g
        r_p = r_p - (lr_corrected * r_m / (torch.sqrt(r_v) + eps))
        r_p = r_p - (lr * decay * r_p)
    else:  # decoupled decay before the Adam step, eps after un-biasing v: torch's AdamW
        r_p = r_p - (r_p * lr * decay)
        r_m = beta1 * r_m + (1 - beta1) * r_g
        r_v = beta2 * r_v + (1 - beta2) * r_g * r_g
        denom = (torch.sqrt(r_v) / math.sqrt(bc2)) + eps
        r_p = r_p - (lr * r_m) / (bc1 * denom)
    for target, value in ((p, r_p), (m, r_m), (v, r_v)):
        target.copy_(value)


def _check_lists(tensor_lists, depth=4):
    """The TORCH_CHECKs of multi_tensor_apply, minus the CUDA device one."""
    if not isinstance(tensor_lists, (list, tuple)) or len(tensor_lists) != depth:
        raise FusedAdamError(f"tensor_lists must be a list of {depth} lists (grads, params, exp_avg, "
                             f"exp_avg_sq), got {tensor_lists!r:.80}")
    lists = [list(t) for t in tensor_lists]
    if not lists[0]:
        raise FusedAdamError("tensor_lists[0] is empty: pass at least one parameter with a gradient")
    for list_index, tensors in enumerate(lists):
        if len(tensors) != len(lists[0]):
            raise FusedAdamError(f"size mismatch among tensor lists: list {list_index} has {len(tensors)} tensors, "
                                 f"list 0 has {len(lists[0])}; pass one grad, param, exp_avg, exp_avg_sq "
                                 "per parameter")
        for t, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor):
                raise FusedAdamError(f"tensor_lists[{list_index}][{t}] is {type(tensor).__name__}, not a torch.Tensor")
            if not tensor.is_contiguous():
                raise FusedAdamError(f"tensor_lists[{list_index}][{t}] is not contiguous: call .contiguous() first")
            if tensor.numel() != lists[0][t].numel():
                raise FusedAdamError(f"size mismatch: tensor_lists[{list_index}][{t}] has {tensor.numel()} elements, "
                                     f"the gradient has {lists[0][t].numel()}")
            if tensor.dtype not in (torch.float16, torch.float32, torch.float64):
                raise FusedAdamError(f"tensor_lists[{list_index}][{t}] is {tensor.dtype}; the kernel dispatches "
                                     "double, float and half only")
    return lists


class CpuFusedOps(types.ModuleType):
    """A stand-in for ORT's `fused_ops` extension whose multi_tensor_adam runs on CPU tensors;
    `launches` records the multi_tensor_apply plan of every call (one list per call)."""

    def __init__(self):
        super().__init__(FUSED_OPS, "CPU transcription of fused_ops (ortlab.ortmodule.fused_adam)")
        self.TorchTensorVector = list  # the real one is a pybind std::vector<at::Tensor>
        self.launches = []

    def multi_tensor_adam(self, chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step,
                          mode, bias_correction, weight_decay):
        """CPU multi_tensor_adam_cuda: host-side bias corrections, then AdamFunctor on every chunk of
        every launch multi_tensor_apply would make."""
        lists = _check_lists(tensor_lists)
        if int(mode) not in (0, 1, 2):
            raise FusedAdamError(f"mode must be an AdamWMode (0, 1 or 2), not {mode!r}")
        bc1, bc2, lr_corrected = bias_corrections(lr, beta1, beta2, step, bias_correction)
        flats = [[t.view(-1) for t in tensors] for tensors in lists]
        plan = plan_launches([t.numel() for t in lists[0]], chunk_size)
        for launch in plan:
            for t, chunk in launch.blocks:
                lo, hi = chunk * chunk_size, (chunk + 1) * chunk_size
                g, p, m, v = (flat[t][lo:hi] for flat in flats)
                adam_functor(g, p, m, v, beta1, beta2, epsilon, lr, lr_corrected, bc1, bc2, int(mode),
                             weight_decay)
        self.launches.append(plan)

    def __repr__(self):
        return f"CpuFusedOps({len(self.launches)} multi_tensor_adam calls recorded)"


@contextlib.contextmanager
def cpu_fused_ops():
    """Let ORT's own FusedAdam run on CPU inside the block: installs CpuFusedOps as
    `...torch_cpp_extensions.fused_ops` and makes `torch.cuda.IntTensor` build a CPU int32 tensor
    (FusedAdam.__init__'s overflow flag); both are removed on exit. Yields the CpuFusedOps."""
    package = quiet_import("onnxruntime.training.ortmodule.torch_cpp_extensions")
    stub = CpuFusedOps()
    with patched(sys.modules, FUSED_OPS, stub), patched(package, "fused_ops", stub), \
            patched(torch.cuda, "IntTensor", lambda data: torch.tensor(data, dtype=torch.int32)):
        yield stub



def fused_adam_class():
    """(FusedAdam, AdamWMode) from onnxruntime.training.optim."""
    optim = quiet_import("onnxruntime.training.optim")
    return optim.FusedAdam, optim.AdamWMode


def cuda_errors(params=None):
    """What the real FusedAdam says on this machine: {call: 'Type: first line'} for constructing it
    and for importing its extension ('' where the call worked, e.g. on a GPU with the extension)."""
    fused_adam, _ = fused_adam_class()
    params = list(params) if params is not None else [torch.nn.Parameter(torch.zeros(2))]
    found = {}
    for call, action in (("FusedAdam(params)", lambda: fused_adam(params)),
                         ("from ...torch_cpp_extensions import fused_ops",
                          lambda: importlib.import_module(FUSED_OPS))):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                action()
            found[call] = ""
        except Exception as exc:  # the error is the finding
            found[call] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return found


def _mode(mode):
    """An AdamWMode from a name, an int or an AdamWMode."""
    _, adamw_mode = fused_adam_class()
    try:
        return adamw_mode[mode] if isinstance(mode, str) else adamw_mode(mode)
    except (KeyError, ValueError):
        raise FusedAdamError(f"mode must be one of {MODES} (or 0, 1, 2), not {mode!r}") from None


def train_params(make_optimizer, module="mlp", steps=5, seed=0):
    """Train a fresh zoo model `module` for `steps` steps with make_optimizer(params) on the zoo's
    example batches (seed + step); returns all parameters flattened into one float64 tensor."""
    steps = _positive(steps, "steps")
    model = module if isinstance(module, torch.nn.Module) else models.get(module, dropout=0.0)
    model = copy.deepcopy(model)
    torch.manual_seed(seed)
    optimizer = make_optimizer(model.parameters())
    for step in range(steps):
        inputs = model.example_inputs(seed=seed + step)
        optimizer.zero_grad()
        model(*inputs).backward()
        optimizer.step()
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def check_adam_arguments(lr, weight_decay, eps):
    """lr, weight_decay and eps by torch.optim.Adam's rules (finite numbers >= 0: ortlab.training.optimizers).
    ORT's FusedAdam.__init__ (onnxruntime/training/optim/fused_adam.py) checks none of them: it puts them in
    its param group as given, and a NaN or negative value trains to NaN without an error."""
    try:
        check_hyperparameters(lr, eps=eps, weight_decay=weight_decay)
    except OptimizerError as exc:
        raise FusedAdamError(f"{exc}. ORT's FusedAdam.__init__ (onnxruntime/training/optim/fused_adam.py) does "
                             "not check its arguments and would train to NaN or nonsense without an error; ortlab "
                             "refuses by torch.optim.Adam's rules, and refuses inf too") from None


def fused_adam_params(module="mlp", steps=5, lr=1e-2, weight_decay=0.01, eps=1e-6, mode="ADAMW_TRANSFORMERS",
                      chunk_size=None):
    """ORT's FusedAdam (its step(), with the CPU kernel) trained `steps` steps: (params, CpuFusedOps).
    chunk_size overrides MultiTensorApply's 2048 * 32 (to show chunking on small models). lr, weight_decay
    and eps are checked as torch.optim.Adam checks them (check_adam_arguments); ORT's FusedAdam does not."""
    fused_adam, _ = fused_adam_class()
    check_adam_arguments(lr, weight_decay, eps)
    if chunk_size is not None:
        chunk_size = _positive(chunk_size, "chunk_size")
    mode = _mode(mode)
    with cpu_fused_ops() as ops:
        def make(params):
            optimizer = fused_adam(params, lr=lr, eps=eps, weight_decay=weight_decay, adam_w_mode=mode)
            if chunk_size is not None:
                optimizer._multi_tensor_applier.chunk_size = chunk_size
            return optimizer
        params = train_params(make, module, steps)
    return params, ops


def compare_with_torch(module="mlp", steps=5, lr=1e-2, weight_decay=0.01, eps_values=(1e-8, 1e-6),
                       modes=("ADAMW_TORCH", "ADAMW_TRANSFORMERS", "ADAM_L2_REGULARIZATION"), tolerance=None):
    """ORT's FusedAdam (CPU kernel) against torch after `steps` steps, as a Table: per mode and eps,
    the torch reference (AdamW(eps=1e-8) for the AdamW modes, Adam(weight_decay) for L2) and the
    largest parameter difference (2 significant digits). FusedAdam's defaults (ADAMW_TRANSFORMERS,
    eps 1e-6) are marked. With a `tolerance` (e.g. 1e-5), a difference at or below it prints as the
    verdict 'equal (<= 1e-05)' instead of float32 rounding noise that varies with the CPU."""
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
                                  or not tolerance > 0):
        raise FusedAdamError(f"tolerance must be a positive number (e.g. 1e-5) or None, not {tolerance!r}")
    eps_values = as_list(eps_values, "eps_values", "eps values", "(1e-8, 1e-6)", FusedAdamError)
    for eps in eps_values:
        check_adam_arguments(lr, weight_decay, eps)
    references = {
        "AdamW": train_params(lambda p: torch.optim.AdamW(p, lr=lr, eps=1e-8, weight_decay=weight_decay),
                              module, steps),
        "Adam": train_params(lambda p: torch.optim.Adam(p, lr=lr, eps=1e-8, weight_decay=weight_decay),
                             module, steps)}
    rows = []
    for name in modes:
        mode = _mode(name)
        reference = "Adam" if mode.value == 0 else "AdamW"
        for eps in eps_values:
            got, _ = fused_adam_params(module, steps, lr, weight_decay, eps, mode)
            defaults = [what for what, is_default in (("mode", mode.value == 1), ("eps", eps == 1e-6))
                        if is_default]
            gap = float((got - references[reference]).abs().max())
            shown = f"equal (<= {tolerance:.0e})" if tolerance is not None and gap <= tolerance else \
                float(f"{gap:.1e}")
            rows.append((mode.name, eps, f"torch.optim.{reference}(eps=1e-08)", shown,
                         " and ".join(defaults) + (" (FusedAdam's default)" if defaults else "")))
    return Table(("adam_w_mode", "eps", "against", "max |param diff|", "default"), rows)


def grouping_table(sizes, chunk_size=CHUNK_SIZE, block=1024):
    """Kernel launches to update tensors of `sizes` elements, three ways: a plain loop (one launch
    per tensor), ORT's multi_tensor_apply (plan_launches, depth 4) and ortlab's flat-buffer
    multi-tensor SGD (ortlab.triton_kernels.optimization.sgd_step_multi_tensor: one launch of
    ceil(total / block) programs)."""
    sizes = _sizes(sizes)
    plan = plan_launches(sizes, chunk_size)
    total = sum(sizes)
    rows = [("per-tensor loop", len(sizes), sum(-(-n // block) for n in sizes),
             f"{block} elements / program"),
            ("ORT multi_tensor_apply", len(plan), sum(len(launch.blocks) for launch in plan),
             f"{chunk_size} elements / block, <= {DEPTH_TO_MAX_TENSORS[3]} tensors and "
             f"{DEPTH_TO_MAX_BLOCKS[3]} blocks / launch"),
            ("ortlab flat buffer", 1, -(-total // block), f"{block} elements / program, params contiguous")]
    return Table(("how", "launches", "blocks / programs", "unit"), rows)


# -- FP16_Optimizer ---------------------------------------------------------------------------
def fp16_optimizer_alone(optimizer=None):
    """ORT's FP16_Optimizer on a plain torch optimizer: {'same object', 'warning', 'step ran'}.
    With a type its registry does not know, it warns and returns the optimizer unmodified."""
    fp16 = quiet_import("onnxruntime.training.optim.fp16_optimizer").FP16_Optimizer
    if optimizer is None:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise FusedAdamError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = fp16(optimizer)
    ran = True
    try:
        returned.step()
    except Exception:  # a step needing gradients it lacks still counts as "it is the plain optimizer"
        ran = False
    return {"same object": returned is optimizer,
            "warning": "; ".join(f"{w.category.__name__}: {w.message}" for w in caught),
            "step ran": ran}


def fp16_modifier_registry():
    """What FP16_Optimizer knows, as a Table: optimizer type -> ORT modifier class (and its file)."""
    registry = quiet_import("onnxruntime.training.optim._modifier_registry")
    rows = [(name, cls.__name__, cls.__module__.split(".")[-1] + ".py")
            for name, cls in registry.OptimizerModifierTypeRegistry._MAP.items()]
    rows.append(("accelerate.utils.deepspeed.DeepSpeedOptimizerWrapper",
                 registry._AccelerateDeepSpeedZeROModifier.__name__, "_modifier_registry.py"))
    return Table(("optimizer type", "modifier", "ORT file"), rows)


def fp16_with_deepspeed():
    """FP16_Optimizer on a real DeepSpeed ZeRO-1 optimizer, in one gloo rank (DeepSpeed lives apart from the
    environment: ortlab.distributed.zero_deepspeed): a sentence saying what ORT's DeepSpeedZeROModifier did."""
    from ortlab.distributed import launch  # local: this module's loops name a variable `launch` (ruff F402)

    found = launch(fp16_optimizer_on_deepspeed, 1, timeout=300)[0]
    changed = [w for w in found["warnings"] if "has changed after version" in w]
    skipped = [w for w in found["warnings"] if w.startswith("Skip modifying")]
    if not found["same object"]:
        return f"runs here: FP16_Optimizer modified DeepSpeed {found['deepspeed']}'s {found['optimizer']}"
    return (f"runs here, and ORT declines: FP16_Optimizer returned DeepSpeed {found['deepspeed']}'s ZeRO-1 "
            f"optimizer unmodified ({len(changed)} of its functions differ from the DeepSpeed 0.9.2 source ORT "
            f"compares them with; {skipped[0] if skipped else 'no skip warning'!r}); the source check comes "
            "before the device check in _ds_modifier.py, so a GPU would not change this")


def fp16_with(library):
    """Whether FP16_Optimizer can be shown with 'deepspeed' or 'apex' here: a sentence saying what
    happened (for DeepSpeed, installed apart by `make setup`, fp16_with_deepspeed's run), or when
    importing the library failed, and what the modifier would need."""
    if library not in ("deepspeed", "apex"):
        raise FusedAdamError(f"library must be 'deepspeed' or 'apex', not {library!r}")
    if library == "deepspeed" and deepspeed_available():
        return fp16_with_deepspeed()
    try:
        with contextlib.redirect_stdout(None):
            importlib.import_module(library)
    except Exception as exc:
        return (f"not possible here, because {library} is not installed ({type(exc).__name__}: {exc}); "
                "ORT's modifiers also need CUDA (torch.cuda.FloatTensor, fused_ops.multi_tensor_l2norm / "
                "multi_tensor_scale in optim/_modifier.py)")
    return (f"{library} imports here; ORT's modifier still needs CUDA (torch.cuda.FloatTensor and "
            "fused_ops.multi_tensor_l2norm / multi_tensor_scale in optim/_modifier.py)")
