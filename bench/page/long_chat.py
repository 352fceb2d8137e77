# Runs inside the page's worker (Pyodide): one conversation past the model's context on WebGpuBackend with a
# sliding window + attention sinks, driven in time slices so no single page call runs for half an hour.
import time

import numpy as np

from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.retention import KVRetention
from pagedkv.sampling import ForcedSampler, SamplingParams
from pagedkv.tokenizer import Tokenizer

NEVER_STOP = (1_000_000,)  # a stop id outside every vocabulary: the corpus text must not end the request


class LongChat:
    """The corpus' first `context` tokens as the conversation so far (one prompt, prefilled in chunks), then
    `continuation` more corpus tokens teacher-forced through decode steps (each step's full logits scored by a
    ForcedSampler), then a greedy reply of `reply` tokens; all one request whose sequence keeps growing."""

    def __init__(self, engine: LLMEngine, ledger: dict, tokens: list, context: int, continuation: int,
                 reply: int, retention: KVRetention) -> None:
        self.engine = engine
        self.ledger = ledger
        self.sampler = ForcedSampler(tokens[context:context + continuation])
        params = SamplingParams(max_tokens=continuation + reply, stop_token_ids=NEVER_STOP)
        self.rid = engine.add_request(tokens[:context], params, retention=retention, sampler=self.sampler)
        self.req = engine.request(self.rid)
        self.context, self.continuation, self.reply = context, continuation, reply
        self.retention = retention
        self.max_blocks_held = 0
        self.max_position = 0
        self.steps = 0
        self.seconds = 0.0
        self.prefill_seconds = 0.0
        self.freed_blocks = 0
        self.text: list[str] = []

    @classmethod
    async def start(cls, model: str, tokens: list, context: int, continuation: int, reply: int, window: int,
                    sinks: int, block_size: int, budget_mib: int, kv_dtype: str,
                    max_context: int | None) -> "LongChat":
        """Load `model` on a fresh WebGpuBackend under `budget_mib` and queue the conversation."""
        from bench.page.webgpu_engine import bench_backend  # imports the WebGPU backend: the page only

        _, backend, manifest, ledger = await bench_backend(budget_mib, kv_dtype, model=model, block_size=block_size)
        tok = Tokenizer.from_manifest(manifest)
        engine = LLMEngine(backend, tok, EngineConfig(namespace=model, max_context=max_context))
        return cls(engine, ledger, tokens, context, continuation, reply,
                   KVRetention(window_tokens=window, sink_tokens=sinks))

    @property
    def done(self) -> bool:
        return not self.engine.has_unfinished

    async def advance(self, seconds: float) -> dict:
        """Run engine steps for about `seconds` (at least one step); returns progress."""
        t_end = time.perf_counter() + seconds
        seq = self.req.seq
        bs = self.engine.kv.block_size
        while self.engine.has_unfinished:
            t0 = time.perf_counter()
            for out in await self.engine.step():
                if len(self.req.output_ids) > self.continuation:  # the reply, past the forced tokens
                    self.text.append(out.text)
            dt = time.perf_counter() - t0
            self.seconds += dt
            if not self.req.output_ids:
                self.prefill_seconds += dt
            self.steps += 1
            self.max_blocks_held = max(self.max_blocks_held, len(seq.block_table))
            # The rotary position of the last token written: its index in the cache (shifted positions).
            self.max_position = max(self.max_position, seq.num_computed_tokens - seq.num_evicted_tokens - 1)
            self.freed_blocks = max(self.freed_blocks, seq.num_evicted_tokens // bs)
            if time.perf_counter() >= t_end:
                break
        return self.progress()

    def progress(self) -> dict:
        seq = self.req.seq
        # A finished request's sequence is freed (its counters reset): report its length then.
        tokens = len(seq.token_ids) if self.done else seq.num_computed_tokens
        return {"tokens": tokens, "generated": len(self.req.output_ids), "steps": self.steps,
                "seconds": round(self.seconds, 1), "forward_s": round(self.engine.counters["forward_s"], 1),
                "blocks_held": len(seq.block_table),
                "max_blocks_held": self.max_blocks_held, "freed_blocks": self.freed_blocks, "done": self.done}

    def result(self) -> dict:
        """Figures of the conversation so far (see bench/long_chat.py); complete once `done`."""
        lp = np.array(self.sampler.logprobs)  # (forced so far,) log p of each forced token
        bs = self.engine.kv.block_size
        stats = self.engine.stats()
        reply_ids = self.req.output_ids[self.continuation:]
        return {
            "logprobs": [round(float(x), 5) for x in lp], "argmax_ids": self.sampler.argmax_ids,
            "complete": self.done, "scored_tokens": len(lp),
            "ppl_continuation": round(float(np.exp(-lp.mean())), 3) if len(lp) else None,
            "reply_ids": reply_ids, "reply_text": "".join(self.text),
            "total_tokens": len(self.req.seq.token_ids),
            "block_size": bs, "num_blocks": stats["num_blocks"], "kv_dtype": stats["kv_dtype"],
            "max_blocks_held": self.max_blocks_held, "bound_blocks": self.retention.max_blocks(bs),
            "freed_blocks": self.freed_blocks, "used_blocks_after": stats["used_blocks"],
            "shifted_blocks": stats["shifted_blocks"], "max_rotary_position": self.max_position,
            "engine_steps": self.steps, "engine_seconds": round(self.seconds, 1),
            "forward_seconds": round(stats["forward_s"], 1),
            "prefill_seconds": round(self.prefill_seconds, 1), "ledger": self.ledger,
        }
