"""timm and torchvision without torch._dynamo: what every vitbench process that builds a model would
pay for nothing. Importing either imports torch._dynamo and triton (about 900 modules: 0.9 s of
start-up here, two on a loaded 2-core machine, in every `vitbench run` and every test's subprocess)
for code that matters only under `torch.compile`:

- torchvision's package import runs `torchvision/ops/roi_align.py`, whose first line takes
  `is_compile_supported` from `torch._dynamo.utils`; roi_align calls it only while compiling;
- timm binds `torch.compiler.disable` as its `disable_compiler` (timm/layers/typing.py) and
  decorates NaFlex-ViT's methods with it when `timm.models` is imported; `torch.compiler.disable`
  imports torch._dynamo to make its wrapper.

While the first of them is imported, `torch._dynamo.utils` resolves to a stand-in (its
`is_compile_supported` loads the real one on its first call; any other name asked of it loads the
real module, so nothing sees the stand-in instead of torch's own) and `torch.compiler.disable` to a
lazy one (what it decorates is wrapped by the real `torch._dynamo.disable` on its first call). Once
the import is done both are torch's own again: a later `import torch._dynamo` (`--compile`) is the
real one, and so is every later `torch.compiler.disable`. Nothing is done where torch._dynamo is
already imported. `install()` runs when `vitbench` is imported (vitbench/__init__.py);
tests/test_light_commands.py checks that no built-in protocol's run imports torch._dynamo or triton.

torch itself wraps some functions in `torch._disable_dynamo`, whose wrapper imports torch._dynamo
on its first call to make the disabled version it keeps (as `fn.__dynamo_disable`): every
optimizer's `add_param_group` (in its constructor), `zero_grad`, `state_dict` and
`load_state_dict`, and the many reference kernels that run a network on the meta device (a FLOP
count, vitbench/flop_counts.py). `defer_disable` gives such a
wrapper a kept version that calls the function as it is while torch._dynamo is not imported (nothing
can be compiling then, so there is nothing to disable) and hands back to torch's own from the first
call after it is. And torch's optimizers wrap `step` in `_use_grad_for_differentiable`, which imports
torch._dynamo on every call for two `graph_break()`s (no-ops unless compiling): `defer_step` gives SGD
and Adam (AdamW's too) a `step` that does the rest of what that wrapper does (the grad mode the
optimizer asks for) and calls torch's own wrapper once torch._dynamo is imported. The reference
kernels' wrappers are too many to find one by one (and are made inside others): while a FLOP count
runs, `disable_only()` puts a stand-in at torch._dynamo whose `disable` gives each the same kept
version as `defer_disable`; any other name asked of it loads the real module.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

DYNAMO = "torch._dynamo"
DEFERRED = "torch._dynamo.utils"
KEPT = "__dynamo_disable"  # where a torch._disable_dynamo wrapper keeps its disabled function
PACKAGES = ("torchvision", "timm")


def _is_compile_supported(device_type: str) -> bool:
    from torch._dynamo.utils import is_compile_supported  # the real one, on the first call (under compile)

    return is_compile_supported(device_type)


def _lazy_disable(fn=None, recursive=True, *, reason=None):
    """torch.compiler.disable, its torch._dynamo import put off until what it wraps is first called."""
    if fn is None:  # the decorator-factory form: nothing to put off
        import torch._dynamo

        return torch._dynamo.disable(fn, recursive, reason=reason)
    disabled = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            import torch._dynamo

            disabled = torch._dynamo.disable(fn, recursive, reason=reason)
        return disabled(*args, **kwargs)

    return wrapper


class _StandIn(types.ModuleType):
    """`torch._dynamo.utils` while timm or torchvision is imported: roi_align's one name, lazily; any
    other name loads the real module (removing the stand-in first) and answers from it."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):  # `inspect` asks every module for `__file__`
            raise AttributeError(name)
        if sys.modules.get(DEFERRED) is self:
            del sys.modules[DEFERRED]
        return getattr(importlib.import_module(DEFERRED), name)


class _Deferring(importlib.abc.Loader):
    """A package's own loader, run with torch._dynamo put off; its spec gets the loader back."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        import torch.compiler

        stand_in = _StandIn(DEFERRED)
        stand_in.is_compile_supported = _is_compile_supported  # type: ignore[attr-defined]
        sys.modules[DEFERRED] = stand_in
        disable, torch.compiler.disable = torch.compiler.disable, _lazy_disable
        try:
            self.loader.exec_module(module)
        finally:
            torch.compiler.disable = disable
            defer_torch_optimizers()
            if sys.modules.get(DEFERRED) is stand_in:
                del sys.modules[DEFERRED]
            module.__loader__ = self.loader
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        # already imported for real, or a package imported while another is (timm imports torchvision):
        # the outer import's deferral covers it
        if name not in PACKAGES or DYNAMO in sys.modules or DEFERRED in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Deferring(spec.loader)
        return spec


def defer_disable(wrapper: Any) -> None:
    """Put off the torch._dynamo import of one `torch._disable_dynamo` wrapper (see the top)."""
    fn = getattr(wrapper, "__wrapped__", None)
    if fn is None or DYNAMO in sys.modules or getattr(fn, KEPT, None) is not None:
        return
    setattr(fn, KEPT, _as_is_until_dynamo(fn, lambda real: wrapper))


def _as_is_until_dynamo(fn: Any, then: Any) -> Any:
    """What a `torch._disable_dynamo` wrapper keeps for `fn` while torch._dynamo is not imported (or
    is the stand-in): `fn` as it is (nothing can be compiling); from the first call after the real
    module is imported, `then(module)`'s function, and torch's wrapper makes its own from then on."""

    def as_is_until_dynamo(*args, **kwargs):
        real = sys.modules.get(DYNAMO)
        if real is not None and not isinstance(real, _DisableOnly):
            fn.__dict__.pop(KEPT, None)
            return then(real)(*args, **kwargs)
        return fn(*args, **kwargs)

    return as_is_until_dynamo


def _disable(fn: Any, recursive: bool = True, wrapping: bool = True, **_: Any) -> Any:
    """The stand-in's `torch._dynamo.disable`, as torch's wrappers call it."""
    return _as_is_until_dynamo(fn, lambda real: real.disable(fn, recursive, wrapping=wrapping))


class _DisableOnly(types.ModuleType):
    """`torch._dynamo` while a network runs on the meta device: `disable` alone; any other name
    loads the real module (removing the stand-in first) and answers from it."""

    disable = staticmethod(_disable)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _remove(self)
        return getattr(importlib.import_module(DYNAMO), name)


def _remove(stand_in: types.ModuleType) -> None:
    import torch

    if sys.modules.get(DYNAMO) is stand_in:
        del sys.modules[DYNAMO]
    if torch.__dict__.get("_dynamo") is stand_in:
        del torch._dynamo


@contextlib.contextmanager
def disable_only():
    """torch._dynamo as the `_DisableOnly` stand-in for the block (see the top): a FLOP count on the
    meta device without its import (a second of every fresh machine's first dry run). Nothing is
    done where torch._dynamo is already imported. timm and torchvision are imported first: their
    deferred import needs torch._dynamo absent, not a stand-in."""
    import timm  # noqa: F401
    import torch

    if DYNAMO in sys.modules:
        yield
        return
    stand_in = _DisableOnly(DYNAMO)
    sys.modules[DYNAMO] = stand_in
    torch._dynamo = stand_in  # what `import torch._dynamo` then reads
    try:
        yield
    finally:
        _remove(stand_in)


def defer_step(optimizer: Any) -> None:
    """Put off the torch._dynamo import of an optimizer class's `_use_grad_for_differentiable` step."""
    import torch

    use_grad = optimizer.__dict__.get("step")
    if DYNAMO in sys.modules or getattr(getattr(use_grad, "__code__", None), "co_name", None) != "_use_grad":
        return  # already compiling-capable, already deferred, or a torch whose step is made otherwise
    func = use_grad.__wrapped__

    @functools.wraps(func)
    def step(self, *args, **kwargs):
        if DYNAMO in sys.modules:
            return use_grad(self, *args, **kwargs)
        was = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return func(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(was)

    optimizer.step = step


def defer_torch_optimizers() -> None:
    """What every optimizer vitbench trains with calls that imports torch._dynamo (see the top)."""
    import torch

    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        defer_disable(torch.optim.Optimizer.__dict__.get(name))
    for optimizer in (torch.optim.SGD, torch.optim.Adam):
        defer_step(optimizer)


def install() -> None:
    """Put torch._dynamo off past timm's and torchvision's imports, once per process."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


def flop_counter_mode() -> type:
    """torch's FlopCounterMode, its module loaded without triton: torch.utils.flop_counter imports
    `triton.runtime.jit` as it loads (0.3 s, a fresh machine's first dry run) only to register FLOP
    formulas for user-written triton kernels, which a count of an eager network on the meta device
    never meets. Where triton is not imported yet, it is hidden for that import (torch then takes
    it as absent, as on a machine without it, and its warning that it is, is held back); a later
    `import triton` (`--compile` on a GPU) is the real one."""
    import logging

    module = "torch.utils.flop_counter"
    if module in sys.modules or "triton" in sys.modules:
        return importlib.import_module(module).FlopCounterMode
    said = logging.getLogger(module)
    level = said.level
    sys.modules["triton"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    said.setLevel(logging.ERROR)
    try:
        return importlib.import_module(module).FlopCounterMode
    finally:
        said.setLevel(level)
        if sys.modules.get("triton", 0) is None:
            del sys.modules["triton"]
