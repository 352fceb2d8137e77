"""LLMEngine: add_request / step / abort over a scheduler, a paged KV cache manager and a backend.

    engine = LLMEngine(backend, tokenizer, EngineConfig(...))
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=64))
    while engine.has_unfinished:
        for out in await engine.step():
            print(out.text, end="")

`step` is async because the WebGPU backend awaits the GPU; under CPython the
CPU backend runs it with asyncio. One step: prefixes missing from the GPU come
back from the CPU tier and the disk (kv/tiers.py), the scheduler picks the batch
(preempting if the pool is short), then one forward over the mixed prefill/decode
batch, and new full blocks go to disk; finished requests free their blocks (full
ones stay in the prefix cache). The KV hierarchy only plans block moves; the
engine's one mover (block_mover.py) runs every one of them on the backend, in order.

Parallel sampling (SamplingParams.n > 1) and beam search (add_beam_search) run
several requests under the caller's one id: sample_groups.py.

An abort may arrive while a step awaits the backend (the user presses Stop in
one chat while another streams): the request's blocks are freed at once and the
step drops its output. The step built its batch before its first await, and
freed blocks are handed out again only by the next schedule, so the writes of
the step in flight land in no block anyone holds.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import numpy as np

from .beam_search import BeamGroup, BeamSearchParams, Hypothesis
from .config import CacheConfig, EngineConfig
from .block_mover import BlockMover
from .kv.accounting import block_map
from .kv.disk_cache import DiskCache
from .kv.disk_tier import DiskKey, DiskTier, TierBudgets, model_hash
from .kv.manager import KVCacheManager, NeverFits
from .kv.retention import KVRetention
from .kv.tiers import KVTiers
from .model_runner import build_batch
from .request import Request, StepOutput
from .sample_groups import Member, SampleGroups
from .sampling import Sampler, SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence, SequenceStatus, check_token_ids
from .tokenizer import StreamDecoder, Tokenizer

__all__ = ["EngineConfig", "LLMEngine", "NeverFits", "StepOutput", "TierBudgets", "run_sync"]


class LLMEngine:
    """Continuous batching over a paged KV cache; see the module docstring."""

    def __init__(self, backend, tokenizer: Tokenizer, config: EngineConfig = EngineConfig()) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.context_length = min(backend.config.context_length, config.max_context or backend.config.context_length)
        if config.kv_dtype is not None and config.kv_dtype != backend.kv_dtype:
            raise ValueError(f"EngineConfig asks for {config.kv_dtype} KV but the {backend.name} backend holds "
                             f"{backend.kv_dtype}; create the backend with kv_dtype={config.kv_dtype!r}")
        self.kv_spec = backend.kv_spec
        self.kv, self.scheduler = self._fresh_pool(backend)
        self.tiers = KVTiers(self.kv)
        self.mover = BlockMover(backend)
        # A step, a disk flush and a chat's disk cleanup each run alone: a flush reads back blocks a step may
        # be filling and lists the store the others write. Uncontended it never waits (run_sync drives it).
        self._lock = asyncio.Lock()
        self.groups = SampleGroups(tokenizer)
        # llama.cpp's end-of-generation set (the ChatML turn closer, Llama 3's <|eot_id|>, ...) and EOS.
        self.default_stop_ids = tokenizer.eog_ids | frozenset(
            i for i in (tokenizer.find_token("<|im_end|>"), tokenizer.eos_token_id) if i is not None)
        self.counters = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "forward_s": 0.0,
                         "copy_ops": 0, "swap_out_blocks": 0, "swap_in_blocks": 0,
                         "shifted_blocks": 0, "disk_restored_tokens": 0, "disk_written_blocks": 0,
                         "cpu_restored_tokens": 0}

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type (a name of pagedkv.kv.dtypes)."""
        return self.kv_spec.dtype

    @property
    def disk(self) -> DiskCache | None:
        """The disk tier in use, or None."""
        return self.tiers.disk

    def attach_disk(self, tier: DiskTier | None) -> None:
        """Use `tier` (kv.disk_tier.DiskTier, opened) as the disk tier of the KV cache, or none. Raises
        ValueError when its files hold other KV than this backend's."""
        disk = DiskCache(tier) if tier is not None else None
        if disk is not None:
            disk.check_spec(self.kv_spec, f"{self.backend.name} backend's")
        self.tiers = KVTiers(self.kv, disk)  # every waiting prefix is looked up again, on the new tier too

    # ---------------------------------------------------------------- requests

    def add_request(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), *,
                    request_id: str | None = None, priority: int = 0, session: str = "default",
                    retention: KVRetention | None = None, sampler: Sampler | None = None) -> str:
        """Queue a generation from `prompt_ids`; returns its id. Raises ValueError / NeverFits up front.

        With params.n > 1 the prompt is prefilled once and n samples fork from it (module docstring).
        retention (default: EngineConfig.retention) bounds the KV the request holds: with a sliding
        window the conversation may run past the model's context. sampler (default: Sampler(params))
        picks the request's tokens, e.g. a ForcedSampler scoring a known continuation."""
        _require_type("params", params, SamplingParams)
        if sampler is not None:
            _require_type("sampler", sampler, Sampler)
            if params.n > 1:
                raise ValueError("a caller's sampler serves one sequence; use n=1 with sampler=")
        req = self._new_request(prompt_ids, params.max_tokens, request_id, priority, session, retention=retention)
        stops = frozenset(params.stop_token_ids) or self.default_stop_ids
        sampler = sampler if sampler is not None else Sampler(params.for_sample(0))
        self._queue(Member(req, sampler, StreamDecoder(self.tokenizer), stops, req.request_id,
                           fork_params=params if params.n > 1 else None))
        return req.request_id

    def add_beam_search(self, prompt_ids: list[int], params: BeamSearchParams, *, request_id: str | None = None,
                        priority: int = 0, session: str = "default") -> str:
        """Queue a beam search; its final beams come out as finished StepOutputs (index = rank) and as
        `beam_results(id)`. Refused up front (NeverFits) unless `width` beams of full length fit the pool."""
        _require_type("params", params, BeamSearchParams)
        req = self._new_request(prompt_ids, params.max_tokens, request_id, priority, session, copies=params.width)
        stops = frozenset(params.stop_token_ids) or self.default_stop_ids
        group = BeamGroup(req.request_id, replace(params, max_tokens=req.max_tokens), stops, req)
        self._queue(Member(req, Sampler(SamplingParams()), StreamDecoder(self.tokenizer), stops, req.request_id,
                           beam=group))
        return req.request_id

    def _queue(self, member: Member) -> None:
        self.scheduler.add(member.request)
        self.groups.add(member)

    def _new_request(self, prompt_ids, max_tokens: int, request_id: str | None, priority: int, session: str,
                     copies: int = 1, retention: KVRetention | None = None) -> Request:
        """A validated Request, not queued yet; raises ValueError / NeverFits."""
        # A wrong type caught here, not by every later step (a str priority breaks the sort of all queues).
        _require_type("priority", priority, int)
        _require_type("session", session, str)
        if request_id is not None:
            _require_type("request_id", request_id, str)
        prompt = list(prompt_ids)
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        check_token_ids(prompt)
        if max(prompt) >= self.tokenizer.vocab_size:
            raise ValueError(f"token id {max(prompt)} is outside the vocabulary ({self.tokenizer.vocab_size})")
        retention = retention if retention is not None else self.config.retention
        endless = self._check_retention(retention)
        if len(prompt) >= self.context_length and not endless:
            raise ValueError(f"the prompt has {len(prompt):,} tokens but the model's context is "
                             f"{self.context_length:,}; shorten it (or start a new conversation)")
        rid = request_id if request_id is not None else f"req-{self.groups.new_id()}"
        if self.groups.in_use(rid):
            raise ValueError(f"request id {rid!r} is already in use")
        if "#" in rid:
            raise ValueError(f"request id {rid!r} contains '#', which names parallel samples and beams; drop it")
        max_tokens = max_tokens if endless else min(max_tokens, self.context_length - len(prompt))
        req = Request(rid, Sequence(prompt, session=session), num_prompt_tokens=len(prompt),
                      max_tokens=max_tokens, priority=priority, retention=retention)
        self.scheduler.check_fits(req)
        blocks = -(-req.max_total_tokens // self.kv.block_size)
        if copies > 1 and copies * blocks > self.kv.pool.num_blocks:
            raise NeverFits(f"beam search of width {copies} needs up to {copies} x {blocks} blocks of "
                            f"{self.kv.block_size} for {req.max_total_tokens:,} tokens per beam, but the KV pool "
                            f"only has {self.kv.pool.num_blocks:,} blocks; lower the width or max tokens")
        return req

    def _check_retention(self, retention: KVRetention | None) -> bool:
        """Validate a retention policy against this engine; True when it lets a request pass the context."""
        if retention is None:
            return False
        if not isinstance(retention, KVRetention):
            raise ValueError(f"retention must be a KVRetention or None, got {retention!r}")
        if retention.window_tokens is None:
            return False
        bs = self.kv.block_size
        retention.check_block_size(bs)
        if retention.max_blocks(bs) * bs > self.context_length:
            raise ValueError(f"sinks + window + one block ({retention.max_blocks(bs) * bs} tokens) exceed the "
                             f"model context ({self.context_length}); shrink window_tokens")
        return True

    def abort(self, request_id: str) -> Request:
        """Stop a request (all its samples or beams) now; their blocks are freed, output so far is kept.
        Safe while a step awaits the backend: that step drops the request's output."""
        return self.groups.abort(self.scheduler, request_id)

    def rebuild(self, backend) -> list[str]:
        """Continue on a new backend (the GPU device was lost, or the pool was rebuilt with other settings).

        The old pool's contents are gone, so every unfinished request goes back to the waiting queue
        holding its exact token history (prompt + what it generated) and re-prefills it on the new
        pool, like a preemption by recompute; its sampler and stream decoder carry on. A request that
        could never fit the new pool is aborted with finish reason "error". Returns the requeued ids.
        """
        pending = sorted(self.groups.members.values(), key=lambda m: Request.sort_key(m.request))
        self.backend = backend
        self.kv_spec = backend.kv_spec  # a new dtype is fine: everything re-prefills
        disk = self.disk
        if disk is not None and not disk.holds(self.kv_spec):
            disk = None  # the files hold another layout's KV; the caller attaches a tier for the new one
        self.kv, self.scheduler = self._fresh_pool(backend)
        self.tiers = KVTiers(self.kv, disk)
        self.mover = BlockMover(backend)
        requeued: list[str] = []  # the callers' ids (a group of samples or beams counts once)
        for member in pending:
            try:
                self.scheduler.requeue(member.request)
            except NeverFits:
                self._retire(member.request, "error")
                continue
            if member.group_id not in requeued:
                requeued.append(member.group_id)
        return requeued

    def _fresh_pool(self, backend) -> tuple[KVCacheManager, Scheduler]:
        cache = CacheConfig(num_blocks=backend.num_blocks, block_size=backend.block_size,
                            num_cpu_blocks=backend.num_cpu_blocks,
                            enable_prefix_caching=self.config.enable_prefix_caching, kv_dtype=self.kv_dtype,
                            demote_to_cpu=True)
        kv = KVCacheManager(cache, namespace=self.config.namespace)
        return kv, Scheduler(self.config, kv)

    def is_unfinished(self, request_id: str) -> bool:
        """Whether `request_id` still runs (False once finished or aborted, also while the step that finished it
        has not returned its output yet)."""
        return request_id in self.groups.roots

    def request(self, request_id: str) -> Request:
        """The unfinished request `request_id` (with n > 1: sample 0, whose .samples lists all n)."""
        return self.groups.roots[request_id]

    def beam_results(self, request_id: str) -> list[Hypothesis]:
        """The final beams of a finished beam search, best first; handed over once (KeyError while it runs)."""
        return self.groups.take_beam_results(request_id)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.groups.members)

    # ---------------------------------------------------------------- the step

    async def step(self) -> list[StepOutput]:
        """Schedule, copy, run one forward, sample; returns one StepOutput per request that ran (none for one
        aborted while the step awaited the backend)."""
        async with self._lock:
            return await self._step()

    async def _step(self) -> list[StepOutput]:
        async for restore in self.tiers.restores(self.scheduler.waiting):
            await self.mover.run(restore.moves)
            self.counters[f"{restore.tier}_restored_tokens"] += restore.tokens
        out = self.scheduler.schedule()  # its moves end with the demotions its allocations caused
        members = self.groups.members
        # Built before the first await, while every scheduled request is still tracked (module docstring).
        batch = build_batch(out.scheduled, self.kv.block_size) if out.scheduled else None
        # When every request that samples this step is plain greedy, the backend returns argmax ids only.
        greedy = all(m.beam is None and m.sampler.argmax_only
                     for m in (members[r.request_id] for r, _ in out.scheduled))
        await self.mover.run(out.moves)
        for name, ops in (("swap_out_blocks", out.swap_out), ("swap_in_blocks", out.swap_in),
                          ("copy_ops", out.copies), ("shifted_blocks", out.shifts)):
            self.counters[name] += len(ops)
        if batch is None:
            await self._flush_when_idle()
            return []
        track = any(r.retention is not None and r.retention.evict for r, _ in out.scheduled)
        mass = np.zeros(batch.block_tables.shape, np.float32) if track else None  # (S, max_blocks)
        t0 = time.perf_counter()
        # (S, vocab), or (S,) ids when greedy
        logits = await self.backend.forward(batch, greedy=greedy, attention_mass=mass)
        self.counters["forward_s"] += time.perf_counter() - t0
        if track:
            self.kv.add_attention_mass([r.seq for r, _ in out.scheduled], mass)
        self.counters["steps"] += 1
        results = []
        for req, n in out.scheduled:
            if req.status is not SequenceStatus.FINISHED:  # aborted while the backend ran; its blocks are free
                self.kv.mark_computed(req.seq, n)
        if self.disk is not None:  # before sampling: a finished request gives its blocks back
            computed = [r.seq for r, _ in out.scheduled if r.status is not SequenceStatus.FINISHED]
            store = self.disk.plan_store(self.kv, computed)
            words = await self.mover.read(store) if store is not None else None
            self.counters["disk_written_blocks"] += await self.disk.store(store, words)
        for i, (req, n) in enumerate(out.scheduled):
            if req.status is SequenceStatus.FINISHED:  # aborted while the backend (or the disk) ran
                continue
            seq = req.seq
            member = members[req.request_id]
            if seq.num_computed_tokens < seq.num_tokens:  # a prefill chunk: nothing to sample yet
                self.counters["prefill_tokens"] += n
                results.append(StepOutput(member.group_id, [], "", False, index=req.index))
                continue
            self.counters["decode_tokens" if n == 1 and req.output_ids else "prefill_tokens"] += n
            row = int(logits[i]) if greedy else logits[i]
            if member.beam is not None:
                member.beam.offer(req, row)
                continue
            for sample in self.groups.fork_samples(self.scheduler, member):
                results.append(self._sample(sample, row))
        results.extend(self.groups.beam_steps(self.scheduler))
        await self._flush_when_idle()
        return results

    async def _flush_when_idle(self) -> None:
        """With no request left (a turn ended), the disk's LRU order is written now, not an interval later."""
        if self.disk is not None and not self.has_unfinished:
            await self.disk.tier.flush(force=True)

    def _sample(self, req: Request, logits_or_token) -> StepOutput:
        member = self.groups.members[req.request_id]
        if isinstance(logits_or_token, int):
            token = logits_or_token
        else:
            token = member.sampler.sample(logits_or_token, req.seq.token_ids)
        req.append_token(token)
        reason = "stop" if token in member.stop_ids else (
            "length" if len(req.output_ids) >= req.max_tokens else None)
        text = "" if reason == "stop" else member.decoder.push(token)
        if reason is not None:
            text += member.decoder.flush()
            self._retire(req, reason)
        return StepOutput(member.group_id, [token], text, reason is not None, reason, index=req.index)

    def _retire(self, req: Request, reason: str) -> None:
        self.groups.retire(self.scheduler, req, reason)

    # ---------------------------------------------------------------- conveniences

    async def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), **kw) -> Request:
        """Run one request (with n > 1: all its samples, see .samples) to completion; other queued requests
        run alongside it."""
        rid = self.add_request(prompt_ids, params, **kw)
        req = self.groups.roots[rid]
        while rid in self.groups.roots:
            await self.step()
        return req

    async def beam_search(self, prompt_ids: list[int], params: BeamSearchParams, **kw) -> list[Hypothesis]:
        """Run one beam search to completion; its final beams, best first."""
        rid = self.add_beam_search(prompt_ids, params, **kw)
        while rid in self.groups.roots:
            await self.step()
        return self.beam_results(rid)

    def stats(self) -> dict:
        """Plain-data snapshot for the dashboard, benchmarks and tests."""
        pool, cpu = self.kv.pool, self.kv.cpu_pool
        return {
            "num_blocks": pool.num_blocks, "used_blocks": pool.num_used, "free_blocks": pool.num_free,
            "cpu_blocks": cpu.num_blocks if cpu else 0, "cpu_used_blocks": cpu.num_used if cpu else 0,
            "cpu_cached_blocks": cpu.num_cached if cpu else 0,
            "cpu_demoted_blocks": self.kv.cpu.num_demoted if cpu else 0,
            "cached_blocks": pool.num_cached, "block_size": self.kv.block_size,
            "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
            "swapped": len(self.scheduler.swapped), "preemptions": dict(self.scheduler.num_preemptions),
            "evicted_blocks": self.scheduler.num_evicted_blocks,
            "prefix_hit_rate": self.kv.prefix_hit_rate, "kv_dtype": self.kv_dtype,
            "bytes_per_token": self.bytes_per_token, **self.counters,
            **(self.disk.stats() if self.disk is not None else {}),
        }

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token takes on the device in the engine's dtype: K and V of every layer, scales and
        padding included (a CPU backend holds f32 arrays; this is what its dtype would take on a GPU)."""
        return self.kv_spec.bytes_per_token

    # ---------------------------------------------------------------- the app's facade
    # What the chat app asks of the KV memory hierarchy; it imports nothing from pagedkv.kv, so the
    # pool, the manager and the tiers can change behind these methods.

    async def open_disk_tier(self, store, manifest: dict, budget_bytes: int) -> None:
        """Open the disk tier over `store` (a file_store.FileStore: OPFS `kv/` in the page) for this model
        (its identity: the manifest's config and shard sha256s) under `budget_bytes`, and use it. Raises
        what listing the store raises; the engine keeps no tier then."""
        tier = DiskTier(store, DiskKey(model_hash(manifest), self.kv_spec), budget_bytes)
        await tier.open()
        self.attach_disk(tier)

    @property
    def disk_enabled(self) -> bool:
        """Whether a disk tier is attached."""
        return self.disk is not None

    def cached_prefix_tokens(self, token_ids) -> int:
        """Leading tokens of `token_ids` the GPU prefix cache holds now (whole blocks); changes nothing."""
        cached, _ = self.kv.lookup_prefix(token_ids)
        return cached

    def refer_history(self, owner: str, token_ids) -> None:
        """`owner` (a chat) now holds the history `token_ids`: the disk tier keeps its block files for it
        (replacing what it held before) and flush_disk writes its blocks. Nothing without a disk tier."""
        if self.disk is not None:
            self.disk.refer(owner, token_ids)

    def forget_history(self, token_ids, keep_tokens: int = 0) -> None:
        """A history nobody holds any more (a deleted chat): its cached blocks past the first `keep_tokens`
        tokens (what another history shares) leave the GPU prefix cache and the CPU tier. Blocks a live or
        swapped sequence holds stay."""
        self.kv.evict_prefix(token_ids, keep_tokens=keep_tokens)
        if self.kv.cpu is not None:
            self.kv.cpu.forget(token_ids, keep_tokens=keep_tokens)

    async def forget_owner(self, owner: str) -> int:
        """Drop `owner` (a deleted chat) from the disk tier and delete the block files only its history
        referenced; returns how many. 0 without a disk tier."""
        if self.disk is None:
            return 0
        async with self._lock:  # not while flush_disk lists the store: it would count the file as another tab's
            return await self.disk.forget(owner)

    async def flush_disk(self) -> int:
        """Write every full block of KV that the GPU holds computed, of a chat's history (refer_history) or a
        request in progress, and that the disk tier lacks (a write that failed, a file another tab of the
        origin deleted: the store is listed again first), then the disk's LRU order. Waits for a step in
        flight. Returns the block files written; 0 without a disk tier. The page calls it when it is hidden
        or left; what write-behind wrote already is not written again."""
        if self.disk is None:
            return 0
        async with self._lock:
            disk = self.disk
            await disk.tier.resync()
            plan = disk.plan_flush(self.kv)
            words = await self.mover.read(plan) if plan is not None else None
            written = await disk.store(plan, words)
            await disk.tier.flush(force=True)
        self.counters["disk_written_blocks"] += written
        return written

    def kv_snapshot(self) -> dict:
        """Plain data of the GPU block pool for the memory panel (kv.accounting.block_map)."""
        return block_map(self.kv)


def run_sync(coro):
    """Drive a coroutine that never waits on real I/O (the CPU backend) to its result.

    Lets CPython callers (CLI, tests) use the async engine without an event
    loop, also where one is already running in the thread.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("run_sync: the coroutine waited on I/O; await it in an event loop instead")



def _require_type(name: str, value: object, kind: type) -> None:
    # bool is an int subclass; a True priority would be a silent bug.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name} must be of type {kind.__name__}, got {type(value).__name__} {value!r}")
