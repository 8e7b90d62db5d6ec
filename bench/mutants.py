"""One-spot mutations of the reference scheduler: the bugs the checker was *not* built around.

Each mutant is an exact textual patch, `old -> new`, that must match exactly once in one file of
`reference/` (a refactor that breaks a patch fails `tests/test_mutants.py`). The mutation score
(`overlapcheck bench --mutants`, `bench/mutation_score.py`) applies each one to a copy of the
package and searches it like a user's plugged-in scheduler.

The classes come from the public fix history of SGLang, vLLM and mini-sglang (radix-cache lock
and split bugs, page reservation at admission, abort paths, chunked-prefill bookkeeping, stream
ordering, length and EOS stops); none of them is one of the seven named faults.

An `equivalent` mutant changes code but no behaviour any correct checker can observe here (a
performance or ordering choice, or a guard that the rest of the code already makes redundant):
it must stay silent, and `reason` says why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mutant:
    id: str
    file: str  # relative to reference/
    old: str
    new: str
    summary: str  # the bug class, where in the code, and where the class came from
    equivalent: bool = False
    reason: str = ""  # why an equivalent mutant is unobservable
    # The workload or invariant that reaches it, for a mutant today's search does not find.
    needs: str = ""


MUTANTS: tuple[Mutant, ...] = (
    # -- overlap: streams, events, the token pool ------------------------------------------------
    Mutant(
        "no-wait-stream",
        "scheduler.py",
        "            dev.wait_stream(dev.engine_stream, dev.scheduler_stream)\n",
        "",
        "launch: the engine stream no longer waits for the scheduler stream's input copies "
        "(the wait_stream that mini-sglang's engine does before each forward)",
    ),
    Mutant(
        "copy-done-before-forward",
        "scheduler.py",
        "            output = dev.forward(batch, dev.engine_stream)\n"
        "            # NOTE: copy-done must follow the forward and its D2H on the engine stream.\n"
        "            done_on = (\n"
        "                dev.scheduler_stream"
        " if self._fault(F.COPY_DONE_WRONG_STREAM) else dev.engine_stream\n"
        "            )\n"
        "            launched = Launched(batch, reqs, output, dev.record(done_on))\n",
        "            copy_done = dev.record(dev.engine_stream)\n"
        "            output = dev.forward(batch, dev.engine_stream)\n"
        "            launched = Launched(batch, reqs, output, copy_done)\n",
        "launch: copy-done recorded on the right stream but before the forward, so waiting on it "
        "does not wait for the D2H of the samples (event placement around `copy_done_event` in "
        "mini-sglang and SGLang's overlap worker)",
    ),
    Mutant(
        "read-before-synchronize",
        "scheduler.py",
        "            launched.copy_done.synchronize()\n"
        "            tokens = launched.output.tokens()\n",
        "            tokens = launched.output.tokens()\n"
        "            launched.copy_done.synchronize()\n",
        "process: the sampled tokens are read before waiting on copy-done (SGLang's overlap "
        "thread resolving future tokens before the copy event)",
    ),
    Mutant(
        "final-sample-to-dummy",
        "scheduler.py",
        "        if end < req.fill_len and not self._fault(F.CHUNK_SAMPLE_OVERWRITE):",
        "        if end <= req.fill_len and not self._fault(F.CHUNK_SAMPLE_OVERWRITE):",
        "sample cell: off by one, the final prefill chunk's sample also goes to the dummy row, "
        "so the first decode reads an unwritten token cell (mini-sglang ef4367f's dummy write, "
        "one chunk too far)",
    ),
    Mutant(
        "sample-position-off-by-one",
        "scheduler.py",
        "        return req.slot, end\n",
        "        return req.slot, end - 1\n",
        "sample cell: the sample is written at the last input position instead of the next one "
        "(off-by-one in the output position, SGLang `out_cache_loc` / vLLM slot-mapping fixes)",
    ),
    Mutant(
        "decode-position-off-by-one",
        "scheduler.py",
        "chunks = [Chunk(r, r.device_len - 1, r.device_len) for r in running]",
        "chunks = [Chunk(r, r.device_len, r.device_len + 1) for r in running]",
        "decode batch: the round's input position is one past the last sampled token (a "
        "positions/seq_lens off-by-one, common in vLLM and SGLang decode metadata fixes)",
    ),
    Mutant(
        "stale-page-table-on-hit",
        "scheduler.py",
        "RowWrite(req.slot, req.table_len, tuple(req.cells[req.table_len : end]))",
        "RowWrite(req.slot, start, tuple(req.cells[start:end]))",
        "page table: only the newly computed positions are copied in, so a prefix-cache hit "
        "leaves the reused slot's row pointing at the previous owner's KV (SGLang "
        "`req_to_token` writes of the prefix indices)",
    ),
    # -- lifecycle: admission, chunking, finish, abort ---------------------------------------------
    Mutant(
        "decode-before-prefilled",
        "scheduler.py",
        "        if req.state is ReqState.PREFILLING and end == req.fill_len:",
        "        if req.state is ReqState.PREFILLING:",
        "mark launched: a chunked request moves to decode after its first chunk, so it decodes "
        "before its prompt is prefilled (chunked-prefill state bugs in SGLang and vLLM)",
    ),
    Mutant(
        "ignore-eos-ignored",
        "scheduler.py",
        "        return token == self.config.eos_token_id and not req.params.ignore_eos",
        "        return token == self.config.eos_token_id",
        "stop check: `ignore_eos` is not honoured (stop-condition fixes in vLLM and SGLang)",
    ),
    Mutant(
        "max-tokens-not-clamped",
        "scheduler.py",
        "            max_output(self.config, msg),\n",
        "            msg.sampling_params.max_tokens,\n",
        "admission: max_tokens is not clamped to what max_seq_len leaves after the prompt "
        "(vLLM/SGLang max_new_tokens clamping), so a long request writes past its row",
    ),
    Mutant(
        "live-uid-accepted",
        "scheduler.py",
        "        reason = rejection(self.config, msg, live=msg.uid in self.live)",
        "        reason = rejection(self.config, msg, live=False)",
        "receive: a request whose uid is still live is accepted and overwrites the live one's "
        "books (duplicate request id handling in vLLM and SGLang's tokenizer manager)",
    ),
    Mutant(
        "launch-past-max-tokens",
        "req.py",
        "        return self.state is ReqState.RUNNING and self.launched_outputs < self.max_output",
        "        return self.state is ReqState.RUNNING",
        "can_decode: decode rounds are launched with no length limit; under overlap one round "
        "more than max_tokens runs and is thrown away (wasted GPU work; mini-sglang's "
        "`can_decode` vs results received)",
    ),
    Mutant(
        "abort-left-in-prefill",
        "scheduler.py",
        "        self.prefill.remove(req)\n        self.decode.remove(req)\n        if was",
        "        self.decode.remove(req)\n        if was",
        "abort: a request aborted mid chunked prefill stays in the prefill queue and is chunked "
        "after release (sglang-jax PR #984: abort never touched `chunked_reqs`)",
    ),
    Mutant(
        "abort-left-running",
        "scheduler.py",
        "        self.prefill.remove(req)\n        self.decode.remove(req)\n        if was",
        "        self.prefill.remove(req)\n        if was",
        "abort: an aborted running request stays in the running list (the scheduler never "
        "idles; leaked requests in the running batch after abort, SGLang)",
    ),
    Mutant(
        "admit-beyond-slots",
        "prefill.py",
        "            if budget == 0 or self.table.num_free == 0:\n                break",
        "            if budget == 0:\n                break",
        "admission: no check for a free request slot inside the admission loop (admitting "
        "beyond num_slots / max_running_requests, SGLang and vLLM)",
    ),
    Mutant(
        "admission-ignores-reserved",
        "prefill.py",
        "            if need + reserved_pages > self.cache.available_pages:",
        "            if need > self.cache.available_pages:",
        "admission: the new request's pages are checked against the free pages only, not "
        "reserving what running decodes will still allocate (SGLang `new_token_ratio` / "
        "vLLM preemption-free admission bugs): a decode runs out of pages",
    ),
    Mutant(
        "chunk-budget-off-by-one",
        "prefill.py",
        "            size = min(budget, req.fill_len - req.kv_len)\n            if size > 0:",
        "            size = min(budget + 1, req.fill_len - req.kv_len)\n            if size > 0:",
        "chunked prefill: a continuing chunk takes one token more than the extend budget "
        "(chunked-prefill budget off-by-one, SGLang `rem_chunk_tokens`)",
    ),
    # -- lifecycle windows: one iteration between a point and its deferred cleanup -------------
    Mutant(
        "result-by-uid",
        "scheduler.py",
        "                req.inflight -= 1\n                if seq.end < req.fill_len:",
        "                req = self.live.get(req.uid, req)  # by uid: a reused uid's new request\n"
        "                req.inflight -= 1\n                if seq.end < req.fill_len:",
        "process: results are looked up by uid, so a uid sent again between its request's "
        "finish (or abort) and the processing of its in-flight extra round gets the old "
        "request's last sample (request-id keyed output handling; vLLM moved to internal "
        "request ids with a random suffix in 0.16)",
    ),
    Mutant(
        "uid-busy-until-released",
        "scheduler.py",
        "        reason = rejection(self.config, msg, live=msg.uid in self.live)",
        "        reason = rejection(self.config, msg, live=any(r.uid == msg.uid"
        " for r in self.held))",
        "receive: a uid counts as live until its request's resources come back, so a request "
        "that reuses it while the finished one waits for its extra round is rejected ('request "
        "id already running' after a finish or abort, vLLM and SGLang)",
    ),
    Mutant(
        "release-by-uid",
        "scheduler.py",
        '        self.device.released("slot", (req.slot,))\n        self.held.remove(req)\n',
        '        self.device.released("slot", (req.slot,))\n'
        "        self.held = [r for r in self.held if r.uid != req.uid]\n",
        "release: the deferred release of a finished request drops every held request with its "
        "uid, so one that reused the uid inside the window loses its books (free by request "
        "id: vLLM `_free_request` / `self.requests.pop(req_id)`)",
    ),
    Mutant(
        "abort-in-flight-completes",
        "scheduler.py",
        "                    # else: the extra round of an aborted request: dropped\n",
        "                    elif self._is_last(req, len(req.outputs) + 1, token):\n"
        "                        self._append(req, token)  # completed as if never aborted\n",
        "process: a request aborted while its last round is in flight is finished normally "
        "when that round comes back (vLLM #26400 / #29987: cancellations during a forward "
        "pass were not handled as aborts for requests that completed after it)",
    ),
    Mutant(
        "abort-frees-in-flight",
        "scheduler.py",
        "            self.cache.release(req, forget=False)  # upstream: cached now, and again on "
        "the result\n        self._maybe_release(req)\n",
        "            self.cache.release(req, forget=False)  # upstream: cached now, and again on "
        "the result\n        req.inflight = 0  # freed at once\n        self._maybe_release(req)\n",
        "abort: a request aborted while a batch holds it gives its slot and pages back at once, "
        "while that forward still reads them (mini-sglang PR #111: `_process_one_msg` aborts "
        "an in-flight request and frees its table index)",
    ),
    Mutant(
        "abort-double-release",
        "scheduler.py",
        "        if self._fault(F.ABORT_INFLIGHT_PREFILL)"
        " and self._final_prefill_in_flight(req, was):",
        "        if req.inflight > 0 and was is not ReqState.PENDING:",
        "abort: a request aborted with a batch in flight is released at the abort and again "
        "when the batch is processed (vLLM #33377: double free with async scheduling and "
        "abort)",
    ),
    # -- the prefix cache --------------------------------------------------------------------------
    Mutant(
        "match-prompt-last-token",
        "cache/manager.py",
        "        match = self.prefix.match(req.fill[:-1])",
        "        match = self.prefix.match(req.fill)",
        "attach prefix: the whole prompt may match, so no position is left to compute the first "
        "sample from (SGLang's `input_ids[:-1]` in match_prefix; vLLM's 'full hit' fix)",
    ),
    Mutant(
        "insert-uncomputed-kv",
        "req.py",
        "        return (list(self.prompt) + self.outputs)[: self.kv_len]",
        "        return (list(self.prompt) + self.outputs)[: self.device_len]",
        "release: the prefix cache gets positions whose KV no forward computed (the last "
        "sample's), so a later hit reads garbage KV (SGLang `cache_finished_req` token range)",
    ),
    Mutant(
        "free-cached-pages",
        "cache/manager.py",
        "        to_free = [p for p in req.own_pages if p * self.page_size not in kept]",
        "        to_free = list(req.own_pages)",
        "release: pages the radix tree just took ownership of are freed too (double "
        "ownership; SGLang radix `insert` / `free` pairing fixes)",
    ),
    Mutant(
        "keep-duplicate-pages",
        "cache/manager.py",
        "kept = set(req.cells[already : usable : self.page_size]) if usable > already else set()",
        "kept = set(req.cells[: usable : self.page_size])",
        "release: the pages that duplicate an already cached prefix are never freed (SGLang "
        "frees `kv_indices[cache_len:new_prefix_len]` after insert): a leak",
    ),
    Mutant(
        "evict-locked-node",
        "cache/radix.py",
        "        return node is not self.root and not node.children and node.lock_ref == 0",
        "        return node is not self.root and not node.children",
        "eviction: locked leaves are evictable, so a running request's prefix pages are freed "
        "under it (mini-sglang PR #52: `lock_handle` skipped the matched node itself)",
    ),
    Mutant(
        "split-drops-lock",
        "cache/radix.py",
        "            lock_ref=node.lock_ref,\n",
        "",
        "radix split: the new upper node does not inherit the lock count, so a locked prefix "
        "becomes evictable (split accounting: SGLang `_split_node`, mllm PR #656)",
    ),
    Mutant(
        "detach-no-unlock",
        "prefill.py",
        "                self.cache.detach_prefix(req)\n",
        "",
        "admission: a request that does not fit keeps its prefix match locked, and is locked "
        "again on the next pass (lock leaks on the not-admitted path, SGLang `inc_lock_ref` "
        "without `dec_lock_ref`)",
    ),
    # -- equivalent: no observable difference ----------------------------------------------------
    Mutant(
        "reserve-one-page-fewer",
        "prefill.py",
        "        return max(0, self.config.pages_for(req.prompt_len + req.max_output) - held)",
        "        return max(0, self.config.pages_for(req.prompt_len + req.max_output - 1) - held)",
        "admission reserves KV for one position fewer",
        equivalent=True,
        reason="the last sample's KV is never computed: a request's forwards cover at most "
        "prompt + max_output - 1 positions, so the original reservation had one spare position",
    ),
    Mutant(
        "release-guard-dropped",
        "scheduler.py",
        "        if not req.done or req.released:\n",
        "        if not req.done:\n",
        "release: the `released` guard against a second release is dropped",
        equivalent=True,
        reason="with no fault on, a request is released once: it leaves `reqs` and every batch "
        "(inflight 0) when released, so no later path reaches it",
    ),
    Mutant(
        "lru-not-touched",
        "cache/radix.py",
        "            child.last_access = self._clock\n",
        "",
        "radix match: a hit does not refresh the node's LRU time",
        equivalent=True,
        reason="only which unlocked leaf is evicted first changes: a cache-hit-rate "
        "(performance) difference, every output and resource book stays correct",
    ),
    Mutant(
        "finish-pops-uid",
        "scheduler.py",
        "            if self.live.get(req.uid) is req:\n                del self.live[req.uid]\n",
        "            self.live.pop(req.uid, None)\n",
        "finish: the uid's live entry is removed without checking it is this request's",
        equivalent=True,
        reason="a request finishes only while it is its uid's live one: a second request with "
        "the uid is rejected while the first is live, and an aborted one never reaches the "
        "finish path",
    ),
    Mutant(
        "slot-order",
        "table.py",
        "        return heapq.heappop(self._free)",
        "        return self._free.pop()",
        "slots handed out from the end of the free list, not lowest-first",
        equivalent=True,
        reason="any free slot is correct; only which row a request gets changes",
    ),
)

BY_ID: dict[str, Mutant] = {m.id: m for m in MUTANTS}
