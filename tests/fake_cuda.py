"""A CUDA device on the CPU, for tests of the device path.

Tensors on the fake device are ordinary CPU tensors that this TorchFunctionMode marks as
resident; Python sees `t.device == cuda:0` and `t.is_cuda`, while the kernels, autograd and the
values stay those of the CPU, so a whole trial really trains and its losses are real numbers.
What a GPU would refuse is refused here, with CUDA's own wording:

  * an op mixing a resident tensor with a host tensor of one or more dimensions ("Expected all
    tensors to be on the same device"); 0-dim host tensors pass, as CUDA takes them as scalars;
    indexing a resident tensor with host indices passes, as CUDA moves the indices itself;
  * `.numpy()` / `np.asarray` of a resident tensor; `pin_memory()` of a resident tensor.

and what a GPU does differently is recorded: every host sync (`.item()`, `.tolist()`, `bool()`,
copies to the host, `torch.cuda.synchronize`) with the benchmark/ line that asked for it; every
host-to-device copy (pinned? non_blocking?); the bytes resident at once (for
`torch.cuda.max_memory_allocated`). Under `torch.autocast("cuda")` ops run under CPU autocast
of the same dtype (CPU and CUDA autocast cast nearly the same ops).

Why not the alternatives: a CPU-only PyTorch has no CUDA device guard, so a tensor whose real
device is cuda (FakeTensorMode, a wrapper subclass) aborts the process in autograd; FakeTensor
has no values (`.item()` fails); `meta` has neither values nor CUDA's code paths; torch 2.13 ships
no PrivateUse1 test backend ("openreg") in its wheel. The mode is precise at the level of
Python-visible torch calls, which is where a program chooses devices: each call's inputs are
checked, not the ops a kernel runs inside, and tensors made inside C++ carry no mark (autograd's
gradients are marked when read, as `param.grad` of a resident parameter).
"""

from __future__ import annotations

import sys
import weakref
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

CUDA = torch.device("cuda", 0)
MIXED = (
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
)

T = torch.Tensor
DEVICE, IS_CUDA, IS_CPU = T.device.__get__, T.is_cuda.__get__, T.is_cpu.__get__
DATA_SET = T.data.__set__
TO_HOST_VALUE = {T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__}
NO_NUMPY = {T.numpy, T.__array__}
INDEXING = {T.__getitem__, T.__setitem__}
METADATA = {torch._has_compatible_shallow_copy_type}  # compares kinds of tensor, not values
# Ops outside TensorIterator, which refuse even a 0-dim host tensor next to a device one.
STRICT = {
    torch.stack,
    torch.cat,
    torch.matmul,
    T.matmul,
    T.__matmul__,
    torch.mm,
    torch.bmm,
    torch.einsum,
    torch.outer,
    F.linear,
    F.embedding,
    F.cross_entropy,
    F.nll_loss,
    torch.gather,
    T.gather,
    torch.index_select,
    T.index_select,
    T.scatter,
    T.scatter_,
    T.scatter_add_,
    T.index_add_,
}


@dataclass(frozen=True)
class Sync:
    what: str  # item, tolist, __bool__, to cpu, synchronize, ...
    where: str  # "file.py:line function", the innermost benchmark/ frame that asked


@dataclass(frozen=True)
class Upload:
    pinned: bool
    non_blocking: bool
    where: str


def caller(depth: int = 1) -> str:
    """The innermost `depth` frames in the benchmark package (the code under test), innermost
    first, else the innermost frame outside torch and this file."""
    frame, found, fallback = sys._getframe(1), [], None
    while frame is not None and len(found) < depth:
        path = frame.f_code.co_filename
        if "/benchmark/" in path:
            found.append(
                f"{path.rsplit('/benchmark/', 1)[1]}:{frame.f_lineno} {frame.f_code.co_name}"
            )
        elif fallback is None and "/torch/" not in path and path != __file__:
            fallback = f"{path.rsplit('/', 1)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return " <- ".join(found) or fallback or "?"


class FakeCuda(TorchFunctionMode):
    """Enter it (and `patch` torch.cuda) around code that should believe it runs on one GPU."""

    def __init__(self):
        super().__init__()
        self.resident = WeakIdKeyDictionary()
        self.pinned = WeakIdKeyDictionary()
        self.syncs: list[Sync] = []
        self.uploads: list[Upload] = []
        self.calls: Counter[str] = Counter()  # the torch.cuda functions the code called
        self.ops: Counter[str] = Counter()  # torch calls on the device, by name
        self._live: dict[int, list[int]] = {}  # storage pointer -> [tensors marked, bytes]
        self.allocated = self.peak = 0

    # ---- marks and memory ---------------------------------------------------------------------
    def on_device(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self.resident

    def mark(self, t: torch.Tensor) -> torch.Tensor:
        if t in self.resident:
            return t
        self.resident[t] = True
        storage = t.untyped_storage()
        ptr, size = storage.data_ptr(), storage.nbytes()
        entry = self._live.setdefault(ptr, [0, size])
        if entry[0] == 0:
            self.allocated += size
            self.peak = max(self.peak, self.allocated)
        entry[0] += 1
        weakref.finalize(t, self._release, ptr)
        return t

    def _release(self, ptr: int) -> None:
        entry = self._live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.allocated -= entry[1]
            del self._live[ptr]

    def _mark_all(self, out):
        return tree_map(lambda t: self.mark(t) if isinstance(t, torch.Tensor) else t, out)

    # ---- the mode -------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (DEVICE, IS_CUDA, IS_CPU) and self.on_device(args[0]):
            return {DEVICE: CUDA, IS_CUDA: True, IS_CPU: False}[func]
        if func is T.get_device and self.on_device(args[0]):
            return 0
        if func == DATA_SET:  # Module.to: param.data = param.to(device)
            func(*args)
            if self.on_device(args[1]):
                self.mark(args[0])
            else:
                self.resident.pop(args[0], None)
            return None
        if func in (T.to, T.cuda, T.cpu):
            return self.move(func, args, kwargs)
        if func is T.pin_memory:
            return self.pin(args[0])
        if func is T.is_pinned:
            return args[0] in self.pinned
        if func in NO_NUMPY and self.on_device(args[0]):
            raise TypeError(
                "can't convert cuda:0 device type tensor to numpy. "
                "Use Tensor.cpu() to copy the tensor to host memory first."
            )
        if func in TO_HOST_VALUE and self.on_device(args[0]):
            self.syncs.append(Sync(func.__name__, caller()))
        device = kwargs.get("device")
        if device is not None:  # a factory (torch.zeros(..., device=...))
            on_cuda = torch.device(device).type == "cuda"
            out = self.run(func, args, {**kwargs, "device": "cpu"} if on_cuda else kwargs)
            return self._mark_all(out) if on_cuda else out
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on = [self.on_device(t) for t in flat]
        if any(on):
            self.ops[name(func)] += 1
            self.check(func, args, flat, on)
            return self._mark_all(self.run(func, args, kwargs))
        return self.run(func, args, kwargs)

    def check(self, func, args, flat, on) -> None:
        """CUDA's rule: every tensor of an op on the device, but for scalars and host indices."""
        if func is T.copy_ or func in METADATA:  # copies cross devices
            return
        if func in INDEXING:
            if not self.on_device(args[0]):
                raise RuntimeError(
                    "indices should be either on cpu or on the same device as the "
                    "indexed tensor (cpu)"
                )
            value = args[2] if func is T.__setitem__ else None
            index = tree_flatten(args[1])[0]
            basic = not any(isinstance(i, torch.Tensor) for i in index)
            if (
                isinstance(value, torch.Tensor)
                and not self.on_device(value)
                and value.dim() > 0
                and not basic
            ):  # index_put_ wants its values on the device
                raise RuntimeError(f"{MIXED} (when calling {name(func)}, from {caller(3)})")
            return
        strict = func in STRICT
        if any(not o and (strict or t.dim() > 0) for t, o in zip(flat, on)):
            raise RuntimeError(f"{MIXED} (when calling {name(func)}, from {caller(3)})")

    def run(self, func, args, kwargs):
        """The op on the CPU; under torch.autocast("cuda"), under CPU autocast of its dtype."""
        if torch.is_autocast_enabled("cuda") and not torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", dtype=torch.get_autocast_dtype("cuda")):
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def move(self, func, args, kwargs):
        """Tensor.to / .cuda / .cpu: a copy when the device changes, as on a GPU."""
        self_, rest = args[0], args[1:]
        if func is T.cuda:
            device, dtype, non_blocking = CUDA, None, kwargs.get("non_blocking", False)
        elif func is T.cpu:
            device, dtype, non_blocking = torch.device("cpu"), None, False
        else:
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*rest, **kwargs)
        here, copy = self.on_device(self_), kwargs.get("copy", False)
        if device is None or (device.type == "cuda") == here:  # no move: a dtype at most
            if (dtype is None or dtype == self_.dtype) and not copy:
                return self_
            out = self_.to(dtype=dtype or self_.dtype, copy=copy)
            return self.mark(out) if here else out
        out = self_.to(dtype=dtype or self_.dtype, copy=True)
        if device.type == "cuda":
            self.uploads.append(Upload(self_ in self.pinned, bool(non_blocking), caller()))
            return self.mark(out)
        self.syncs.append(Sync("to cpu", caller()))
        return out

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        if self.on_device(t):
            raise RuntimeError(
                "cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned"
            )
        out = t.clone()
        self.pinned[out] = True
        return out

    # ---- torch.cuda -----------------------------------------------------------------------------
    def patch(self, monkeypatch, capability: tuple[int, int] = (9, 0)) -> None:
        """torch.cuda as one GPU of `capability` (9.0: an H100) whose memory counters are ours."""

        def record(name, result=None):
            def call(*args, **kwargs):
                self.calls[name] += 1
                if name == "synchronize":
                    self.syncs.append(Sync("synchronize", caller()))
                return result() if callable(result) else result

            monkeypatch.setattr(torch.cuda, name, call)

        record("is_available", True)
        record("is_bf16_supported", True)
        record("device_count", 1)
        record("current_device", 0)
        record("get_device_name", "Fake GPU (CPU)")
        record("get_device_capability", capability)
        record("synchronize")
        record("reset_peak_memory_stats", self.reset_peak)
        record("max_memory_allocated", lambda: self.peak)
        group = torch._C._group_tensors_by_device_and_dtype

        def group_on_device(tensorlistlist, with_indices=False):
            """foreach ops group by the C++ (real) device: name the group's device as Python sees
            it, else clip_grad_norm_ would copy its scale to the "host" (a sync CUDA never makes)."""
            return {
                (CUDA if lists[0] and self.on_device(lists[0][0]) else device, dtype): (
                    lists,
                    indices,
                )
                for (device, dtype), (lists, indices) in group(tensorlistlist, with_indices).items()
            }

        monkeypatch.setattr(torch._C, "_group_tensors_by_device_and_dtype", group_on_device)

    def reset_peak(self) -> None:
        self.peak = self.allocated


def name(func) -> str:
    return getattr(func, "__name__", None) or str(func)


@contextmanager
def fake_cuda(monkeypatch, capability: tuple[int, int] = (9, 0)):
    """`with fake_cuda(monkeypatch) as gpu:` code inside believes it has one GPU; see the module
    docstring. The TF32 flags a CUDA trial sets are restored after, and the process's cached
    hardware description (a row's `hardware`) is read afresh inside and after: else whichever
    test ran first would name the machine for the other."""
    from benchmark.store.provenance import hardware

    hardware.cache_clear()
    gpu = FakeCuda()
    gpu.patch(monkeypatch, capability)
    _orig_param_new = torch.nn.Parameter.__new__

    def param_new(cls, data=None, requires_grad=True):  # Parameter(...) of a resident tensor
        p = _orig_param_new(cls, data, requires_grad)  # (copy.deepcopy, Module.to) stays there
        return gpu.mark(p) if gpu.on_device(data) else p

    monkeypatch.setattr(torch.nn.Parameter, "__new__", staticmethod(param_new))
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        with gpu:
            yield gpu
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        hardware.cache_clear()
