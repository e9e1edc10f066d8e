"""Direct-path patching of heads and MLPs: only the sender's direct path into the final residual stream changes
(later MLPs frozen too), so one clean and one counterfactual forward serve every sender (docs/methods.md §2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from af1.interventions.sites import FINAL, head_inputs, mlp_output
from af1.methods.counterfactuals import Counterfactual
from af1.methods.heads.capture import (
    AnswerRows,
    EffectSums,
    check_direct_paths,
    counterfactual_gap,
    direct_effects,
    head_deltas,
    run_last,
)
from af1.models.adapter import ModelAdapter
from af1.tasks.evaluation import batches
from af1.tasks.task import Task


@torch.no_grad()
def direct_path_patching(
    adapter: ModelAdapter,
    task: Task,
    cf: Counterfactual,
    batch_size: int = 32,
    weight_P: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
    contrast_P: torch.Tensor | None = None,
) -> EffectSums:
    """Direct-path effect of every head and MLP (of `layers`) on the last-position logits on one answer step (rows
    weighted by weight_P): relative change of the correct logit and of the logit difference."""
    check_direct_paths(adapter)
    L, H = adapter.n_layers, adapter.n_heads
    P = len(task)
    sums = EffectSums.zeros(P, L, H, layers)
    weight_P = torch.ones(P) if weight_P is None else weight_P
    for sl in batches(P, batch_size):
        clean, base = run_last(adapter, task.input_ids_PT[sl], task.context_len)
        corrupt, _ = run_last(adapter, cf.input_ids_PT[sl], task.context_len)
        against = None if contrast_P is None else contrast_P[sl]
        unembed = AnswerRows.of(adapter, base, task.answer_ids_P[sl].to(base.device), against)
        w = weight_P[sl]
        sums.gap_P[sl] = counterfactual_gap(adapter, unembed, clean[FINAL], corrupt[FINAL], w)
        c0, w0 = unembed.logits(adapter, clean[FINAL][None])[0].unbind(-1)
        sums.clean_diff += float(((c0 - w0) * w.to(c0.device)).sum())
        for layer in sorted(layers) if layers is not None else range(L):
            deltas = head_deltas(adapter, layer, clean[head_inputs(layer)], corrupt[head_inputs(layer)])
            r, g = direct_effects(adapter, clean[FINAL], deltas, unembed, w)
            sums.rel_PLH[sl, layer] = r.T
            sums.diff_PLH[sl, layer] = g.T
            dm = (corrupt[mlp_output(layer)] - clean[mlp_output(layer)])[None]
            r, g = direct_effects(adapter, clean[FINAL], dm, unembed, w)
            sums.rel_L[layer] += r[0].sum()
            sums.diff_L[layer] += g[0].sum()
    return sums
