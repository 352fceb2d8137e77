"""One model inside the engine: its backend, tokenizer, paged KV cache manager, scheduler and its step.

LLMEngine (engine.py) holds one lane per loaded model and steps them in turn, each model its own forward. On
its own a lane's pool is its own; when several models share one budget their managers allocate from one
BlockPool of equal pages (kv.accounting.SharedKVBudget sizes the page and each model's block) and a
model short of blocks may preempt, by recompute, a lower-ranked request of another model (peer_victim):
its blocks are free at once, so no copy of the other model's has to run before this model writes them.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from .beam_search import BeamGroup, BeamSearchParams, Hypothesis
from .block_mover import BlockMover
from .config import CacheConfig, EngineConfig
from .decode_chain import DecodeChain, InFlight
from .device_draws import DeviceDraws, DrawnTokens
from .kv.accounting import kv_stats
from .kv.block_pool import BlockPool
from .kv.disk_cache import DiskCache
from .kv.disk_tier import DiskTier
from .kv.manager import KVCacheManager, NeverFits
from .kv.retention import KVRetention
from .kv.tiers import KVTiers
from .logprobs import token_logprob
from .model_runner import build_batch
from .request import Request, StepOutput
from .sample_groups import Member, SampleGroups, new_sampler
from .sampling import Sampler, SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence, SequenceStatus, check_token_ids
from .tokenizer import StreamDecoder, Tokenizer

__all__ = ["ModelLane"]


class ModelLane:
    """One model's requests and KV cache. name: the model's id; namespace: mixed into its prefix hashes;
    shared_pool: the BlockPool of a budget several models share (None: a pool of its own, backend.num_blocks);
    ids: the engine's request counter (request ids are unique across models); peer_victim: see Scheduler."""

    def __init__(self, name: str, backend, tokenizer: Tokenizer, config: EngineConfig, *, namespace: str | None,
                 shared_pool: BlockPool | None = None, ids=None, peer_victim=None) -> None:
        self.name = name
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.namespace = namespace
        self.shared_pool = shared_pool
        self.peer_victim = peer_victim
        self.reserved_blocks: list[int] = []  # the pages of a shared budget this model's weights hold
        self.context_length = min(backend.config.context_length, config.max_context or backend.config.context_length)
        if config.kv_dtype is not None and config.kv_dtype != backend.kv_dtype:
            raise ValueError(f"EngineConfig asks for {config.kv_dtype} KV but the {backend.name} backend holds "
                             f"{backend.kv_dtype}; create the backend with kv_dtype={config.kv_dtype!r}")
        self.kv_spec = backend.kv_spec
        self.kv, self.scheduler = self._fresh_pool(backend)
        self.tiers = KVTiers(self.kv)
        self.mover = BlockMover(backend)
        self.groups = SampleGroups(tokenizer, ids)
        self.chain = DecodeChain(self)
        self.device_draws: DeviceDraws | None = None  # made on the first step drawn on the device (draw_kw)
        self.in_flight: InFlight | None = None  # a submitted step whose ids are not read yet (decode_chain.py)
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

    def attach_disk(self, tier: DiskTier | None, background: bool = False) -> None:
        """Use `tier` (kv.disk_tier.DiskTier, opened) as the disk tier of the KV cache, or none; `background`:
        its write-behind through a writer task (kv/disk_cache.py). Raises ValueError when its files hold other
        KV than this backend's."""
        disk = DiskCache(tier, background, self._disk_written) if tier is not None else None
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
        if params.logit_bias and params.logit_bias[-1][0] >= self.tokenizer.vocab_size:
            raise ValueError(f"logit_bias names token id {params.logit_bias[-1][0]}, outside the vocabulary "
                             f"({self.tokenizer.vocab_size})")
        if sampler is not None:
            _require_type("sampler", sampler, Sampler)
            if params.n > 1:
                raise ValueError("a caller's sampler serves one sequence; use n=1 with sampler=")
        req = self._new_request(prompt_ids, params.max_tokens, request_id, priority, session, retention=retention)
        stops = frozenset(params.stop_token_ids) or self.default_stop_ids
        sampler = sampler if sampler is not None else new_sampler(params.for_sample(0), self.tokenizer, stops)
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
        blocks = self.kv.blocks_needed(req.max_total_tokens, self.config.max_num_batched_tokens)
        if copies > 1 and copies * blocks > self.kv.pool.capacity:
            raise NeverFits(f"beam search of width {copies} needs up to {copies} x {blocks} blocks of "
                            f"{self.kv.block_size} for {req.max_total_tokens:,} tokens per beam, but the KV pool "
                            f"only has {self.kv.pool.capacity:,} blocks; lower the width or max tokens")
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
        members = [m.request for m in self.groups.members.values() if m.group_id == request_id]
        root = self.groups.abort(self.scheduler, request_id)
        for req in members:
            self.chain.drop(req)
        return root

    def rebuild(self, backend) -> list[str]:
        """Continue on a new backend (the GPU device was lost, or the pool was rebuilt with other settings).

        The old pool's contents are gone, so every unfinished request goes back to the waiting queue
        holding its exact token history (prompt + what it generated) and re-prefills it on the new
        pool, like a preemption by recompute; its sampler and stream decoder carry on. A request that
        could never fit the new pool is aborted with finish reason "error". Returns the requeued ids.
        """
        if self.shared_pool is not None:
            raise ValueError(f"{self.name} shares its KV pool with other models: unload it and load it again "
                             "instead of rebuilding it alone")
        pending = sorted(self.groups.members.values(), key=lambda m: Request.sort_key(m.request))
        if self.in_flight is not None:  # the old device's step: its ids are gone with it
            getattr(self.in_flight.landing, "close", lambda: None)()  # a coroutine never to be awaited
            self.in_flight = None
        for member in pending:
            self.chain.drop(member.request)
        self.backend = backend
        self.device_draws = None  # the old device's counts are gone: a request's first draw writes them again
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
        shared = self.shared_pool
        if shared is not None and backend.num_blocks != shared.num_blocks:
            raise ValueError(f"{self.name}'s backend addresses {backend.num_blocks} blocks but the shared pool has "
                             f"{shared.num_blocks}")
        cache = CacheConfig(num_blocks=backend.num_blocks, block_size=backend.block_size,
                            num_cpu_blocks=backend.num_cpu_blocks,
                            enable_prefix_caching=self.config.enable_prefix_caching, kv_dtype=self.kv_dtype,
                            demote_to_cpu=shared is None)  # a shared pool's evictions are no one model's to demote
        kv = KVCacheManager(cache, namespace=self.namespace, pool=shared, groups=backend_kv_groups(backend))
        return kv, Scheduler(self.config, kv, self.peer_victim)

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
        """This model's part of an engine step (LLMEngine.step): restore, schedule, copy, one forward, sample.
        With a step in flight (decode_chain.py) it is that step's turn: the next is submitted, then its ids read."""
        if self.in_flight is not None:
            return await self._land(self.in_flight)
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
        draws = None if greedy or batch is None else self._device_draws(out.scheduled)  # forward's keywords
        chain = batch is not None and self.chain.allows(out.scheduled, greedy, draws)
        await self.mover.run(out.moves)
        for name, ops in (("swap_out_blocks", out.swap_out), ("swap_in_blocks", out.swap_in),
                          ("copy_ops", out.copies), ("shifted_blocks", out.shifts)):
            self.counters[name] += len(ops)
        if batch is None:
            await self._flush_when_idle()
            return []
        kw = draws or {}
        t0 = time.perf_counter()
        if chain:
            landing = await self.backend.submit(batch, greedy=greedy, **kw)
            return await self._land(InFlight(out.scheduled, landing, time.perf_counter() - t0))
        track = any(r.retention is not None and r.retention.evict for r, _ in out.scheduled)
        mass = np.zeros(batch.block_tables.shape, np.float32) if track else None  # (S, max_blocks)
        # (S, vocab), or (S,) ids when greedy or drawn on the device
        logits = await self.backend.forward(batch, greedy=greedy, attention_mass=mass, **kw)
        self.counters["forward_s"] += time.perf_counter() - t0
        if track:
            self.kv.add_attention_mass([r.seq for r, _ in out.scheduled], mass)
        return await self._results(out.scheduled, logits, greedy or draws is not None)

    async def _land(self, flight: InFlight) -> list[StepOutput]:
        """A submitted step's turn: the next step goes to the GPU first where the chain allows, then this one's
        ids are read and handed out (decode_chain.py)."""
        self.in_flight = None
        following = await self.chain.submit_next(flight) if self.chain.allows(flight.scheduled, True, None) else None
        t0 = time.perf_counter()
        ids = await flight.landing
        self.counters["forward_s"] += flight.submit_s + time.perf_counter() - t0
        self.in_flight = following
        results = await self._results(flight.scheduled, ids, True, marked=flight.marked)
        if following is not None and all(r.status is SequenceStatus.FINISHED for r, _ in following.scheduled):
            self.in_flight = None  # every row stopped one step early: the extra step's ids go unread
            await following.landing
        return results

    async def _results(self, scheduled: list, logits, ids: bool, marked: bool = False) -> list[StepOutput]:
        """A step's outputs: its KV counted computed (unless `marked` already), the disk's write-behind, each
        sampling row's token from `logits` ((S, vocab), or (S,) drawn ids when `ids`, or DrawnTokens: the ids
        of a shaped step with their log-probs)."""
        members = self.groups.members
        drawn = logits if isinstance(logits, DrawnTokens) else None
        self.counters["steps"] += 1
        results = []
        if not marked:
            for req, n in scheduled:
                if req.status is not SequenceStatus.FINISHED:  # aborted while the backend ran; its blocks are free
                    self.kv.mark_computed(req.seq, n)
        if self.disk is not None:  # before sampling: a finished request gives its blocks back
            computed = [r.seq for r, _ in scheduled if r.status is not SequenceStatus.FINISHED]
            store = self.disk.plan_store(self.kv, computed)
            words = await self.mover.read(store) if store is not None else None
            self.counters["disk_written_blocks"] += await self.disk.store(store, words)
        for i, (req, n) in enumerate(scheduled):
            if req.status is SequenceStatus.FINISHED:  # aborted while the backend (or the disk) ran
                continue
            seq = req.seq
            member = members[req.request_id]
            if seq.num_computed_tokens < seq.num_tokens and not self.chain.is_placeholder(req):
                self.counters["prefill_tokens"] += n  # a prefill chunk: nothing to sample yet
                results.append(StepOutput(member.group_id, [], "", False, index=req.index))
                continue
            self.counters["decode_tokens" if n == 1 and req.output_ids else "prefill_tokens"] += n
            row = int(drawn.ids[i] if drawn is not None else logits[i]) if ids else logits[i]
            if member.beam is not None:
                member.beam.offer(req, row)
                continue
            top_n = member.sampler.params.logprobs
            entry = drawn.entry(i, top_n) if drawn is not None and top_n is not None else None
            for sample in self.groups.fork_samples(self.scheduler, member):  # drawn on the device: one sample
                results.append(self._sample(sample, row, entry))
        results.extend(self.groups.beam_steps(self.scheduler))
        await self._flush_when_idle()
        return results

    def _device_draws(self, scheduled: list) -> dict | None:
        """forward's draws (draw_kw) for a backend that samples on the device, when every row's draw can be made
        there (no beam, no fork of n samples, Sampler.on_device), else None."""
        if not getattr(self.backend, "samples_on_device", False):
            return None
        members = [self.groups.members[r.request_id] for r, _ in scheduled]
        if not all(m.beam is None and m.fork_params is None and m.sampler.on_device for m in members):
            return None
        return self.draw_kw([(req, m.sampler, req.seq.num_computed_tokens + n >= req.seq.num_tokens)
                             for (req, n), m in zip(scheduled, members)])

    def draw_kw(self, rows: list) -> dict:
        """Backend.forward / submit keywords drawing rows (request, sampler, whether it samples this step) on
        the device: draws (S, 4) f32 (temperature, top_p, u, 0) and, where a row is shaped, its Shaping
        (device_draws.py). The rows that sample take their sampler's random number now, as Sampler.sample
        would after the forward."""
        if self.device_draws is None:
            self.device_draws = DeviceDraws(self.backend.max_num_seqs, self.backend.config.vocab)
        draws, shaping = self.device_draws.draws(rows)
        return {"draws": draws} if shaping is None else {"draws": draws, "shaping": shaping}

    async def _flush_when_idle(self) -> None:
        """With no request left (a turn ended), what the background writer has queued is written now and the
        disk's LRU order after it (kv/disk_cache.py); while requests run, once a reply has ended, one batch of the
        queue in each step (DiskCache.write_slice)."""
        if self.disk is None:
            return
        if self.has_unfinished:
            self.counters["disk_written_blocks"] += await self.disk.write_slice(self.kv.live)
        elif not self.disk.write_when_idle():
            await self.disk.tier.flush(force=True)

    def _disk_written(self, n: int) -> None:
        self.counters["disk_written_blocks"] += n

    def _sample(self, req: Request, logits_or_token, entry=None) -> StepOutput:
        """req's token from its logits row (or the id drawn on the device, with its log-prob `entry` where
        asked for) handed out as a StepOutput; it is retired when the token finishes it."""
        member = self.groups.members[req.request_id]
        top_n = member.sampler.params.logprobs
        if isinstance(logits_or_token, int):
            token = logits_or_token
        else:
            token = member.sampler.sample(logits_or_token, req.seq.token_ids, req.output_ids)
            if top_n is not None:
                entry = token_logprob(logits_or_token, token, top_n)
        reason = "stop" if token in member.stop_ids else (
            "length" if len(req.output_ids) + 1 >= req.max_tokens else None)
        if self.chain.is_placeholder(req):  # the next step already computes it (decode_chain.py)
            self.chain.resolve(req, token, finished=reason is not None)
        else:
            req.append_token(token)
        text = "" if reason == "stop" else member.decoder.push(token)
        if reason is not None:
            text += member.decoder.flush()
            self._retire(req, reason)
        return StepOutput(member.group_id, [token], text, reason is not None, reason, index=req.index,
                          logprobs=None if entry is None else [entry])

    def _retire(self, req: Request, reason: str) -> None:
        self.groups.retire(self.scheduler, req, reason)

    def stats(self) -> dict:
        """Plain-data snapshot for the dashboard, benchmarks and tests."""
        pool, cpu = self.kv.pool, self.kv.cpu_pool
        return {
            "model": self.name, "num_blocks": pool.num_blocks, "free_blocks": pool.num_free,
            # a shared pool: KV pages every model's requests hold, the pages weights hold, this model's own
            "used_blocks": pool.num_used - pool.num_reserved, "reserved_blocks": pool.num_reserved,
            "model_blocks": self.held_blocks,
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
    def held_blocks(self) -> int:
        """Distinct blocks this model's running requests hold (kv.accounting.kv_stats)."""
        return kv_stats(self.kv).used_blocks

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token takes on the device in the engine's dtype: K and V of every layer, scales and
        padding included (a CPU backend holds f32 arrays; this is what its dtype would take on a GPU)."""
        return self.kv_spec.bytes_per_token


def backend_kv_groups(backend):
    """The KV groups a backend's pools are laid out in (kv/groups.py: CpuBackend's and WebGpuBackend's `kv_groups`),
    None where they are one group (or a backend has none): one table per sequence."""
    groups = getattr(backend, "kv_groups", None)
    return groups if groups is not None and groups.is_hybrid else None


def _require_type(name: str, value: object, kind: type) -> None:
    # bool is an int subclass; a True priority would be a silent bug.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name} must be of type {kind.__name__}, got {type(value).__name__} {value!r}")
