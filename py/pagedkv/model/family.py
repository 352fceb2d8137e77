"""A model family as data: what its decoder layer is made of, stated once and read by every backend.

A family file (model/families/<name>.py) declares one `Family`: which norms a layer has and where they sit, its
projections' biases, its rotary embedding (pairing, which layers rotate and with which base), which layers see
only a window of recent tokens, the FFN's activation, the embedding scale and its turn format when a GGUF has no
chat template. `Family.layers(config)` resolves that declaration against one model's numbers (from its GGUF) into
one `Layer` per decoder layer: the numpy reference interprets those, the converter reads the family's tensor list
and its GGUF metadata keys, and a backend compares `ops(config)` with the ops it implements and refuses a model by
name when it loads (`require`), never mid-chat. No code outside model/ names a family.

Every family is pre-norm: x += post_attn_norm(attention(attn_norm(x))); x += post_ffn_norm(ffn(ffn_norm(x))),
where a post norm a family lacks is the identity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

# The ops a declaration can ask of a backend. A backend lists what it implements; `require` names what it lacks.
OPS = {
    "attention_bias": "q / k / v projection biases",
    "qk_norm": "a per-head RMSNorm of q and k before rotary",
    "post_attention_norm": "an RMSNorm of the attention output before the residual add",
    "post_ffn_norm": "an RMSNorm of the FFN output before the residual add",
    "silu": "SwiGLU (silu(gate) * up)",
    "gelu_tanh": "GeGLU with tanh GELU (gelu(gate) * up)",
    "embedding_scale": "embeddings scaled by sqrt(hidden)",
    "sliding_window": "layers that attend to a window of recent tokens",
    "no_rope": "layers without rotary embeddings",
    "rope_per_layer": "rotary bases that differ between layers",
    "q_width": "query heads x head size different from the hidden size",
}
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class Attention:
    """One layer's attention: what a query sees and how q and k are rotated."""

    window: int | None  # a query sees the keys p_k with p_q - p_k < window (itself included); None: all before it
    rope_base: float | None  # None: no rotary in this layer
    rope_scaled: bool  # the file's rope scaling (linear freq_scale, Llama 3's factors) applies to this layer
    scale: float  # multiplies q . k before the softmax


@dataclass(frozen=True)
class Layer:
    """One decoder layer, resolved for one model: every backend builds this."""

    attention: Attention
    attention_bias: bool
    qk_norm: bool
    post_attention_norm: bool
    post_ffn_norm: bool
    activation: str  # one of ACTIVATIONS


@dataclass(frozen=True)
class SlidingWindow:
    """Layers attending to a window of the last `window` tokens (the GGUF's `<arch>.attention.sliding_window`),
    except every `period`-th layer (the last of each period), which attends to everything. The window layers rotate
    with `rope_base` and no scaling, the global ones with the file's base and scaling (llama.cpp's "iswa")."""

    period: int
    rope_base: float


@dataclass(frozen=True)
class Family:
    """One model family's layer, as data (module docstring). `name` is the GGUF's general.architecture."""

    name: str
    rope_pairing: str  # "adjacent" (2i, 2i+1) or "neox" (i, i + head_dim/2): the converter makes neox adjacent
    activation: str = "silu"
    attention_bias: bool = False  # q / k / v biases, when the file has them (qwen2)
    qk_norm: bool = False
    post_norms: bool = False  # post_attention_norm and post_ffw_norm
    embedding_scale: bool = False  # embeddings times sqrt(hidden)
    sliding_window: SlidingWindow | None = None
    no_rope_every: int | None = None  # layer i has no rotary when (i + 1) % no_rope_every == 0
    # The head size whose inverse square root scales q . k, given the model's config (default: head_dim).
    query_scale_dim: Callable | None = None
    # The turn format of the family's instruct models (jinja2), for a GGUF that carries no chat template.
    chat_template: str | None = None
    chat_template_name: str | None = None

    def __post_init__(self) -> None:
        if self.rope_pairing not in ("adjacent", "neox"):
            raise ValueError(f"{self.name}: rope_pairing must be adjacent or neox, got {self.rope_pairing!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"{self.name}: activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    # -- the layer, resolved --------------------------------------------------
    def layers(self, config) -> tuple[Layer, ...]:
        """One Layer per decoder layer of a model with this family and `config` (a ModelConfig)."""
        dim = self.query_scale_dim(config) if self.query_scale_dim is not None else config.head_dim
        scale = 1.0 / math.sqrt(dim)
        out = []
        for i in range(config.n_layers):
            window, base, scaled = None, config.rope_base, True
            sw = self.sliding_window
            if sw is not None and config.sliding_window is not None and (i + 1) % sw.period != 0:
                window, base, scaled = config.sliding_window, sw.rope_base, False
            if self.no_rope_every is not None and (i + 1) % self.no_rope_every == 0:
                base = None
            out.append(Layer(Attention(window, base, scaled, scale), config.attention_bias, self.qk_norm,
                             self.post_norms, self.post_norms, self.activation))
        return tuple(out)

    def layer_tensors(self, config) -> dict[str, tuple[int, ...]]:
        """Tensor leaf name -> shape of every weight one layer holds (the GGUF's names, llama.cpp's)."""
        h, q, kv, ffn, hd = config.hidden, config.q_dim, config.kv_dim, config.ffn, config.head_dim
        shapes = {"attn_norm": (h,), "attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
                  "ffn_norm": (h,), "ffn_gate": (ffn, h), "ffn_up": (ffn, h), "ffn_down": (h, ffn)}
        if self.qk_norm:
            shapes.update(attn_q_norm=(hd,), attn_k_norm=(hd,))
        if self.post_norms:
            shapes.update(post_attention_norm=(h,), post_ffw_norm=(h,))
        return shapes

    def ops(self, config) -> set[str]:
        """The ops (OPS) a model of this family with `config` needs beyond a plain llama layer."""
        layers = config.layers
        need = {layer.activation for layer in layers} - {"silu"}
        flags = {"attention_bias": any(layer.attention_bias for layer in layers),
                 "qk_norm": any(layer.qk_norm for layer in layers),
                 "post_attention_norm": any(layer.post_attention_norm for layer in layers),
                 "post_ffn_norm": any(layer.post_ffn_norm for layer in layers),
                 "embedding_scale": self.embedding_scale,
                 "sliding_window": any(layer.attention.window is not None for layer in layers),
                 "no_rope": any(layer.attention.rope_base is None for layer in layers),
                 "rope_per_layer": len({(layer.attention.rope_base, layer.attention.rope_scaled) for layer in layers
                                        if layer.attention.rope_base is not None}) > 1,
                 "q_width": config.q_dim != config.hidden}
        return need | {op for op, on in flags.items() if on}


class UnsupportedModel(ValueError):
    """A backend lacks an op a model's family needs; the message names the family, the ops and the backend."""


def require(config, supported: set[str] | frozenset[str], backend: str, hint: str = "") -> None:
    """Refuse, when a model loads, a model whose family needs ops (OPS) `backend` does not implement; `hint`
    (what runs it instead) ends the message."""
    missing = sorted(config.family.ops(config) - set(supported))
    if missing:
        what = "; ".join(f"{op} ({OPS[op]})" for op in missing)
        raise UnsupportedModel(f"{config.architecture} needs {what}, which {backend} lacks"
                               + (f"; {hint}" if hint else ""))
