"""The logit lens of MLP outputs: what each layer's MLP writes, read through the final norm and unembedding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from af1.interventions.sites import FINAL, mlp_output
from af1.methods.heads.capture import per_layout, pooled, run_last, scored_steps
from af1.models.adapter import ModelAdapter, execution_device, weight_of
from af1.tasks.task import Task

if TYPE_CHECKING:
    pass


def norm_read(norm: torch.nn.Module, x_BD: torch.Tensor, m_BD: torch.Tensor) -> torch.Tensor:
    """What component m contributes to norm(x) with the scale frozen at x's: g * c(m) / s(x); summed over x's components
    it is norm(x) minus its bias, so the reads add up to the logits."""
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    layer_norm = isinstance(norm, torch.nn.LayerNorm)

    def scale(v: torch.Tensor) -> torch.Tensor:
        v = v - v.mean(-1, keepdim=True) if layer_norm else v
        return (v.pow(2).mean(-1, keepdim=True) + eps).sqrt()

    bias = getattr(norm, "bias", None) if layer_norm else None
    read = norm(m_BD) - (bias if bias is not None else 0)
    return read * scale(m_BD) / scale(x_BD)


@torch.no_grad()
def mlp_logit_lens(adapter: ModelAdapter, task: Task, scoring: str | None = None) -> torch.Tensor | None:
    """Per layer what the MLP's last-position output adds to the correct logit through the frozen final norm
    (`norm_read`) and the unembedding, averaged over scored steps; None for post-norm families."""
    if adapter.nonlinear_outputs() is not None:
        return None
    if task.groups:
        return pooled([(w, mlp_logit_lens(adapter, group, scoring)) for w, group in per_layout(task)])
    total = torch.zeros(adapter.n_layers)
    for step, weight in scored_steps(task, scoring)[1]:
        cache, _ = run_last(adapter, step.input_ids_PT, step.context_len)
        final = cache[FINAL].to(execution_device(adapter.final_norm))
        with adapter.onloaded(adapter.lm_head):
            W_U = weight_of(adapter.lm_head)
            answer_rows = W_U[step.answer_ids_P.to(W_U.device)]  # [P, D]
            for layer in range(adapter.n_layers):
                read = norm_read(adapter.final_norm, final, cache[mlp_output(layer)].to(final.device, final.dtype))
                total[layer] += float(((read.to(W_U.device) * answer_rows).sum(-1).cpu() * weight).sum())
    return total / len(task)
