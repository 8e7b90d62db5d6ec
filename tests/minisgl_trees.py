"""mini-sglang's trees for the tests: the 20fcd7f snapshot
(`../shared/upstream/mini-sglang-20fcd7f.tar.gz`, or `MINISGL_SNAPSHOT`) and the merge of its pull
request #111 into it (`mini-sglang-pr111-21b391b.tar.gz`, or `MINISGL_PR111_SNAPSHOT`), unpacked
with the patches of docs/findings/mini-sglang.md applied: each `FIX_*` is one bug's patch as
(old, new) text edits."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT.parent / "shared/upstream"
SNAPSHOT = Path(os.environ.get("MINISGL_SNAPSHOT", UPSTREAM / "mini-sglang-20fcd7f.tar.gz"))
PR111_SNAPSHOT = Path(
    os.environ.get("MINISGL_PR111_SNAPSHOT", UPSTREAM / "mini-sglang-pr111-21b391b.tar.gz")
)

# The fixes of the four documented overlap bugs, by bug, as (old, new) text in scheduler.py.
Edit = tuple[str, str] | tuple[str, str, str]
FIX_1 = [  # finished by the tokens the host has, not by `can_decode` (it counts launched rounds)
    (
        "                finished = not req.can_decode",
        "                finished = len(req.input_ids) >= req.max_device_len",
    ),
]
FIX_2 = [  # a request that finished (or was aborted) earlier is skipped entirely
    (
        "                if isinstance(req, ChunkedReq):\n",
        "                if isinstance(req, ChunkedReq) or req in self.finished_reqs:\n",
    ),
    (
        "                # NOTE: overlap scheduling may make the request freed twice, skip second"
        " free\n                if finished and req not in self.finished_reqs:",
        "                if finished:",
    ),
]
FIX_3 = [
    # 3: a freed row goes back once the batch in flight that writes it was processed (at once
    # when nothing is in flight), and the scheduler stream then waits for the engine stream: the
    # sample's token-pool write comes after the forward's copy_done, so no event covers it
    (
        """        self.finished_reqs: Set[Req] = set()""",
        """        self.finished_reqs: Set[Req] = set()
        self.rows_pending: List[int] = []""",
    ),
    (
        """        copy_done.synchronize()""",
        """        copy_done.synchronize()
        self._release_rows()""",
    ),
    (
        """    def _free_req_resources(self, req: Req) -> None:
        self.table_manager.free(req.table_idx)""",
        """    def _release_rows(self) -> None:
        if self.rows_pending:
            self.stream.wait_stream(self.engine.stream)
        for table_idx in self.rows_pending:
            self.table_manager.free(table_idx)
        self.rows_pending = []

    def _free_req_resources(self, req: Req) -> None:
        self.rows_pending.append(req.table_idx)""",
    ),
    (
        """        forward_input = self._schedule_next_batch()
        ongoing_data = None
        if forward_input is not None:
            with self.engine_stream_ctx:""",
        """        if last_data is None:
            self._release_rows()
        forward_input = self._schedule_next_batch()
        ongoing_data = None
        if forward_input is not None:
            with self.engine_stream_ctx:""",
    ),
    (
        """        self._process_last_data(last_data)
        return ongoing_data""",
        """        self._process_last_data(last_data)
        if ongoing_data is None:
            self._release_rows()
        return ongoing_data""",
    ),
    (
        """        self._process_last_data(ongoing_data)

    @torch.inference_mode()""",
        """        self._process_last_data(ongoing_data)
        self._release_rows()

    @torch.inference_mode()""",
    ),
]
FIX_4 = [  # an abort drops the result of the request's batch in flight, wherever the request is
    (
        """            req_to_free = req_to_free or self.decode_manager.abort_req(msg.uid)
            if req_to_free is not None:
                self._free_req_resources(req_to_free)""",
        """            req_to_free = req_to_free or self.decode_manager.abort_req(msg.uid)
            req_to_free = req_to_free or next(
                (
                    r
                    for r in self.inflight_reqs
                    if r.uid == msg.uid
                    and r not in self.finished_reqs
                    and not isinstance(r, ChunkedReq)
                ),
                None,
            )
            if req_to_free is not None:
                self._free_req_resources(req_to_free)
                self.finished_reqs.add(req_to_free)""",
    ),
    (
        """        self.finished_reqs: Set[Req] = set()""",
        """        self.finished_reqs: Set[Req] = set()
        self.inflight_reqs: List[Req] = []""",
    ),
    (
        """        batch, sample_args, input_mapping, output_mapping = forward_input""",
        """        batch, sample_args, input_mapping, output_mapping = forward_input
        self.inflight_reqs = batch.reqs""",
    ),
    (
        """        self.finished_reqs = new_finished_reqs""",
        """        self.finished_reqs = new_finished_reqs
        if self.inflight_reqs is batch.reqs:
            self.inflight_reqs = []""",
    ),
]
# Beyond the four, this checker found a fifth (test below): with the radix cache,
# `cache_req(finished=False)` frees the pages of a prefix that another request inserted
# meanwhile, while the request's page-table row still points at them and its later rounds read
# them (a KV use after free: a wrong token once the page is handed out again). Keeping them with
# the request until it ends is not a fix (admission did not reserve them: eviction runs dry);
# the row must point at the cached copy, ordered after the batch in flight that reads it.
NOT_A_FIX_5 = [
    (
        "cache.py",
        """        self._free(page_indices[old_handle.cached_len : cached_len])
        if finished:  # this tail part should be freed
            self._free(page_indices[new_handle.cached_len :])
        else:  # keep the tail part, update the handle""",
        """        duplicate = page_indices[old_handle.cached_len : cached_len]
        if finished:  # this tail part should be freed
            self._free(duplicate)
            self._free(page_indices[new_handle.cached_len :])
            for pages in getattr(req, "duplicate_pages", []):
                self._free(pages)
        else:  # keep the tail part, update the handle
            # the row still points at the duplicate pages: they go back when the request ends
            req.duplicate_pages = [*getattr(req, "duplicate_pages", []), duplicate.clone()]""",
    ),
]
# 6 (found once the device allocator was modelled): `_forward` writes the samples into the token
# pool on the engine stream through the write mapping *after* `copy_done` was recorded, so once
# the batch's result is processed and its inputs dropped, the allocator may hand the mapping's
# block to the scheduler stream's next allocation while that write still reads it.
# `record_stream` makes the allocator wait for the engine stream.
FIX_6 = [
    (
        """        self.token_pool[output_mapping] = forward_output.next_tokens_gpu\n""",
        """        self.token_pool[output_mapping] = forward_output.next_tokens_gpu
        for mapping in output_mapping:  # read on the engine stream after copy_done
            mapping.record_stream(self.engine.stream)\n""",
    ),
]
# 7 (not an overlap bug): admission counts a request's tokens against the free pages times
# `page_size`, but `CacheManager.allocate_paged` hands each request whole pages (its cached part
# is whole pages: the radix cache matches and inserts page-aligned prefixes, a chunk's rest starts
# in a page it holds). Count each request's tokens rounded up to whole pages, at admission and in
# the reservation the next requests of the same batch are admitted against.
FIX_7 = [
    (
        "prefill.py",
        "from minisgl.utils import init_logger\n",
        "from minisgl.utils import align_ceil, init_logger\n",
    ),
    (
        "prefill.py",
        "        estimated_len = extend_len + req.output_len\n",
        "        estimated_len = align_ceil(extend_len + req.output_len,"
        " self.cache_manager.page_size)\n",
    ),
    (
        "prefill.py",
        "        self.reserved_size += remain_len + pending_req.output_len\n",
        "        self.reserved_size += align_ceil(\n"
        "            remain_len + pending_req.output_len, self.cache_manager.page_size\n"
        "        )\n",
    ),
]
FIXES = FIX_6 + FIX_1 + FIX_2 + FIX_3 + FIX_4

# PR #111 defers an abort's free to `_free_pending_aborts`, called after `_process_last_data` at
# the end of both loops: FIX_3's rows go back after it (the rows it frees included).
FREE_PENDING = "self._free_pending_aborts(ongoing_data)"


def _after_pending_aborts(edit: tuple[str, str]) -> tuple[str, str]:
    """One of FIX_3's loop-end hunks, anchored on the PR's call that now ends the loop."""
    old, new = edit
    for call in ("self._process_last_data(last_data)", "self._process_last_data(ongoing_data)"):
        old, new = old.replace(call, FREE_PENDING), new.replace(call, FREE_PENDING)
    return old, new


FIX_3_PR111 = [*FIX_3[:4], *(_after_pending_aborts(edit) for edit in FIX_3[4:])]
# FIX_4 on the PR: its abort frees at once and marks the request finished, wherever it is (the
# PR's queue then stays empty).
FIX_4_PR111 = [
    (
        """            req_to_free = req_to_free or self.decode_manager.abort_req(msg.uid)
            # Immediately remove from managers to prevent scheduling, but defer resource freeing
            if req_to_free is not None:
                self.pending_aborts.add(req_to_free)""",
        FIX_4[0][1],
    ),
    *FIX_4[1:],
]
# The PR's tree with the patches of the bugs before bug 4 (its search finds bug 4's abort).
PR111_FIXES = FIX_6 + FIX_1 + FIX_2 + FIX_3_PR111


def unpack(into: Path, edits: Sequence[Edit] = (), snapshot: Path = SNAPSHOT) -> Path:
    """The snapshot unpacked into `into`, with `edits` applied: (old, new) in scheduler.py, or
    (file, old, new) with the file relative to `python/minisgl/scheduler`. Returns its root."""
    with tarfile.open(snapshot) as tar:
        (top,) = {Path(name).parts[0] for name in tar.getnames()}
        tar.extractall(into, filter="data")
    root = into / top
    for edit in edits:
        name, old, new = edit if len(edit) == 3 else ("scheduler.py", *edit)
        path = root / "python/minisgl/scheduler" / name
        text = path.read_text()
        assert text.count(old) == 1, old
        path.write_text(text.replace(old, new))
    return root


@functools.cache
def shared_tree() -> Path:
    """This process's unpacked 20fcd7f tree as shipped, for the tests that import mini-sglang in
    the process (it can import one tree only), removed when the process exits."""
    folder = tempfile.mkdtemp(prefix="overlapcheck-minisgl-")
    atexit.register(shutil.rmtree, folder, True)
    return unpack(Path(folder))
