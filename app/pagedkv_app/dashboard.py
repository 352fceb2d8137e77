"""What the page's memory dashboard shows: the block map, pool metrics and the streaming rate."""
from __future__ import annotations

RATE_WINDOW_S = 5.0


class TokenRate:
    """Tokens per second streamed over the last RATE_WINDOW_S seconds."""

    def __init__(self) -> None:
        self._window: list[tuple[float, int]] = []  # (time, tokens) of each output

    def add(self, now: float, num_tokens: int) -> None:
        self._window.append((now, num_tokens))

    def per_second(self, now: float) -> float:
        self._window = [(t, n) for t, n in self._window if now - t < RATE_WINDOW_S]
        span = (now - self._window[0][0]) if len(self._window) > 1 else 0.0
        return sum(n for _, n in self._window[1:]) / span if span > 0 else 0.0


def memory_snapshot(engine, model_name: str, tokens_per_s: float, ledger: dict | None) -> dict:
    """Block map + metrics for the dashboard: the engine's KV pool (LLMEngine.kv_snapshot: `cells`, one character
    per block, and `owners`) and stats, the streaming rate and the GPU ledger."""
    return {"model": model_name, **engine.kv_snapshot(), "tokens_per_s": tokens_per_s, "engine": engine.stats(),
            "ledger": ledger}
