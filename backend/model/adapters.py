"""The one table of per-architecture knowledge.

Each `ArchSpec` says where a family keeps its decoder layers, the attention output projection (whose
input `z` is the concatenation of the per-head results, shape `(batch, seq, heads * head_dim)`), how
that projection's weight is laid out, which final norm precedes the unembedding, and, where the family has one,
the norm that rescales the attention block's output before the residual add (Gemma 2 / 3's post-attention
RMSNorm): a head's write into the residual stream is then taken after that norm, linearised at each position,
    write[l, h] = g ⊙ (z[l, h] @ W_O[l, h]) / rms(o_proj(z[l]))            (d_model,)
so that the writes of a layer's heads (plus g ⊙ b / rms for an output bias b) sum to what the attention block
adds to the residual stream.
Adding a model family means adding one entry to `ARCHS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import BadInput

if TYPE_CHECKING:  # the table is read without torch (the service, the CLI); only the methods below touch tensors
    import torch

WeightLayout = Literal["out_in", "in_out"]  # nn.Linear (d_model, H*dh) vs GPT-2 Conv1D (H*dh, d_model)
QkvLayout = Literal["separate", "fused", "per_head"]
"""Where the value vectors come from: a v_proj of its own; one projection whose output is q | k | v (GPT-2's
c_attn); or one whose output is, per head, q | k | v of head_dim each (GPT-NeoX's query_key_value)."""
NormKind = Literal["layernorm", "rmsnorm", "rmsnorm_plus1"]  # rmsnorm_plus1: Gemma's x/rms * (1 + w)
Site = Literal["z", "layer_in", "layer_out", "post_attn_in", "attn_out", "mlp_out", "final_in", "q", "k", "v"]
"""Where an intervention acts (`backend/model/interventions.py`): z, the output projection's input (batch, seq,
heads * head_dim), per layer; a decoder layer's input or output (batch, seq, d_model); the post-attention norm's input
(Gemma 2 / 3: the summed head writes plus the bias, (batch, seq, d_model)); the attention block's and the MLP block's
write into the residual stream, what each adds to it (`attn_out`, `mlp_out`: (batch, seq, d_model), after the
post-attention / post-feedforward norm where the family has one), so that a layer's input + attn_out + mlp_out is its
output; the final norm's input (batch, seq, d_model); the query, key and value projections' outputs, per layer
("q", "k", "v": (batch, seq, width), before rotary and any per-head q / k norm; a family that keeps q, k and v in one
projection has all three sites on its one output, and `ArchSpec.qkv_columns` says which columns are a head's)."""
PER_LAYER: frozenset[str] = frozenset({"z", "layer_in", "layer_out", "post_attn_in", "attn_out", "mlp_out",
                                       "q", "k", "v"})
OUTPUT_SITES: frozenset[str] = frozenset({"layer_out", "attn_out", "mlp_out", "q", "k", "v"})
"""Sites that are a module's output (a forward hook); the others are a module's input (a forward pre-hook)."""


@dataclass(frozen=True)
class ArchSpec:
    family: str
    model_types: tuple[str, ...]
    layers: str  # dotted path from the CausalLM to the ModuleList of decoder layers
    o_proj: str  # dotted path from a decoder layer to the attention output projection
    final_norm: str  # dotted path from the CausalLM to the norm before the unembedding
    layout: WeightLayout = "out_in"
    norm: NormKind = "rmsnorm"
    n_heads_attr: tuple[str, ...] = ("num_attention_heads",)
    n_kv_heads_attr: tuple[str, ...] = ("num_key_value_heads",)
    notes: str = ""
    input_norm: str = "input_layernorm"  # dotted path from a decoder layer to the norm before attention
    v_proj: str = "self_attn.v_proj"  # dotted path from a decoder layer to the value projection (see `qkv`)
    q_proj: str = "self_attn.q_proj"  # the query and key projections (`qkv` "separate" only; else `v_proj` holds all)
    k_proj: str = "self_attn.k_proj"
    qk_norms: tuple[str, str] | None = None
    """Dotted paths from a decoder layer to the per-head norms of the queries and keys (Qwen3, Gemma 3: an RMSNorm
    over head_dim after the projection), read where the layer has them; None: the family has none."""
    qkv: QkvLayout = "separate"
    post_attn_norm: str | None = None
    """Dotted path from a decoder layer to a norm applied to the attention output before the residual add, or None
    (pre-norm families: o_proj's output is added as is). Its gain follows `norm` (Gemma: 1 + w)."""
    gguf_archs: tuple[str, ...] = ()  # GGUF `general.architecture` names transformers converts to this family
    attn_out: str = ""
    """Dotted path from a decoder layer to the module whose output the residual stream adds for attention (site
    "attn_out"): the post-attention norm where the family has one, else (""), the output projection `o_proj`."""
    mlp_out: str = "mlp"
    """Dotted path from a decoder layer to the module whose output the residual stream adds for the MLP (site
    "mlp_out"): the MLP, or the norm after it (Gemma 2 / 3's post-feedforward norm)."""

    def site_path(self, site: Site, layer: int | None = None) -> str:
        """Dotted path from the CausalLM to the module whose input (or, for "layer_out", output) is `site` of
        `layer` (per-layer sites) or of the model ("final_in")."""
        if site == "final_in":
            return self.final_norm
        if site not in PER_LAYER:
            raise ValueError(f"unknown site {site!r}; the sites are z, layer_in, layer_out, post_attn_in, attn_out, "
                             f"mlp_out, final_in, q, k, v")
        if layer is None:
            raise ValueError(f"site {site!r} needs a layer")
        base = f"{self.layers}.{layer}"
        if site == "z":
            return f"{base}.{self.o_proj}"
        if site == "post_attn_in":
            if self.post_attn_norm is None:
                raise ValueError(f"{self.family} has no post-attention norm")
            return f"{base}.{self.post_attn_norm}"
        if site == "attn_out":
            return f"{base}.{self.attn_out or self.o_proj}"
        if site == "mlp_out":
            return f"{base}.{self.mlp_out}"
        if site in ("q", "k", "v"):
            own = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj}[site]
            return f"{base}.{own if self.qkv == 'separate' else self.v_proj}"
        return base

    def qkv_columns(self, site: str, head: int, n_heads: int, n_kv_heads: int, head_dim: int) -> slice:
        """The columns of site "q", "k" or "v"'s output that hold one head's query, key or value: `head` a query
        head for "q", a kv head for "k" and "v" (query head h reads kv head h // (n_heads // n_kv_heads))."""
        i = "qkv".index(site)
        if self.qkv == "separate":
            return slice(head * head_dim, (head + 1) * head_dim)
        if self.qkv == "fused":  # q | k | v, each n_heads * head_dim wide
            start = i * n_heads * head_dim + head * head_dim
        else:  # per head: q | k | v, each head_dim wide
            start = head * 3 * head_dim + i * head_dim
        return slice(start, start + head_dim)

    @property
    def centered(self) -> bool:
        """Whether the norms subtract the mean before scaling (LayerNorm), not only divide by the RMS."""
        return self.norm == "layernorm"

    def gain(self, weight: torch.Tensor | None, d_model: int, device: torch.device) -> torch.Tensor:
        """A norm's effective elementwise gain (d_model,) float32 from its weight (None: no weight, gain 1);
        Gemma's norms scale by 1 + w."""
        if weight is None:
            import torch

            return torch.ones(d_model, device=device)
        w = weight.float()
        return 1.0 + w if self.norm == "rmsnorm_plus1" else w

    def o_proj_matrix(self, weight: torch.Tensor) -> torch.Tensor:
        """The output projection's weight as (heads * head_dim, d_model), whatever the stored layout."""
        return weight.t() if self.layout == "out_in" else weight

    def values_of(self, out: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int) -> torch.Tensor:
        """The value vectors (..., n_kv_heads, head_dim) in the output `out` (..., width) of the `v_proj` module."""
        if self.qkv == "fused":  # q | k | v, each n_heads * head_dim wide
            out = out[..., 2 * n_heads * head_dim:]
        elif self.qkv == "per_head":  # per head: q | k | v, each head_dim wide
            return out.reshape(*out.shape[:-1], n_kv_heads, 3 * head_dim)[..., 2 * head_dim:]
        return out.reshape(*out.shape[:-1], n_kv_heads, head_dim)

    def read_matrix(self, weight: torch.Tensor) -> torch.Tensor:
        """A q / k / v projection's weight as (d_model, out), whatever the stored layout (x @ it = the output)."""
        return weight.t() if self.layout == "out_in" else weight

    def qkv_matrices(self, q: torch.Tensor | None, k: torch.Tensor | None, v: torch.Tensor, n_heads: int,
                     n_kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head W_Q (n_heads, d_model, head_dim), W_K and W_V (n_kv_heads, d_model, head_dim), so that a head's
        query is x @ W_Q[h] (x the normed residual, biases and rotary aside), from the stored weights of `q_proj`,
        `k_proj` and `v_proj` ("separate"), or of `v_proj` alone, which holds all three (q and k: None)."""
        def heads(m: torch.Tensor, n: int) -> torch.Tensor:  # (d, n * dh) -> (n, d, dh)
            return m.reshape(m.shape[0], n, head_dim).permute(1, 0, 2)

        if self.qkv == "separate":
            assert q is not None and k is not None
            return (heads(self.read_matrix(q), n_heads), heads(self.read_matrix(k), n_kv_heads),
                    heads(self.read_matrix(v), n_kv_heads))
        m = self.read_matrix(v)  # (d, 3 * H * dh)
        if self.qkv == "fused":  # q | k | v, each n_heads * head_dim wide
            w = n_heads * head_dim
            return heads(m[:, :w], n_heads), heads(m[:, w:2 * w], n_heads), heads(m[:, 2 * w:], n_heads)
        per = m.reshape(m.shape[0], n_kv_heads, 3, head_dim)  # per head: q | k | v
        return tuple(per[:, :, i].permute(1, 0, 2) for i in range(3))  # type: ignore[return-value]


ARCHS: tuple[ArchSpec, ...] = (
    ArchSpec("GPT-2", ("gpt2",), "transformer.h", "attn.c_proj", "transformer.ln_f", layout="in_out",
             norm="layernorm", n_heads_attr=("n_head",), n_kv_heads_attr=("n_head",), input_norm="ln_1",
             v_proj="attn.c_attn", qkv="fused", gguf_archs=("gpt2",)),
    ArchSpec("GPT-NeoX / Pythia", ("gpt_neox",), "gpt_neox.layers", "attention.dense", "gpt_neox.final_layer_norm",
             norm="layernorm", n_kv_heads_attr=("num_attention_heads",), v_proj="attention.query_key_value",
             qkv="per_head"),
    ArchSpec("Llama", ("llama",), "model.layers", "self_attn.o_proj", "model.norm", gguf_archs=("llama",)),
    ArchSpec("Mistral", ("mistral",), "model.layers", "self_attn.o_proj", "model.norm", gguf_archs=("mistral",)),
    ArchSpec("Qwen2", ("qwen2",), "model.layers", "self_attn.o_proj", "model.norm", gguf_archs=("qwen2",)),
    ArchSpec("Qwen3", ("qwen3",), "model.layers", "self_attn.o_proj", "model.norm", gguf_archs=("qwen3",),
             qk_norms=("self_attn.q_norm", "self_attn.k_norm")),
    ArchSpec("Gemma", ("gemma",), "model.layers", "self_attn.o_proj", "model.norm", norm="rmsnorm_plus1"),
    ArchSpec("Gemma 2 / 3 (text)", ("gemma2", "gemma3_text"), "model.layers", "self_attn.o_proj", "model.norm",
             norm="rmsnorm_plus1", post_attn_norm="post_attention_layernorm", gguf_archs=("gemma2", "gemma3"),
             qk_norms=("self_attn.q_norm", "self_attn.k_norm"),  # Gemma 3 only: read where the layer has them
             attn_out="post_attention_layernorm", mlp_out="post_feedforward_layernorm",
             notes="a post-attention RMSNorm rescales the summed head writes before the residual add; "
                   "per-head writes are taken after it, linearised at each position: g * o_h / rms(sum_h o_h)"),
)

BY_MODEL_TYPE: dict[str, ArchSpec] = {t: spec for spec in ARCHS for t in spec.model_types}


class UnsupportedArchitecture(BadInput):
    """A model family the adapter table (`ARCHS`) has no entry for; the message names the supported ones."""


def spec_for(model_type: str) -> ArchSpec:
    """The adapter for a config's `model_type`, or an error that lists the supported ones."""
    try:
        return BY_MODEL_TYPE[model_type]
    except KeyError:
        supported = ", ".join(f"{s.family} ({'/'.join(s.model_types)})" for s in ARCHS)
        raise UnsupportedArchitecture(
            f"model_type {model_type!r} is not supported. Supported architectures: {supported}. "
            f"Each adapter names the decoder layers, the attention output projection and the final norm "
            f"(e.g. model.layers[i].self_attn.o_proj, model.norm); add an entry to backend/model/adapters.py::ARCHS."
        ) from None


def spec_for_gguf(arch: str, source: str = "the GGUF file") -> ArchSpec:
    """The adapter for a GGUF file's `general.architecture`, or one sentence naming it and the readable ones."""
    for spec in ARCHS:
        if arch in spec.gguf_archs:
            return spec
    readable = ", ".join(a for spec in ARCHS for a in spec.gguf_archs)
    raise UnsupportedArchitecture(
        f"{source} holds a model of architecture {arch[:60]!r} (general.architecture), which headlens cannot "
        f"analyse: it reads GGUF files of the architectures {readable}.")


def config_attr(config: object, names: tuple[str, ...]) -> int:
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return int(v)
    raise UnsupportedArchitecture(f"config {type(config).__name__} has none of the attributes {names}")
