"""LLMEngine: add_request / step / abort over a scheduler, a paged KV cache manager and a backend.

    engine = LLMEngine(backend, tokenizer, EngineConfig(...))
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=64))
    while engine.has_unfinished:
        for out in await engine.step():
            print(out.text, end="")

`step` is async because the WebGPU backend awaits the GPU; under CPython the
CPU backend runs it with asyncio. One step: the scheduler picks the batch
(preempting if the pool is short), the backend runs the swap and copy-on-write
copies, then one forward over the mixed prefill/decode batch; finished
requests free their blocks (full ones stay in the prefix cache).

Parallel sampling (SamplingParams.n > 1): the prompt is prefilled once by one
request; when its logits arrive, n - 1 samples fork its blocks (ref counts up,
copy-on-write of the last partial block on their first append) and each draws
its first token from those same logits with its own seed (seed + index), so
sample i generates exactly what a lone request with seed + i would. add_request
returns one id; its StepOutputs carry `index` 0..n-1 and `request(id).samples`
lists the n Requests. Beam search (add_beam_search) runs its beams the same way.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .config import CacheConfig
from .beam_search import BeamGroup, BeamSearchParams, Hypothesis
from .kv_cache_manager import KVCacheManager, NeverFits
from .kv_retention import KVRetention, add_attention_mass
from .kv_dtype import kv_dtype as lookup_kv_dtype
from .model_runner import build_batch
from .request import Request
from .sampling import Sampler, SamplingParams
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence, SequenceStatus, check_token_ids
from .tokenizer import StreamDecoder, Tokenizer


@dataclass(frozen=True)
class EngineConfig:
    """Engine-wide settings; the pool size comes from the backend (it was derived from the GPU budget)."""

    max_num_batched_tokens: int = 256
    max_num_seqs: int = 16
    preemption: str = "auto"
    swap_max_blocks: int = 64
    enable_prefix_caching: bool = True
    namespace: str | None = None  # mixed into prefix hashes (e.g. the model id)
    max_context: int | None = None  # tokens per conversation (prompt + reply); None: the model's context
    retention: KVRetention | None = None  # default sliding window / eviction of every request
    kv_dtype: str | None = None  # KV cache dtype the backend must hold (pagedkv.kv_dtype); None: the backend's

    def __post_init__(self) -> None:
        if self.kv_dtype is not None:
            lookup_kv_dtype(self.kv_dtype)
        if self.max_context is not None and (not isinstance(self.max_context, int) or self.max_context < 2):
            raise ValueError(f"max_context must be an int >= 2 or None, got {self.max_context!r}")
        if self.retention is not None and not isinstance(self.retention, KVRetention):
            raise ValueError(f"retention must be a KVRetention or None, got {self.retention!r}")

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(self.max_num_batched_tokens, self.max_num_seqs, self.preemption,
                               self.swap_max_blocks)


@dataclass
class StepOutput:
    """What one request produced in one step (empty token list while its prefill is in progress).

    index: which of the request's parallel samples (or final beams) this is; 0 for a plain request."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    index: int = 0


@dataclass
class _Tracked:
    request: Request
    sampler: Sampler
    decoder: StreamDecoder
    stop_ids: frozenset[int]
    group_id: str  # the id the caller holds (a sample's or a beam's own request id differs)
    fork_params: SamplingParams | None = None  # n > 1 and the samples not forked yet
    beam: BeamGroup | None = None
    text: list[str] = field(default_factory=list)
    t_added: float = 0.0
    t_first_token: float | None = None


class LLMEngine:
    """Continuous batching over a paged KV cache; see the module docstring."""

    def __init__(self, backend, tokenizer: Tokenizer, config: EngineConfig = EngineConfig()) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.context_length = min(backend.config.context_length, config.max_context or backend.config.context_length)
        self.kv_dtype = getattr(backend, "kv_dtype", "f32")
        if config.kv_dtype is not None and config.kv_dtype != self.kv_dtype:
            raise ValueError(f"EngineConfig asks for {config.kv_dtype} KV but the {backend.name} backend holds "
                             f"{self.kv_dtype}; create the backend with kv_dtype={config.kv_dtype!r}")
        self.kv, self.scheduler = self._fresh_pool(backend)
        self._tracked: dict[str, _Tracked] = {}  # by the request's own id (a sample's or beam's: "<id>#<k>")
        self._beam_groups: dict[str, BeamGroup] = {}
        self._groups: dict[str, Request] = {}  # the caller's id -> the request that prefills the prompt
        self._finished_beams: dict[str, list[Hypothesis]] = {}
        self._ids = itertools.count()
        self.default_stop_ids = frozenset(
            i for i in (_maybe(lambda: tokenizer.im_end_id), tokenizer.eos_token_id) if i is not None)
        self.counters = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "forward_s": 0.0,
                         "copy_ops": 0, "swap_out_blocks": 0, "swap_in_blocks": 0,
                         "shifted_blocks": 0}

    # ---------------------------------------------------------------- requests

    def add_request(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), *,
                    request_id: str | None = None, priority: int = 0, session: str = "default",
                    retention: KVRetention | None = None, sampler: Sampler | None = None) -> str:
        """Queue a generation from `prompt_ids`; returns its id. Raises ValueError / NeverFits up front.

        With params.n > 1 the prompt is prefilled once and n samples fork from it (module docstring).
        retention (default: EngineConfig.retention) bounds the KV the request holds: with a sliding
        window the conversation may run past the model's context. sampler (default: Sampler(params))
        picks the request's tokens, e.g. a ForcedSampler scoring a known continuation."""
        if sampler is not None and params.n > 1:
            raise ValueError("a caller's sampler serves one sequence; use n=1 with sampler=")
        req = self._new_request(prompt_ids, params.max_tokens, request_id, priority, session, retention=retention)
        stops = frozenset(params.stop_token_ids) or self.default_stop_ids
        sampler = sampler if sampler is not None else Sampler(params.for_sample(0))
        self._tracked[req.request_id] = _Tracked(req, sampler, StreamDecoder(self.tokenizer),
                                                 stops, req.request_id, fork_params=params if params.n > 1 else None,
                                                 t_added=time.perf_counter())
        return req.request_id

    def add_beam_search(self, prompt_ids: list[int], params: BeamSearchParams, *, request_id: str | None = None,
                        priority: int = 0, session: str = "default") -> str:
        """Queue a beam search; its final beams come out as finished StepOutputs (index = rank) and as
        `beam_results(id)`. Refused up front (NeverFits) unless `width` beams of full length fit the pool."""
        req = self._new_request(prompt_ids, params.max_tokens, request_id, priority, session, copies=params.width)
        stops = frozenset(params.stop_token_ids) or self.default_stop_ids
        group = BeamGroup(req.request_id, replace(params, max_tokens=req.max_tokens), stops, req)
        self._tracked[req.request_id] = _Tracked(req, Sampler(SamplingParams()), StreamDecoder(self.tokenizer),
                                                 stops, req.request_id, beam=group, t_added=time.perf_counter())
        self._beam_groups[req.request_id] = group
        return req.request_id

    def _new_request(self, prompt_ids, max_tokens: int, request_id: str | None, priority: int, session: str,
                     copies: int = 1, retention: KVRetention | None = None) -> Request:
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
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._tracked or rid in self._groups:
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
        self.scheduler.add(req)
        self._groups[rid] = req
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
        return req

    def abort(self, request_id: str) -> Request:
        """Stop a request (all its samples or beams) now; their blocks are freed, output so far is kept."""
        members = [t.request for t in self._tracked.values() if t.group_id == request_id]
        if not members:
            raise KeyError(f"no unfinished request {request_id!r}")
        for req in members:
            del self._tracked[req.request_id]
            self.scheduler.remove(req)
            req.finish_reason = "abort"
        self._beam_groups.pop(request_id, None)
        return self._groups.pop(request_id)

    def rebuild(self, backend) -> list[str]:
        """Continue on a new backend (the GPU device was lost, or the pool was rebuilt with other settings).

        The old pool's contents are gone, so every unfinished request goes back to the waiting queue
        holding its exact token history (prompt + what it generated) and re-prefills it on the new
        pool, like a preemption by recompute; its sampler and stream decoder carry on. A request that
        could never fit the new pool is aborted with finish reason "error". Returns the requeued ids.
        """
        pending = sorted(self._tracked.values(), key=lambda t: Request.sort_key(t.request))
        self.backend = backend
        self.kv_dtype = getattr(backend, "kv_dtype", "f32")  # a new dtype is fine: everything re-prefills
        self.kv, self.scheduler = self._fresh_pool(backend)
        requeued: list[str] = []  # the callers' ids (a group of samples or beams counts once)
        for tracked in pending:
            req = tracked.request
            req.seq = Sequence(list(req.seq.token_ids), session=req.seq.session)
            try:
                self.scheduler.add(req)
            except NeverFits:
                self._retire(req, "error")
                continue
            req.num_preemptions += 1  # its cached-prompt count stays the one measured on admission
            if tracked.group_id not in requeued:
                requeued.append(tracked.group_id)
        return requeued

    def _fresh_pool(self, backend) -> tuple[KVCacheManager, Scheduler]:
        cache = CacheConfig(num_blocks=backend.num_blocks, block_size=backend.block_size,
                            num_cpu_blocks=backend.num_cpu_blocks,
                            enable_prefix_caching=self.config.enable_prefix_caching, kv_dtype=self.kv_dtype)
        kv = KVCacheManager(cache, namespace=self.config.namespace)
        return kv, Scheduler(self.config.scheduler_config(), kv)

    def request(self, request_id: str) -> Request:
        """The unfinished request `request_id` (with n > 1: sample 0, whose .samples lists all n)."""
        return self._groups[request_id]

    def beam_results(self, request_id: str) -> list[Hypothesis]:
        """The final beams of a finished beam search, best first; handed over once (KeyError while it runs)."""
        group = self._finished_beams.pop(request_id, None)
        if group is None:
            raise KeyError(f"no finished beam search {request_id!r}")
        return group

    @property
    def has_unfinished(self) -> bool:
        return bool(self._tracked)

    # ---------------------------------------------------------------- the step

    async def step(self) -> list[StepOutput]:
        """Schedule, copy, run one forward, sample; returns one StepOutput per request that ran."""
        out = self.scheduler.schedule()
        if out.swap_out:
            await self.backend.swap_out(out.swap_out)
            self.counters["swap_out_blocks"] += len(out.swap_out)
        if out.swap_in:
            await self.backend.swap_in(out.swap_in)
            self.counters["swap_in_blocks"] += len(out.swap_in)
        if out.copies:
            await self.backend.copy_blocks(out.copies)
            self.counters["copy_ops"] += len(out.copies)
        if out.shifts:
            await self.backend.shift_keys(out.shifts)
            self.counters["shifted_blocks"] += len(out.shifts)
        if not out.scheduled:
            return []
        batch = build_batch(out.scheduled, self.kv.block_size)
        # When every request that samples this step is plain greedy, the backend returns argmax ids only.
        greedy = all(t.beam is None and t.sampler.argmax_only
                     for t in (self._tracked[r.request_id] for r, _ in out.scheduled))
        track = any(r.retention is not None and r.retention.evict for r, _ in out.scheduled)
        mass = np.zeros(batch.block_tables.shape, np.float32) if track else None  # (S, max_blocks)
        t0 = time.perf_counter()
        # (S, vocab), or (S,) ids when greedy
        logits = await self.backend.forward(batch, greedy=greedy, attention_mass=mass)
        self.counters["forward_s"] += time.perf_counter() - t0
        if track:
            add_attention_mass([r.seq for r, _ in out.scheduled], mass)
        self.counters["steps"] += 1
        results = []
        for i, (req, n) in enumerate(out.scheduled):
            seq = req.seq
            seq.num_computed_tokens += n
            tracked = self._tracked[req.request_id]
            if seq.num_computed_tokens < seq.num_tokens:  # a prefill chunk: nothing to sample yet
                self.counters["prefill_tokens"] += n
                results.append(StepOutput(tracked.group_id, [], "", False, index=req.index))
                continue
            self.counters["decode_tokens" if n == 1 and req.output_ids else "prefill_tokens"] += n
            row = int(logits[i]) if greedy else logits[i]
            if tracked.beam is not None:
                tracked.beam.offer(req, row)
                continue
            for sample in self._fork_samples(tracked):
                results.append(self._sample(sample, row))
        for group in [g for g in self._beam_groups.values() if g.ready]:
            results.extend(self._beam_step(group))
        return results

    def _sample(self, req: Request, logits_or_token) -> StepOutput:
        tracked = self._tracked[req.request_id]
        if isinstance(logits_or_token, int):
            token = logits_or_token
        else:
            token = tracked.sampler.sample(logits_or_token, req.seq.token_ids)
        if tracked.t_first_token is None:
            tracked.t_first_token = time.perf_counter()
        req.output_ids.append(token)
        req.seq.token_ids.append(token)
        reason = "stop" if token in tracked.stop_ids else (
            "length" if len(req.output_ids) >= req.max_tokens else None)
        text = "" if reason == "stop" else tracked.decoder.push(token)
        if reason is not None:
            text += tracked.decoder.flush()
            self._retire(req, reason)
        tracked.text.append(text)
        return StepOutput(tracked.group_id, [token], text, reason is not None, reason, index=req.index)

    def _retire(self, req: Request, reason: str) -> None:
        """A request is done (finished or pruned): free its blocks now; forget its group with its last member."""
        req.finish_reason = reason
        self.scheduler.remove(req)
        group_id = self._tracked.pop(req.request_id).group_id
        if not any(t.group_id == group_id for t in self._tracked.values()):
            self._groups.pop(group_id, None)

    # ---------------------------------------------------------------- forks: parallel samples and beams

    def _fork(self, parent: Request, request_id: str, index: int) -> Request:
        """A request continuing `parent`'s token history on shared blocks (ref counts up; the last partial
        block is copied on its first append). A parent preempted meanwhile cannot share: the fork
        recomputes its history (the prefix cache still serves the full blocks it finds)."""
        src = parent.seq
        if src.status is SequenceStatus.RUNNING and src.num_computed_tokens == src.num_tokens:
            seq = self.kv.fork(src)
        else:
            seq = Sequence(src.token_ids, session=src.session)
        child = Request(request_id, seq, parent.num_prompt_tokens, parent.max_tokens, parent.priority,
                        arrival=parent.arrival, output_ids=list(parent.output_ids), index=index,
                        num_cached_prompt_tokens=parent.num_cached_prompt_tokens, retention=parent.retention)
        self.scheduler.add_fork(child)
        return child

    def _fork_samples(self, tracked: _Tracked) -> list[Request]:
        """The requests that sample from the logits that just arrived: the request itself and, when these
        are its prompt's logits and n > 1, its n - 1 samples forked before anyone appends a token."""
        parent = tracked.request
        params = tracked.fork_params
        if params is None:
            return [parent]
        tracked.fork_params = None
        parent.samples = [parent]
        for i in range(1, params.n):
            child = self._fork(parent, f"{parent.request_id}#{i}", i)
            self._tracked[child.request_id] = _Tracked(child, Sampler(params.for_sample(i)),
                                                       StreamDecoder(self.tokenizer), tracked.stop_ids,
                                                       tracked.group_id, t_added=tracked.t_added)
            parent.samples.append(child)
        return parent.samples

    def _beam_step(self, group: BeamGroup) -> list[StepOutput]:
        """Every live beam has its next-token log-probs: keep the best continuations. A parent chosen twice
        forks (before either appends), a parent not chosen is freed at once; a finished search frees all."""
        parents = list(group.beams)
        choices = group.advance()
        if group.results is not None:
            for req in parents:
                self._retire(req, "beam")
            self._beam_groups.pop(group.group_id)
            self._finished_beams[group.group_id] = group.results
            return [StepOutput(group.group_id, list(h.token_ids), self.tokenizer.decode(
                        [t for t in h.token_ids if t not in group.stop_ids]), True, h.finish_reason, index=i)
                    for i, h in enumerate(group.results)]
        owners: list[Request] = []
        kept: set[int] = set()
        for c in choices:
            if c.parent in kept:
                child = self._fork(parents[c.parent], f"{group.group_id}#{next(self._ids)}", 0)
                self._tracked[child.request_id] = _Tracked(child, self._tracked[parents[c.parent].request_id].sampler,
                                                           StreamDecoder(self.tokenizer), group.stop_ids,
                                                           group.group_id, beam=group)
                owners.append(child)
            else:
                kept.add(c.parent)
                owners.append(parents[c.parent])
        for i, req in enumerate(parents):
            if i not in kept:
                self._retire(req, "pruned")
        for req, c in zip(owners, choices):
            req.output_ids.append(c.token)
            req.seq.token_ids.append(c.token)
        group.beams = owners
        group.cum_logprobs = [c.cum_logprob for c in choices]
        return []

    # ---------------------------------------------------------------- conveniences

    async def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), **kw) -> Request:
        """Run one request (with n > 1: all its samples, see .samples) to completion; other queued requests
        run alongside it."""
        rid = self.add_request(prompt_ids, params, **kw)
        req = self._groups[rid]
        while rid in self._groups:
            await self.step()
        return req

    async def beam_search(self, prompt_ids: list[int], params: BeamSearchParams, **kw) -> list[Hypothesis]:
        """Run one beam search to completion; its final beams, best first."""
        rid = self.add_beam_search(prompt_ids, params, **kw)
        while rid in self._groups:
            await self.step()
        return self.beam_results(rid)

    def stats(self) -> dict:
        """Plain-data snapshot for the dashboard, benchmarks and tests."""
        pool = self.kv.pool
        return {
            "num_blocks": pool.num_blocks, "used_blocks": pool.num_used, "free_blocks": pool.num_free,
            "cached_blocks": pool.num_cached, "block_size": self.kv.block_size,
            "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
            "swapped": len(self.scheduler.swapped), "preemptions": dict(self.scheduler.num_preemptions),
            "evicted_blocks": self.scheduler.num_evicted_blocks,
            "prefix_hit_rate": self.kv.prefix_hit_rate, "kv_dtype": self.kv_dtype,
            "bytes_per_token": self.bytes_per_token, **self.counters,
        }

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token takes on the device in the engine's dtype: K and V of every layer, scales and
        padding included (a CPU backend holds f32 arrays; this is what its dtype would take on a GPU)."""
        cfg = self.backend.config
        return 2 * cfg.n_layers * lookup_kv_dtype(self.kv_dtype).token_bytes(cfg.n_kv_heads, cfg.head_dim)


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


def _maybe(fn):
    try:
        return fn()
    except (ValueError, KeyError, AttributeError):
        return None
