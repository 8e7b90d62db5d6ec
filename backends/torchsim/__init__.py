"""A simulated CUDA for real torch code: schedulers that call `torch.cuda` run unmodified, their
stream work in SimPy time on the simulator, every aten op traced as footprints.

Its parts each do one thing (as PyTorch's CUDA sanitizer is split into three):

* `memory.py`: device and pinned host buffers, each with a physical copy (what the simulated
  hardware holds at each simulated instant) and a logical copy (the values in program order, as if
  every op ran when it was issued); a view's cells are element offsets into its buffer.
* `allocators.py`: PyTorch's caching device and host allocators (size classes, segments, blocks
  split and merged), which decide when a freed tensor's memory goes to a later allocation: the
  same cells again for the same dtype, else a new buffer whose cells the trace maps to the old.
* `streams.py`: streams, events and host waits on the SimPy model (ordering and time), and the
  stand-ins for the `torch.cuda` calls that schedulers make.
* `dispatch.py` and `footprint.py`: a `TorchDispatchMode` that turns each aten call into reads and
  writes from its schema (`alias_info.is_write`), records them on the stream current at the call,
  and runs the op on that stream in simulated time.

`session.py` puts them together for the duration of a block (`SimulatedCuda`); `peek.py` reads a
run's device values in program order between steps (books), untraced.
"""
