"""`plain`: the simulation's own torch calls, seen by no mode of ours and in inference mode."""

from __future__ import annotations

import torch

_len_stack = torch._C._len_torch_dispatch_stack
_pop = torch._C._pop_torch_dispatch_stack
_push = torch._C._push_on_torch_dispatch_stack
_all_disabled = torch._C._is_torch_function_all_disabled
_inference_on = torch.is_inference_mode_enabled


class plain:
    """Torch calls of the simulation itself: no mode of ours sees them, and in inference mode
    (a program stepped under `torch.inference_mode()` makes inference tensors of its buffers,
    which the streams update whenever simulated time runs, inside a step or not).

    Inside an aten call the dispatch mode is already off (torch pops it while its handler
    runs): then only torch functions and autograd are turned off, with their C guards. Where
    that is so already (a block inside another: the streams' ops run inside the block that runs
    simulated time) the block changes nothing, and inference mode already on stays as it is:
    read off torch's own state, not counted, so that an exception thrown into the stepping
    thread (the watchdog's) cannot leave a count behind."""

    __slots__ = ("_function", "_inference", "_modes", "_noop")

    def __enter__(self) -> None:
        # Outside an aten call (simulated time run by the host's own work), the modes on the
        # stack come off for the block; pre-dispatch modes (export's) are never active in a run.
        depth = _len_stack()
        inference = _inference_on()
        self._noop = not depth and inference and _all_disabled()
        if self._noop:
            return
        self._modes = [_pop(None) for _ in range(depth)] if depth else None
        self._function = torch._C.DisableTorchFunction()
        self._function.__enter__()
        if inference:
            self._inference = None
        else:
            self._inference = torch._C._InferenceMode(True)
            self._inference.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._noop:
            return
        if self._inference is not None:
            self._inference.__exit__(None, None, None)
        self._function.__exit__(None, None, None)
        if self._modes:
            for mode in reversed(self._modes):
                _push(mode)
