"""Architecture families as data: where each family keeps its parts and how its layers behave."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """Where a family's modules live (dotted paths from the CausalLM) and how its layers behave."""

    name: str
    model_types: tuple[str, ...]
    layers: str
    final_norm: str
    lm_head: str
    attention: str  # attribute of a decoder layer
    o_proj: str  # attribute of the attention module
    mlp: str  # attribute of a decoder layer
    down_proj: str = "down_proj"  # attribute of the MLP: its output projection, whose input is the neurons
    layer_returns_tuple: bool = False
    uses_attention_interface: bool = True  # False: masks go through a pre-hook (GPT-J)
    rotary: str | None = "plain"  # plain | partial (first dims only) | interleaved | per-layer (local/global); None
    parallel_residual: bool = False  # fixed value; GPT-NeoX reads its config
    fused_qkv: bool = False  # one projection makes q, k and v (head slices are not separate matrices)
    conv1d: bool = False  # projections are GPT-2 Conv1D modules: weight [in, out], the transpose of nn.Linear
    post_norms: bool = False  # attention and MLP outputs are normalised before the residual sum (Gemma-2/3)

    @property
    def rope(self) -> bool:
        return self.rotary is not None


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), "model.layers", "model.norm", "lm_head", "self_attn", "o_proj", "mlp"),
    Family("mistral", ("mistral",), "model.layers", "model.norm", "lm_head", "self_attn", "o_proj", "mlp"),
    Family("qwen2", ("qwen2",), "model.layers", "model.norm", "lm_head", "self_attn", "o_proj", "mlp"),
    Family("qwen3", ("qwen3",), "model.layers", "model.norm", "lm_head", "self_attn", "o_proj", "mlp"),
    Family(
        "gemma2", ("gemma2",), "model.layers", "model.norm", "lm_head", "self_attn", "o_proj", "mlp", post_norms=True
    ),
    Family(
        "gemma3",
        ("gemma3_text",),
        "model.layers",
        "model.norm",
        "lm_head",
        "self_attn",
        "o_proj",
        "mlp",
        rotary="per-layer",
        post_norms=True,
    ),
    Family(
        "gpt2",
        ("gpt2",),
        "transformer.h",
        "transformer.ln_f",
        "lm_head",
        "attn",
        "c_proj",
        "mlp",
        down_proj="c_proj",
        rotary=None,
        fused_qkv=True,
        conv1d=True,
    ),
    Family(
        "gpt_neox",
        ("gpt_neox",),
        "gpt_neox.layers",
        "gpt_neox.final_layer_norm",
        "lm_head",
        "attention",
        "dense",
        "mlp",
        down_proj="dense_4h_to_h",
        rotary="partial",
        fused_qkv=True,
    ),
    Family(
        "gptj",
        ("gptj",),
        "transformer.h",
        "transformer.ln_f",
        "lm_head",
        "attn",
        "out_proj",
        "mlp",
        down_proj="fc_out",
        layer_returns_tuple=True,
        uses_attention_interface=False,
        rotary="interleaved",
        parallel_residual=True,
    ),
)

BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES for t in f.model_types}


def supported_model_types() -> list[str]:
    return sorted(BY_MODEL_TYPE)
