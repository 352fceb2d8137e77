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
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from .config import CacheConfig
from .kv_cache_manager import KVCacheManager
from .kv_dtype import kv_dtype as lookup_kv_dtype
from .model_runner import build_batch
from .request import Request, RequestStatus
from .sampling import Sampler, SamplingParams
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence, check_token_ids
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
    kv_dtype: str | None = None  # KV cache dtype the backend must hold (pagedkv.kv_dtype); None: the backend's

    def __post_init__(self) -> None:
        if self.kv_dtype is not None:
            lookup_kv_dtype(self.kv_dtype)
        if self.max_context is not None and (not isinstance(self.max_context, int) or self.max_context < 2):
            raise ValueError(f"max_context must be an int >= 2 or None, got {self.max_context!r}")

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(self.max_num_batched_tokens, self.max_num_seqs, self.preemption,
                               self.swap_max_blocks)


@dataclass
class StepOutput:
    """What one request produced in one step (empty token list while its prefill is in progress)."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None


@dataclass
class _Tracked:
    request: Request
    sampler: Sampler
    decoder: StreamDecoder
    stop_ids: frozenset[int]
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
        cache = CacheConfig(num_blocks=backend.num_blocks, block_size=backend.block_size,
                            num_cpu_blocks=backend.num_cpu_blocks,
                            enable_prefix_caching=config.enable_prefix_caching, kv_dtype=self.kv_dtype)
        self.kv = KVCacheManager(cache, namespace=config.namespace)
        self.scheduler = Scheduler(config.scheduler_config(), self.kv)
        self._tracked: dict[str, _Tracked] = {}
        self._ids = itertools.count()
        self.default_stop_ids = frozenset(
            i for i in (_maybe(lambda: tokenizer.im_end_id), tokenizer.eos_token_id) if i is not None)
        self.counters = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "forward_s": 0.0,
                         "copy_ops": 0, "swap_out_blocks": 0, "swap_in_blocks": 0}

    # ---------------------------------------------------------------- requests

    def add_request(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), *,
                    request_id: str | None = None, priority: int = 0, session: str = "default") -> str:
        """Queue a generation from `prompt_ids`; returns its id. Raises ValueError / NeverFits up front."""
        prompt = list(prompt_ids)
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        check_token_ids(prompt)
        if max(prompt) >= self.tokenizer.vocab_size:
            raise ValueError(f"token id {max(prompt)} is outside the vocabulary ({self.tokenizer.vocab_size})")
        if len(prompt) >= self.context_length:
            raise ValueError(f"the prompt has {len(prompt):,} tokens but the model's context is "
                             f"{self.context_length:,}; shorten it (or start a new conversation)")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._tracked:
            raise ValueError(f"request id {rid!r} is already in use")
        max_tokens = min(params.max_tokens, self.context_length - len(prompt))
        req = Request(rid, Sequence(prompt, session=session), num_prompt_tokens=len(prompt),
                      max_tokens=max_tokens, priority=priority)
        self.scheduler.add(req)
        stops = frozenset(params.stop_token_ids) or self.default_stop_ids
        self._tracked[rid] = _Tracked(req, Sampler(params), StreamDecoder(self.tokenizer), stops,
                                      t_added=time.perf_counter())
        return rid

    def abort(self, request_id: str) -> Request:
        """Stop a request now; its blocks are freed, its output so far is kept on the Request."""
        tracked = self._tracked.pop(request_id, None)
        if tracked is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        req = tracked.request
        self.scheduler.remove(req)
        req.finish_reason = "abort"
        return req

    def request(self, request_id: str) -> Request:
        return self._tracked[request_id].request

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
        if not out.scheduled:
            return []
        batch = build_batch(out.scheduled, self.kv.block_size)
        # When every request that samples this step is plain greedy, the backend returns argmax ids only.
        greedy = all(self._tracked[r.request_id].sampler.params.greedy
                     and self._tracked[r.request_id].sampler.params.repetition_penalty == 1.0
                     for r, _ in out.scheduled)
        t0 = time.perf_counter()
        logits = await self.backend.forward(batch, greedy=greedy)  # (S, vocab), or (S,) ids when greedy
        self.counters["forward_s"] += time.perf_counter() - t0
        self.counters["steps"] += 1
        results = []
        for i, (req, n) in enumerate(out.scheduled):
            seq = req.seq
            seq.num_computed_tokens += n
            if seq.num_computed_tokens < seq.num_tokens:  # a prefill chunk: nothing to sample yet
                self.counters["prefill_tokens"] += n
                results.append(StepOutput(req.request_id, [], "", False))
                continue
            self.counters["decode_tokens" if n == 1 and req.output_ids else "prefill_tokens"] += n
            results.append(self._sample(req, int(logits[i]) if greedy else logits[i]))
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
            req.finish_reason = reason
            self.scheduler.remove(req)
            del self._tracked[req.request_id]
        tracked.text.append(text)
        return StepOutput(req.request_id, [token], text, reason is not None, reason)

    # ---------------------------------------------------------------- conveniences

    async def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), **kw) -> Request:
        """Run one request to completion (other queued requests run alongside it)."""
        rid = self.add_request(prompt_ids, params, **kw)
        req = self._tracked[rid].request
        while req.status is not RequestStatus.FINISHED:
            await self.step()
        return req

    def stats(self) -> dict:
        """Plain-data snapshot for the dashboard, benchmarks and tests."""
        pool = self.kv.pool
        return {
            "num_blocks": pool.num_blocks, "used_blocks": pool.num_used, "free_blocks": pool.num_free,
            "cached_blocks": pool.num_cached, "block_size": self.kv.block_size,
            "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
            "swapped": len(self.scheduler.swapped), "preemptions": dict(self.scheduler.num_preemptions),
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
