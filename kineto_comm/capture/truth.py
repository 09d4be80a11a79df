"""What a capture knows of each collective call it makes: its phase and its module.

The attribution of calls (kineto_comm.analysis.attribution) is tested against this record,
written beside the traces (`truth-rank-{r}.json`): a list per rank, in the order the calls
were issued in the profiled steps, of `{step, collective, phase, module}`. It is taken at
capture time from what the program itself knows, never from the trace: torch.distributed's
functions are wrapped to log each call; the phase is the workload's own word where it says
(a pipeline's exchanges), else optimizer inside an optimizer step (torch.optim's global
step hooks), backward inside the autograd engine (`_current_graph_task_id`), forward inside
a module's forward (global module hooks), else other. The module is the FSDP parameter
group's (FSDP2's `FSDPParamGroup` methods that gather and reduce it), a DDP bucket's owner
(a comm hook: `hook` where its parameters span modules), the module a tensor-parallel
function was applied in (the workload passes it to its backward), else the innermost
module being run, named as torch.profiler names it (`Block_1`, class and index in the order
first run; the path from the outermost, DDP wrapper left out), else `unknown`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

UNKNOWN = "unknown"
HOOK = "hook"
ROOT = "(root)"
# torch.distributed function -> the collective the analyser calls it.
_WRAPPED = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather": "all_gather",
    "all_gather_single": "all_gather",  # FSDP2's (torch 2.13)
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "isend": "send",
    "send": "send",
    "irecv": "recv",
    "recv": "recv",
}
_WRAPPER_CLASSES = ("DistributedDataParallel", "FullyShardedDataParallel")


class Truth:
    """One rank's record (see the module docstring); `install` wraps torch once."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.active = False
        self.step = -1
        self._stack: list[str] = []  # the modules whose forward is running, innermost last
        self._names: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        self._optimizer = 0
        self._phase: list[str] = []
        self._module: list[str] = []
        self._busy = False  # inside a wrapped call (one call may make another)
        self._installed = False

    # ------------------------------------------------------------------ context

    @contextlib.contextmanager
    def phase(self, name: str | None) -> Iterator[None]:
        """The workload's own word for the phase of the calls made inside."""
        if name is None:
            yield
            return
        self._phase.append(name)
        try:
            yield
        finally:
            self._phase.pop()

    @contextlib.contextmanager
    def module(self, name: str | None) -> Iterator[None]:
        """The module the calls made inside belong to."""
        if name is None:
            yield
            return
        self._module.append(name)
        try:
            yield
        finally:
            self._module.pop()

    def here(self) -> str:
        """The innermost module being run (its profiler-style path), or UNKNOWN."""
        return self._stack[-1] if self._stack else UNKNOWN

    def name_of(self, module: Any) -> str:
        """A module as torch.profiler names it: class and its index among that class's
        modules in the order first run."""
        key = id(module)
        if key not in self._names:
            cls = type(module).__name__
            self._names[key] = f"{cls}_{self._counts.get(cls, 0)}"
            self._counts[cls] = self._counts.get(cls, 0) + 1
        return self._names[key]

    def _current_phase(self) -> str:
        import torch

        if self._phase:
            return self._phase[-1]
        if self._optimizer:
            return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return "forward" if self._stack else "other"

    def record(self, collective: str, phase: str | None = None) -> None:
        """Log one call made now (only in the profiled steps)."""
        if not self.active:
            return
        module = self._module[-1] if self._module else None
        if module is None:
            module = self.here() if self._current_phase() == "forward" else UNKNOWN
        self.calls.append(
            {
                "step": self.step,
                "collective": collective,
                "phase": phase or self._current_phase(),
                "module": module,
            }
        )

    # ------------------------------------------------------------------ install

    def install(self) -> None:
        """Wrap torch.distributed's collectives, hook every module's forward and every
        optimizer's step, and FSDP2's parameter groups."""
        if self._installed:
            return
        self._installed = True
        import torch.distributed as dist
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        def pre(mod: Any, args: Any) -> None:
            name = self.name_of(mod)
            if type(mod).__name__ in _WRAPPER_CLASSES:
                self._stack.append(self._stack[-1] if self._stack else "")
                return
            parent = self._stack[-1] if self._stack else ""
            self._stack.append(f"{parent}.{name}" if parent else name)

        def post(mod: Any, args: Any, out: Any) -> None:
            if self._stack:
                self._stack.pop()

        nn_module.register_module_forward_pre_hook(pre)
        nn_module.register_module_forward_hook(post, always_call=True)

        def opt_pre(*_: Any) -> None:
            self._optimizer += 1

        def opt_post(*_: Any) -> None:
            self._optimizer -= 1

        optim.register_optimizer_step_pre_hook(opt_pre)
        optim.register_optimizer_step_post_hook(opt_post)
        from torch.distributed import distributed_c10d as c10d

        for fn, collective in _WRAPPED.items():
            if hasattr(dist, fn):
                wrapped = self._wrap(getattr(dist, fn), collective)
                # Both names: P2POp checks its op against c10d's own isend and irecv.
                setattr(dist, fn, wrapped)
                if getattr(c10d, fn, None) is getattr(wrapped, "__wrapped__", None):
                    setattr(c10d, fn, wrapped)
        batch = dist.batch_isend_irecv

        def batch_isend_irecv(ops: list[Any]) -> Any:
            for op in ops:
                name = getattr(op.op, "__name__", "")
                self.record("send" if "send" in name else "recv", getattr(op, "truth_phase", None))
            was, self._busy = self._busy, True
            try:
                return batch(ops)
            finally:
                self._busy = was

        dist.batch_isend_irecv = batch_isend_irecv
        self._fsdp()

    def _wrap(self, fn: Callable[..., Any], collective: str) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if not self._busy:
                self.record(collective)
            was, self._busy = self._busy, True
            try:
                return fn(*args, **kwargs)
            finally:
                self._busy = was

        wrapped.__name__ = getattr(fn, "__name__", collective)
        wrapped.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapped

    def _fsdp(self) -> None:
        """FSDP2's parameter groups gather and reduce their own module's parameters: the
        calls made in their unshard and post_backward are that module's."""
        try:
            from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        except ImportError:
            return
        for method in ("unshard", "post_backward"):
            original = getattr(FSDPParamGroup, method)

            def wrapped(group: Any, *args: Any, _original: Any = original, **kw: Any) -> Any:
                with self.module(getattr(group, "_module_fqn", "") or ROOT):
                    return _original(group, *args, **kw)

            setattr(FSDPParamGroup, method, wrapped)

    def ddp_hook(self, model: Any) -> Callable[[Any, Any], Any]:
        """A DDP comm hook that records which module a bucket's parameters belong to (the
        one module holding them all, else `hook`) and all-reduces it as DDP does."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        owner = {}
        for path, mod in self._paths(model):
            for p in mod.parameters(recurse=False):
                owner[id(p)] = path

        def hook(state: Any, bucket: Any) -> Any:
            mods = {owner.get(id(p), UNKNOWN) for p in bucket.parameters()}
            with self.module(mods.pop() if len(mods) == 1 else HOOK):
                return default_hooks.allreduce_hook(state, bucket)

        # DDP checks a hook's annotations as objects (this module's are strings).
        import torch
        import torch.distributed as dist

        hook.__annotations__ = {
            "state": object,
            "bucket": dist.GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        return hook

    def _paths(self, model: Any) -> Iterator[tuple[str, Any]]:
        """Every module of `model` with its profiler-style path (as the hooks name them
        when run; named here in definition order, which is the order these models run)."""

        def walk(mod: Any, parent: str) -> Iterator[tuple[str, Any]]:
            name = self.name_of(mod)
            path = (
                parent
                if type(mod).__name__ in _WRAPPER_CLASSES
                else (f"{parent}.{name}" if parent else name)
            )
            yield path, mod
            for child in mod.children():
                yield from walk(child, path)

        yield from walk(model, "")

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.calls, indent=0) + "\n")


TRUTH = Truth()


def truth_path(out_dir: str | Path, rank: int) -> Path:
    """Where a rank's truth file goes, beside its trace."""
    return Path(out_dir) / f"truth-rank-{rank}.json"
