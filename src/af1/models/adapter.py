"""One adapter over an unmodified HF causal LM: its parts, its sizes, and a layer loop.
The loop runs any range of decoder layers with per-layer arguments recorded from the model's own forward pass."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from af1.errors import Af1Error
from af1.models.families import BY_MODEL_TYPE, Family, supported_model_types

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def weight_of(module: nn.Module) -> torch.Tensor:
    """A linear (or Conv1D) module's weight, typed: torch types module attributes as `Tensor | Module`."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{type(module).__name__} has no weight tensor")
    return weight


def execution_device(module: nn.Module) -> torch.device:
    """Where a part computes: its accelerate execution device when a device map placed it, else its weights'."""
    execution = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if isinstance(execution, int):  # an accelerator index, as accelerate writes GPU placements
        accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
        return torch.device(accelerator.type if accelerator is not None else "cuda", execution)
    if execution is not None:
        return torch.device(execution)
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def input_device(model: PreTrainedModel) -> torch.device:
    """Where input ids go: the token embedding's device."""
    return execution_device(model.get_input_embeddings())


def family_of(model: PreTrainedModel) -> Family:
    model_type = getattr(model.config, "model_type", None)
    family = BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise Af1Error(f"unsupported architecture '{model_type}'; supported: {', '.join(supported_model_types())}")
    return family


@dataclass
class LayerInputs:
    """What the model hands its decoder layers for one input shape: embeddings and per-layer kwargs."""

    hidden_BTD: torch.Tensor
    args_per_layer: list[tuple[Any, ...]]  # positional arguments after the hidden states (GPT-2 passes some)
    kwargs_per_layer: list[dict[str, Any]]


@dataclass
class ModelAdapter:
    """A causal LM seen through its family table."""

    model: PreTrainedModel
    family: Family = field(init=False)

    def __post_init__(self) -> None:
        self.family = family_of(self.model)
        self.layers: nn.ModuleList = self.model.get_submodule(self.family.layers)  # type: ignore[assignment]
        self.final_norm = self.model.get_submodule(self.family.final_norm)
        self.lm_head = self.model.get_submodule(self.family.lm_head)

    # sizes -------------------------------------------------------------------------------
    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def n_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def head_dim(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.hidden_size // self.n_heads)

    def no_attention_interface(self) -> str | None:
        """Why work that routes keys/values through transformers' attention interface cannot run on this family
        (its attention bypasses it: GPT-J), or None."""
        if self.family.uses_attention_interface:
            return None
        return f"the {self.family.name} family does not use transformers' attention interface"

    def nonlinear_outputs(self) -> str | None:
        """Why the attention and MLP outputs' direct paths to the logits are not linear (they are normalised before
        the residual sum: Gemma-2/3's post-norms), or None."""
        if not self.family.post_norms:
            return None
        return f"{self.family.name} normalises attention and MLP outputs before the residual stream"

    def no_head_slices(self) -> str | None:
        """Why a head's query, key and value weights are not separate row slices (one fused projection), or None."""
        if not self.family.fused_qkv:
            return None
        return f"the fused QKV projection of {self.family.name}"

    @property
    def plain_rotary(self) -> bool:
        """Whether the family's rotary embedding is the plain one (every dimension, one base for every layer)."""
        return self.family.rotary == "plain"

    def o_proj_weight(self, layer: int) -> torch.Tensor:
        """[D, H*d]: the output projection as a matrix acting on the concatenated heads (GPT-2's Conv1D transposed)."""
        weight = weight_of(self.o_proj(layer))
        return weight.T if self.family.conv1d else weight

    @property
    def parallel_residual(self) -> bool:
        return bool(getattr(self.config, "use_parallel_residual", self.family.parallel_residual))

    @property
    def device(self) -> torch.device:
        return input_device(self.model)

    @property
    def sharded(self) -> bool:
        """True when accelerate placed the model's parts (a device map), whatever the devices."""
        return getattr(self.model, "hf_device_map", None) is not None

    def offloaded(self) -> dict[str, nn.Module]:
        """Device-map modules whose weights accelerate keeps on CPU or disk until they run."""
        if not self.sharded:
            return {}
        from accelerate.utils import has_offloaded_params

        return {name: m for name, m in self.model.named_modules() if has_offloaded_params(m)}

    @contextlib.contextmanager
    def onloaded(self, module: nn.Module) -> Iterator[None]:
        """A part's weights in place for reading, also when the device map offloaded them."""
        inside = set(map(id, module.modules()))
        owners = [m for m in self.offloaded().values() if id(m) in inside or any(module is sub for sub in m.modules())]
        if not owners:
            yield
            return
        from accelerate.utils import align_module_device

        with contextlib.ExitStack() as stack:
            for owner in owners:
                stack.enter_context(align_module_device(owner))
            yield

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter's name and values in model order; offloaded ones brought in a module at a time."""
        offloaded = self.offloaded()

        def owner(name: str) -> str | None:
            return next((o for o in offloaded if name.startswith(o + ".")), None)

        for key, group in itertools.groupby(self.model.named_parameters(), key=lambda item: owner(item[0])):
            if key is None:
                yield from group
                continue
            names = [name for name, _ in group]
            with self.onloaded(offloaded[key]):
                for name in names:
                    yield name, self.model.get_parameter(name)

    @property
    def attn_implementation(self) -> str:
        return str(self.config._attn_implementation)

    # parts --------------------------------------------------------------------------------
    def attention(self, layer: int) -> nn.Module:
        return getattr(self.layers[layer], self.family.attention)

    def o_proj(self, layer: int) -> nn.Module:
        return getattr(self.attention(layer), self.family.o_proj)

    def mlp(self, layer: int) -> nn.Module:
        return getattr(self.layers[layer], self.family.mlp)

    def down_proj(self, layer: int) -> nn.Module:
        return getattr(self.mlp(layer), self.family.down_proj)

    @property
    def n_neurons(self) -> int:
        """Neurons per MLP: the input width of its output projection (GPT-2's Conv1D keeps weight [in, out])."""
        weight = weight_of(self.down_proj(0))
        return int(weight.shape[0] if self.family.conv1d else weight.shape[1])

    def check_layer(self, layer: int, what: str = "layer", allow_minus_one: bool = False) -> None:
        low = -1 if allow_minus_one else 0
        if not low <= layer < self.n_layers:
            raise Af1Error(f"{what} {layer} is out of range: this model has layers 0..{self.n_layers - 1}")

    # layer loop ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _short_circuited_layers(
        self, record: list[tuple[tuple[Any, ...], dict[str, Any]]], first: list[torch.Tensor], tuple_return: bool
    ) -> Iterator[None]:
        def make(i: int):
            def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                record[i] = (args, kwargs)
                if i == 0:
                    first.append(hidden_states)
                return (hidden_states, None) if tuple_return else hidden_states

            return forward

        own = [layer.__dict__.get("forward") for layer in self.layers]  # accelerate's device hooks live here
        for i, layer in enumerate(self.layers):
            layer.forward = make(i)
        try:
            yield
        finally:
            for layer, forward in zip(self.layers, own, strict=True):
                del layer.forward
                if forward is not None:
                    layer.forward = forward

    @torch.no_grad()
    def layer_inputs(self, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor | None = None) -> LayerInputs:
        """Embeddings and the exact keyword arguments the model passes to each decoder layer."""
        record: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((), {}) for _ in range(self.n_layers)]
        first: list[torch.Tensor] = []
        if position_ids_BT is None:
            T = input_ids_BT.shape[1]
            position_ids_BT = torch.arange(T, device=input_ids_BT.device).expand(input_ids_BT.shape[0], T)
        base = getattr(self.model, self.model.base_model_prefix)
        # the family's layer-return convention first; transformers releases change it (GPT-J's blocks return a
        # tensor from 5.24 on), and the recorded inputs do not depend on it: a convention the model rejects is retried
        failure: Exception | None = None
        for tuple_return in (self.family.layer_returns_tuple, not self.family.layer_returns_tuple):
            first.clear()
            try:
                with self._short_circuited_layers(record, first, tuple_return):
                    base(
                        input_ids=input_ids_BT,
                        attention_mask=torch.ones_like(input_ids_BT),
                        position_ids=position_ids_BT,
                        use_cache=False,
                    )
                break
            except (TypeError, AttributeError, IndexError, ValueError) as exc:
                failure = failure or exc
        else:
            assert failure is not None
            raise failure
        for _, kw in record:
            for key in ("past_key_values", "layer_past", "use_cache"):
                kw.pop(key, None)
        return LayerInputs(first[0], [a for a, _ in record], [kw for _, kw in record])

    def run_layers(
        self, hidden_BTD: torch.Tensor, inputs: LayerInputs, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """Run decoder layers start..stop-1 on hidden states with the recorded kwargs."""
        stop = self.n_layers if stop is None else stop
        for i in range(start, stop):
            out = self.layers[i](hidden_BTD, *inputs.args_per_layer[i], **inputs.kwargs_per_layer[i])
            hidden_BTD = out[0] if isinstance(out, tuple) else out
        return hidden_BTD

    def logits(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        """Final norm, unembedding and the family's logit soft-capping."""
        return self.soft_capped(self.lm_head(self.final_norm(hidden_BTD)))

    @property
    def soft_cap(self) -> float | None:
        """The family's final-logit soft cap (Gemma-2), None where it has none."""
        return getattr(self.config, "final_logit_softcapping", None) or None

    def soft_capped(self, logits: torch.Tensor) -> torch.Tensor:
        """The family's final-logit soft-capping (Gemma-2: tanh(x / cap) * cap), the one place it is applied."""
        cap = self.soft_cap
        return torch.tanh(logits / cap) * cap if cap else logits

    @torch.no_grad()
    def forward(self, input_ids_BT: torch.Tensor) -> torch.Tensor:
        """Logits through the adapter's layer loop; equal to the plain model's."""
        inputs = self.layer_inputs(input_ids_BT)
        return self.logits(self.run_layers(inputs.hidden_BTD, inputs))
