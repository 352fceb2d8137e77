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

Several models: `LLMEngine(..., model=name, pool=BlockPool(pages))` puts the first model in a pool of
pages that `add_model` shares with the next ones (kv.accounting.SharedKVBudget sizes the pages; each backend
addresses every page); each model is a lane (lanes.py) with its own scheduler, and one step runs one forward per
model with work. A model short of blocks preempts lower-ranked requests of any model. `add_model(...,
reserve_blocks=n)` takes the pages its weights need out of the pool (refused, with the numbers, when they
are not free or cached, or when a queued request would no longer fit); `remove_model` aborts its requests and
gives its pages back. With one model everything below is that model's (engine.kv, engine.scheduler, ...).

An abort may arrive while a step awaits the backend (the user presses Stop in
one chat while another streams): the request's blocks are freed at once and the
step drops its output. The step built its batch before its first await, and
freed blocks are handed out again only by the next schedule, so the writes of
the step in flight land in no block anyone holds.
"""
from __future__ import annotations

import asyncio
import itertools

from .beam_search import BeamSearchParams, Hypothesis
from .config import EngineConfig
from .kv.accounting import block_map
from .kv.block_files import DiskKey, model_hash
from .kv.block_pool import BlockPool, OutOfBlocks
from .kv.disk_tier import DiskTier, TierBudgets
from .kv.manager import NeverFits
from .lanes import ModelLane
from .request import Request, StepOutput
from .sampling import SamplingParams
from .tokenizer import Tokenizer

__all__ = ["EngineConfig", "LLMEngine", "NeverFits", "StepOutput", "TierBudgets", "run_sync"]


def _of_first(name: str) -> property:
    """LLMEngine.<name>: the first model's ModelLane.<name>."""
    return property(lambda self: getattr(self.lane(), name), doc=f"The first model's {name} (ModelLane.{name}).")


class LLMEngine:
    """Continuous batching over a paged KV cache, for one model or several sharing a pool; see the module
    docstring."""

    def __init__(self, backend, tokenizer: Tokenizer, config: EngineConfig = EngineConfig(), *,
                 model: str = "default", pool: BlockPool | int | None = None, backed_pages: int | None = None) -> None:
        """pool: the BlockPool several models will share (or its number of pages), None for one model's own.
        backed_pages: the pages memory stands behind (the CPU path's page buffer: the budget less the first
        models' weights); the pages past them only ever hold weights (`spare`), never KV."""
        self.config = config
        self.pool = BlockPool(pool) if isinstance(pool, int) and not isinstance(pool, bool) else pool
        self.backed_pages = backed_pages if backed_pages is not None or self.pool is None else self.pool.num_blocks
        self._spare = self.pool.reserve_top(self.pool.num_blocks - self.backed_pages) if self.pool else []
        self.lanes: dict[str, ModelLane] = {}
        self._ids = itertools.count()  # request ids, unique across the models
        # A step, a disk flush and a chat's disk cleanup each run alone: a flush reads back blocks a step may
        # be filling and lists the store the others write. Uncontended it never waits (run_sync drives it).
        self._lock = asyncio.Lock()
        self._add_lane(model, backend, tokenizer)

    # ---------------------------------------------------------------- models

    def _add_lane(self, name: str, backend, tokenizer: Tokenizer) -> ModelLane:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a model needs a non-empty name, got {name!r}")
        if name in self.lanes:
            raise ValueError(f"model {name!r} is loaded already")
        namespace = self.config.namespace if self.pool is None else f"{name}/{backend.kv_dtype}"
        lane = ModelLane(name, backend, tokenizer, self.config, namespace=namespace, shared_pool=self.pool,
                         ids=self._ids, peer_victim=lambda req, mine=name: self._peer_victim(mine, req))
        self.lanes[name] = lane
        return lane

    @property
    def models(self) -> list[str]:
        """The loaded models' names, the first (engine.kv, engine.backend, ... are its) first."""
        return list(self.lanes)

    def lane(self, model: str | None = None) -> ModelLane:
        """The lane of `model` (None: the first model); ValueError naming the loaded ones."""
        if model is None:
            return next(iter(self.lanes.values()))
        lane = self.lanes.get(model)
        if lane is None:
            raise ValueError(f"no model {model!r} is loaded; loaded: {self.models}")
        return lane

    def add_model(self, name: str, backend, tokenizer: Tokenizer, *, reserve_blocks: int = 0) -> None:
        """Load another model into the shared pool: `backend` addresses all of its pages (its num_blocks is
        the pool's) with its own block size. reserve_blocks: pages its weights take out of the pool (a budget
        holds weights and KV together). Raises NeverFits when they are not free or cached now (running
        requests hold the rest) or when a request in the engine would no longer fit what is left."""
        if self.pool is None:
            raise ValueError("this engine's KV pool is its model's own; create it with pool=BlockPool(...) to "
                             "share the pool between several models")
        if name in self.lanes:
            raise ValueError(f"model {name!r} is loaded already")
        reserved = self._reserve(name, reserve_blocks)
        try:
            lane = self._add_lane(name, backend, tokenizer)
        except BaseException:
            self.pool.release(reserved)
            raise
        lane.reserved_blocks = reserved

    def reserve_for(self, model: str, num_blocks: int) -> None:
        """Take `num_blocks` more pages out of the pool for `model` (its weights, loaded after it joined)."""
        lane = self.lane(model)
        lane.reserved_blocks += self._reserve(model, num_blocks)

    def _reserve(self, name: str, n: int) -> list[int]:
        pool = self.pool
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"reserve_blocks must be an int >= 0, got {n!r}")
        if n > pool.num_available + len(self._spare):
            raise NeverFits(f"{name} needs {n:,} pages of the budget; {pool.num_available + len(self._spare):,} of "
                            f"{pool.num_blocks:,} are free or cached ({pool.num_reserved:,} hold other models' "
                            f"weights, {pool.num_used - pool.num_reserved:,} running requests' KV)")
        left = pool.capacity - max(0, n - len(self._spare))  # the spare pages hold no KV: they cost none
        for lane in self.lanes.values():
            for req in lane.scheduler.waiting + lane.scheduler.running + lane.scheduler.swapped:
                need = lane.kv.blocks_needed(req.max_total_tokens, self.config.max_num_batched_tokens)
                if need > left:
                    raise NeverFits(f"{name} needs {n:,} pages of the budget; then {lane.name}'s request "
                                    f"{req.request_id} ({need:,} pages) would no longer fit the {left:,} left")
        spare, self._spare = self._spare[:n], self._spare[n:]  # pages no memory stands behind go first
        try:
            return spare + pool.reserve(n - len(spare))
        except OutOfBlocks as exc:
            self._spare = spare + self._spare
            raise NeverFits(str(exc)) from None

    async def unback_pages(self, n: int, reallocate) -> None:
        """The top `n` pages memory stands behind give it up for a model loaded at run time (the GPU path
        reallocates its page buffers smaller: `reallocate(pages)` does it, after a step in flight): they
        become spare pages, for weights only. Only while no request holds a page (the buffers' content is not
        carried over; cached pages are evicted): NeverFits with the numbers otherwise."""
        pool = self.pool
        async with self._lock:
            held = pool.num_used - pool.num_reserved
            if held or not 0 < n <= self.backed_pages - 2:
                why = (f"running requests hold {held:,} of them now" if held else
                       f"{self.backed_pages:,} are backed and the KV pool keeps at least 2")
                raise NeverFits(f"giving up {n:,} pages of KV memory for a model's buffers needs them free; {why}")
            ids = range(self.backed_pages - n, self.backed_pages)
            pool.evict_cached(range(pool.num_blocks))  # every page's content goes with the buffers
            if any(pool.is_reserved(b) for b in ids):
                raise NeverFits(f"pages {ids[0]}..{ids[-1]} hold weights; the top {n:,} backed pages are not free")
            reallocate(self.backed_pages - n)
            self._spare += pool.reserve_ids(ids)
            self.backed_pages -= n

    def remove_model(self, name: str) -> list[str]:
        """Unload `name`: its requests are aborted (their ids returned), its cached pages and the pages its
        weights held go back to the pool, its backend's GPU buffers (where it has any: destroy) to their ledger.
        An engine's only model stays."""
        lane = self.lane(name)
        if len(self.lanes) == 1:
            raise ValueError(f"{name} is the engine's only model")
        aborted = list(lane.groups.roots)
        for rid in aborted:
            lane.abort(rid)
        lane.kv.evict_all_cached()
        self._spare += [b for b in lane.reserved_blocks if b >= self.backed_pages]  # no memory: weights' only
        self.pool.release([b for b in lane.reserved_blocks if b < self.backed_pages])
        if lane.kv.null_block is not None:  # its window groups' placeholder page
            self.pool.release([lane.kv.null_block])
        del self.lanes[name]
        if hasattr(lane.backend, "destroy"):
            lane.backend.destroy()
        return aborted

    def _peer_victim(self, model: str, req: Request) -> bool:
        """Preempt, by recompute, the lowest-ranked running request of another model that ranks below `req`;
        False when there is none."""
        rank = Request.sort_key(req)
        # A lane with a step in flight (decode_chain.py) is not preempted: its next token ids are still on the GPU.
        below = [(lane, other) for lane in self.lanes.values() if lane.name != model and lane.in_flight is None
                 for other in lane.scheduler.running if Request.sort_key(other) > rank]
        if not below:
            return False
        lane, victim = max(below, key=lambda pair: Request.sort_key(pair[1]))
        lane.scheduler.preempt_for_peer(victim)
        return True

    # ---------------------------------------------------------------- the first model's parts

    # With one model, everything the engine was before it held several.
    backend = _of_first("backend")
    tokenizer = _of_first("tokenizer")
    kv = _of_first("kv")  # its KVCacheManager
    scheduler = _of_first("scheduler")
    tiers = _of_first("tiers")
    mover = _of_first("mover")
    groups = _of_first("groups")
    counters = _of_first("counters")
    kv_spec = _of_first("kv_spec")
    context_length = _of_first("context_length")
    default_stop_ids = _of_first("default_stop_ids")
    kv_dtype = _of_first("kv_dtype")  # a name of pagedkv.kv.dtypes
    bytes_per_token = _of_first("bytes_per_token")  # KV bytes one token takes on the device
    disk = _of_first("disk")  # the disk tier in use, or None

    def attach_disk(self, tier: DiskTier | None, background: bool = False) -> None:
        """Use `tier` (kv.disk_tier.DiskTier, opened) as the disk tier of the first model's KV cache, or none;
        background: written once the engine is idle (kv/disk_cache.py). Raises ValueError when its files hold
        other KV than its backend's."""
        self.lane().attach_disk(tier, background)

    # ---------------------------------------------------------------- requests

    def add_request(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), *,
                    model: str | None = None, request_id: str | None = None, **kw) -> str:
        """Queue a generation from `prompt_ids` for `model` (None: the first); returns its id. Raises
        ValueError / NeverFits up front. See ModelLane.add_request for the other arguments."""
        self._check_id(request_id)
        return self.lane(model).add_request(prompt_ids, params, request_id=request_id, **kw)

    def add_beam_search(self, prompt_ids: list[int], params: BeamSearchParams, *, model: str | None = None,
                        request_id: str | None = None, **kw) -> str:
        """Queue a beam search (ModelLane.add_beam_search) for `model` (None: the first)."""
        self._check_id(request_id)
        return self.lane(model).add_beam_search(prompt_ids, params, request_id=request_id, **kw)

    def _check_id(self, request_id: str | None) -> None:
        if isinstance(request_id, str) and any(lane.groups.in_use(request_id) for lane in self.lanes.values()):
            raise ValueError(f"request id {request_id!r} is already in use")

    def _lane_of(self, request_id: str) -> ModelLane:
        for lane in self.lanes.values():
            if lane.is_unfinished(request_id):
                return lane
        return self.lane()

    def abort(self, request_id: str) -> Request:
        """Stop a request (all its samples or beams) now; their blocks are freed, output so far is kept.
        Safe while a step awaits the backend: that step drops the request's output. KeyError when unknown."""
        return self._lane_of(request_id).abort(request_id)

    def rebuild(self, backend, model: str | None = None) -> list[str]:
        """Continue `model` (None: the first) on a new backend: ModelLane.rebuild."""
        return self.lane(model).rebuild(backend)

    def is_unfinished(self, request_id: str) -> bool:
        """Whether `request_id` still runs (False once finished or aborted, also while the step that finished it
        has not returned its output yet)."""
        return any(lane.is_unfinished(request_id) for lane in self.lanes.values())

    def request(self, request_id: str) -> Request:
        """The unfinished request `request_id` (with n > 1: sample 0, whose .samples lists all n)."""
        return self._lane_of(request_id).request(request_id)

    def model_of(self, request_id: str) -> str:
        """The model an unfinished request runs on."""
        return self._lane_of(request_id).name

    def beam_results(self, request_id: str) -> list[Hypothesis]:
        """The final beams of a finished beam search, best first; handed over once (KeyError while it runs)."""
        for lane in self.lanes.values():
            if request_id in lane.groups.finished_beams:
                return lane.beam_results(request_id)
        return self.lane().beam_results(request_id)

    @property
    def has_unfinished(self) -> bool:
        return any(lane.has_unfinished for lane in self.lanes.values())

    # ---------------------------------------------------------------- the step

    async def step(self) -> list[StepOutput]:
        """Schedule, copy, run one forward per model with work, sample; returns one StepOutput per request
        that ran (none for one aborted while the step awaited the backend)."""
        async with self._lock:
            busy = [lane for lane in self.lanes.values()
                    if lane.has_unfinished or lane.in_flight is not None] or [self.lane()]
            results: list[StepOutput] = []
            for lane in busy:
                results += await lane.step()
            return results

    # ---------------------------------------------------------------- conveniences

    async def generate(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), **kw) -> Request:
        """Run one request (with n > 1: all its samples, see .samples) to completion; other queued requests
        run alongside it."""
        rid = self.add_request(prompt_ids, params, **kw)
        req = self.request(rid)
        while self.is_unfinished(rid):
            await self.step()
        return req

    async def beam_search(self, prompt_ids: list[int], params: BeamSearchParams, **kw) -> list[Hypothesis]:
        """Run one beam search to completion; its final beams, best first."""
        rid = self.add_beam_search(prompt_ids, params, **kw)
        while self.is_unfinished(rid):
            await self.step()
        return self.beam_results(rid)

    def stats(self, model: str | None = None) -> dict:
        """Plain-data snapshot of `model` (None: the first) for the dashboard, benchmarks and tests."""
        return self.lane(model).stats()

    def pool_stats(self) -> dict | None:
        """The shared pool's pages (None with one model's own pool): total, free, cached, held by weights and
        null pages (reserved), past the memory and held by none (spare), and each model's KV, weights and null
        pages (the placeholder page of a model with window KV groups: kv/manager.py)."""
        pool = self.pool
        if pool is None:
            return None
        return {"pages": pool.num_blocks, "free_pages": pool.num_free, "cached_pages": pool.num_cached,
                # weights' and null pages, and those past the memory (backed_pages) no model holds now
                "reserved_pages": pool.num_reserved - len(self._spare), "spare_pages": len(self._spare),
                "backed_pages": self.backed_pages,
                "models": {name: {"kv_pages": lane.held_blocks, "weights_pages": len(lane.reserved_blocks),
                                  "null_pages": int(lane.kv.null_block is not None),
                                  "block_size": lane.kv.block_size}
                           for name, lane in self.lanes.items()}}

    # ---------------------------------------------------------------- the app's facade
    # What the chat app asks of the KV memory hierarchy; it imports nothing from pagedkv.kv, so the
    # pool, the manager and the tiers can change behind these methods. They are the first model's.

    async def open_disk_tier(self, store, manifest: dict, budget_bytes: int, model: str | None = None,
                             background: bool = False) -> None:
        """Open the disk tier over `store` (a file_store.FileStore: OPFS `kv/` in the page) for `model` (None:
        the first; its identity: the manifest's config and shard sha256s) under `budget_bytes`, and use it.
        A second model's tier shares the first one's store, LRU and budget. background: write-behind through a
        writer task, not in the step (kv/disk_cache.py; the page). Raises what listing the store raises; the
        model keeps no tier then."""
        lane = self.lane(model)
        shared = next((other.disk.tier for other in self.lanes.values() if other.disk is not None
                       and other is not lane), None)
        tier = DiskTier(store, DiskKey(model_hash(manifest), lane.kv_spec), budget_bytes, share_with=shared)
        await tier.open()
        lane.attach_disk(tier, background)

    @property
    def disk_enabled(self) -> bool:
        """Whether a disk tier is attached (to any model)."""
        return any(lane.disk is not None for lane in self.lanes.values())

    def cached_prefix_tokens(self, token_ids, model: str | None = None) -> int:
        """Leading tokens of `token_ids` that `model` (None: the first) need not compute (whole blocks): the GPU
        prefix cache's, extended by what the CPU tier and the disk tier hold now (as the scheduler will restore
        them); changes nothing."""
        lane = self.lane(model)
        kv = lane.kv
        prefix = list(token_ids[:len(token_ids) // kv.block_size * kv.block_size])
        cpu = kv.cpu.cached_blocks(prefix, len(prefix) // kv.block_size) if kv.cpu is not None else None
        on_disk = lane.disk.holder(prefix) if lane.disk is not None else None
        if cpu is None and on_disk is None:
            return kv.lookup_prefix(prefix)[0]
        hit = kv.tier_hit(prefix, lambda g, i: (cpu is not None and i in cpu[g])
                          or (on_disk is not None and on_disk(g, i)))
        return hit.num_blocks * kv.block_size

    def refer_history(self, owner: str, token_ids, model: str | None = None) -> None:
        """`owner` (a chat) now holds the history `token_ids` of `model`: the disk tier keeps its block files
        for it (replacing what it held before) and flush_disk writes its blocks. Nothing without a disk tier."""
        lane = self.lane(model)
        if lane.disk is not None:
            lane.disk.refer(owner, token_ids)

    def forget_history(self, token_ids, keep_tokens: int = 0, model: str | None = None) -> None:
        """A history of `model` (None: the first) nobody holds any more (a deleted chat): its cached blocks past
        the first `keep_tokens` tokens (what another history shares) leave the GPU prefix cache and the CPU
        tier. Blocks a live or swapped sequence holds stay."""
        kv = self.lane(model).kv
        kv.evict_prefix(token_ids, keep_tokens=keep_tokens)
        if kv.cpu is not None:
            kv.cpu.forget(token_ids, keep_tokens=keep_tokens)

    async def forget_owner(self, owner: str) -> int:
        """Drop `owner` (a deleted chat) from the disk tier and delete the block files only its history
        referenced; returns how many. 0 without a disk tier."""
        async with self._lock:  # not while flush_disk lists the store: it would count the file as another tab's
            return sum([await lane.disk.forget(owner) for lane in self.lanes.values() if lane.disk is not None])

    @property
    def disk_writing(self) -> bool:
        """Whether a background disk writer (any model's) has blocks queued or is writing them."""
        return any(lane.disk is not None and lane.disk.writing for lane in self.lanes.values())

    async def settle_disk(self) -> None:
        """Wait until every model's background disk writer (open_disk_tier(background=True)) has stored what
        it had queued; an error it raised comes out of the next step, not here."""
        for lane in list(self.lanes.values()):
            if lane.disk is not None:
                await lane.disk.settle()

    async def flush_disk(self) -> int:
        """Write every full block of KV that the GPU holds computed, of a chat's history (refer_history) or a
        request in progress, and that the disk tier lacks (a write that failed, a file another tab of the
        origin deleted: the store is listed again first), then the disk's LRU order; every model's. Waits for
        a step in flight. Returns the block files written; 0 without a disk tier. The page calls it when it is
        hidden or left; what write-behind wrote already is not written again."""
        written = 0
        async with self._lock:
            for lane in self.lanes.values():
                disk = lane.disk
                if disk is None:
                    continue
                await disk.drain()  # what write-behind queued: written first, and not twice
                await disk.tier.resync()
                plan = disk.plan_flush(lane.kv)
                words = await lane.mover.read(plan) if plan is not None else None
                n = await disk.store(plan, words, now=True)
                lane.counters["disk_written_blocks"] += n
                written += n
                await disk.tier.flush(force=True)
        return written

    def kv_snapshot(self) -> dict:
        """Plain data of the GPU block pool for the memory panel (kv.accounting.block_map): blocks by chat;
        with several models, every model's chats (one owner list; a session's blocks are one model's), "w" for
        a page weights hold, `models` (pool_stats: each model's pages) and `owner_models` (each owner's model)."""
        if self.pool is None:
            return block_map(self.kv)
        lanes = list(self.lanes.values())
        snap = block_map(lanes[0].kv, tuple(lane.kv for lane in lanes[1:]))
        owner_of = snap.pop("owner_of", [0] * len(snap["owners"]))  # absent with one model
        cells = list(snap["cells"])
        for lane in lanes:
            for bid in lane.reserved_blocks:
                cells[bid] = "w"
        return dict(snap, cells="".join(cells), owner_models=[lanes[k].name for k in owner_of],
                    models=self.pool_stats()["models"])


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
