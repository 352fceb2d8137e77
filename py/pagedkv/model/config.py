"""ModelConfig: one model's hyper-parameters, read from model.json; its layer comes from its family
(model/family.py, model/families/)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .families import FAMILIES

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
# convert_hf_to_gguf permutes the Q/K rows of llama weights so that rotary
# pairs are ADJACENT dims (2i, 2i+1); llama.cpp therefore applies its "NORM"
# rope to GGUF llama models. NEOX families pair (i, i + head_dim/2): the
# converter permutes their Q/K rows the same way, so every backend rotates adjacent pairs.
SUPPORTED_ROPE_CONVENTIONS = ("adjacent_pairs",)
# Keys a manifest written before they existed may lack; their defaults describe those models exactly.
OPTIONAL_KEYS = ("attention_bias", "rope_freq_scale", "rope_freq_factors", "sliding_window")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of one decoder of a supported family; validated on construction."""

    architecture: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_base: float
    rope_convention: str
    rms_eps: float
    context_length: int
    tied_embeddings: bool
    attention_bias: bool = False  # q, k and v projections add a bias (qwen2)
    # Rotary angle of pair i at position p: p * rope_freq_scale * rope_base^(-2i/head_dim) / rope_freq_factors[i]
    # (llama.cpp's freq_scale from linear scaling, and its rope_freqs.weight from Llama 3's "llama3" scaling).
    rope_freq_scale: float = 1.0
    rope_freq_factors: tuple[float, ...] | None = None
    # Tokens a window layer's query sees (itself included), for families with sliding-window layers (family.py).
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: {list(SUPPORTED_ARCHITECTURES)}"
            )
        if self.rope_convention not in SUPPORTED_ROPE_CONVENTIONS:
            raise ValueError(
                f"unsupported rope convention {self.rope_convention!r}; supported: {list(SUPPORTED_ROPE_CONVENTIONS)}"
            )
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab", "context_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        family = FAMILIES[self.architecture]
        if self.attention_bias and not family.attention_bias:
            raise ValueError(f"{self.architecture} has no q / k / v biases, but attention_bias is set")
        if self.sliding_window is not None:
            if family.sliding_window is None:
                raise ValueError(f"{self.architecture} has no sliding-window layers, but sliding_window is set")
            if not isinstance(self.sliding_window, int) or isinstance(self.sliding_window, bool) \
                    or self.sliding_window <= 0:
                raise ValueError(f"ModelConfig.sliding_window must be a positive int, got {self.sliding_window!r}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_base > 0 or not self.rms_eps > 0:
            raise ValueError(f"rope_base and rms_eps must be positive, got {self.rope_base}, {self.rms_eps}")
        if not self.rope_freq_scale > 0:
            raise ValueError(f"rope_freq_scale must be positive, got {self.rope_freq_scale}")
        if self.rope_freq_factors is not None:
            factors = tuple(float(f) for f in self.rope_freq_factors)
            if len(factors) != self.head_dim // 2 or not all(f > 0 for f in factors):
                raise ValueError(f"rope_freq_factors must be {self.head_dim // 2} positive numbers (head_dim / 2), "
                                 f"got {len(factors)} with minimum {min(factors, default=None)}")
            object.__setattr__(self, "rope_freq_factors", factors)  # a JSON list becomes a hashable tuple

    @property
    def family(self):
        """The model's family declaration (model/family.py)."""
        return FAMILIES[self.architecture]

    @cached_property
    def layers(self) -> tuple:
        """One family.Layer per decoder layer: norms, biases, attention window, rotary, activation."""
        return self.family.layers(self)

    @property
    def q_dim(self) -> int:
        """Width of one token's queries: n_heads * head_dim (not always hidden: Qwen3, Gemma 3)."""
        return self.n_heads * self.head_dim

    @property
    def embedding_scale(self) -> float:
        """What the embeddings are multiplied by (sqrt(hidden) in Gemma, else 1)."""
        return float(self.hidden) ** 0.5 if self.family.embedding_scale else 1.0

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one KV head (GQA group size)."""
        return self.n_heads // self.n_kv_heads

    @property
    def kv_dim(self) -> int:
        """Width of one token's K (or V) row: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    def to_json(self) -> dict:
        """The manifest's "config" section."""
        return {
            "architecture": self.architecture,
            "n_layers": self.n_layers,
            "hidden": self.hidden,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "ffn": self.ffn,
            "vocab": self.vocab,
            "rope_base": self.rope_base,
            "rope_convention": self.rope_convention,
            "rms_eps": self.rms_eps,
            "context_length": self.context_length,
            "tied_embeddings": self.tied_embeddings,
            "attention_bias": self.attention_bias,
            "rope_freq_scale": self.rope_freq_scale,
            "rope_freq_factors": None if self.rope_freq_factors is None else list(self.rope_freq_factors),
            "sliding_window": self.sliding_window,
        }

    @classmethod
    def from_json(cls, data: dict) -> "ModelConfig":
        """Build from a manifest's "config" section; unknown or missing keys are errors (OPTIONAL_KEYS may be
        absent)."""
        expected = set(cls.__dataclass_fields__)
        missing = expected - set(data) - set(OPTIONAL_KEYS)
        extra = set(data) - expected
        if missing or extra:
            raise ValueError(f"model config keys mismatch: missing {sorted(missing)}, unexpected {sorted(extra)}")
        return cls(**data)
