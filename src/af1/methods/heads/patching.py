"""Path patching of heads and MLPs (docs/methods.md §2, Zhang et al. 2024): each sender's last-position output from the
counterfactual run, scored per answer step by one of `PATHS` (wang, direct, total)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.executors.fast import capture_problem_kv, last_token_inputs
from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.sites import (
    FINAL,
    attention_output,
    edit_sites,
    fixed_attention,
    head_inputs,
    mlp_output,
    record,
    residual,
)
from af1.methods.counterfactuals import Counterfactual, counterfactual
from af1.methods.heads.attribution import ESTIMATE, attribution_step
from af1.methods.heads.capture import (
    CONTRASTS,
    AnswerRows,
    EffectSums,
    ProblemEffects,
    check_direct_paths,
    counterfactual_gap,
    head_deltas,
    logit_change_rows,
    per_layout,
    pooled,
    scored_steps,
)
from af1.methods.heads.direct import direct_path_patching
from af1.models.adapter import ModelAdapter, execution_device
from af1.models.forward import forward_last
from af1.progress import progress
from af1.tasks.evaluation import batches
from af1.tasks.task import Task

if TYPE_CHECKING:
    from af1.tasks.task import Tokenizer


class PathPatching(ProblemEffects):
    """Path patching on problems of one token layout (`path_patching`): the effects, by which path, what was
    scored, how many problems have each answer step, and what the logit difference is against."""

    path: str
    scoring: str
    answer_steps_n: dict[str, int]
    contrast: str


@with_config(ConfigDict(extra="forbid"))
class LayoutPatched(TypedDict):
    """A token layout path patching measured, with its n (the pooled effects weigh it by n)."""

    layout: int
    n: int


@with_config(ConfigDict(extra="forbid"))
class LayoutNotPatched(LayoutPatched):
    """A token layout left out of path patching: no replacement keeps its token layout."""

    reason: str


class PooledPathPatching(PathPatching):
    """Path patching per token layout, pooled by each layout's n (`layout_path_patching`): with each problem's
    counterfactual row (None where its layout was left out) and, for a task of several layouts, which were patched."""

    counterfactual_rows: list[dict[str, Any] | None]
    layouts_patched: NotRequired[list[LayoutPatched]]
    layouts_not_patched: NotRequired[list[LayoutNotPatched]]


Contrast = Literal["top wrong", "answer", "answer kept"]  # `layout_path_patching`'s: what the difference is against
PATHS = ("wang", "direct", "total")  # exact; ESTIMATE ("attribution") is path patching's first-order estimate


def path_patching(
    adapter: ModelAdapter,
    task: Task,
    cf: Counterfactual,
    path: str = "wang",
    batch_size: int = 32,
    scoring: str | None = None,
    layers: Sequence[int] | None = None,
    contrast: bool = False,
) -> PathPatching:
    """Every head's and MLP's effect on the last-position logits by one of `PATHS` (or `ESTIMATE`) over the scored
    answer steps, per sender and problem; with `contrast`, against the counterfactual's answer."""
    if path not in (*PATHS, ESTIMATE):
        raise Af1Error(f"unknown path '{path}': one of {', '.join((*PATHS, ESTIMATE))}")
    if path == "direct":
        check_direct_paths(adapter)
    if path == "total" and (reason := adapter.no_attention_interface()) is not None:
        raise Af1Error(
            f"path 'total' reads earlier keys/values through the attention interface ({reason}): try path 'wang'"
        )
    scored, steps = scored_steps(task, scoring)
    total = EffectSums.zeros(len(task), adapter.n_layers, adapter.n_heads, layers)
    for step, weight in steps:
        step_cf = cf.at_step(step)
        against = None
        if contrast:
            against, defined = step_cf.contrast_P(step)
            weight = weight * defined
        if path == "direct":
            sums = direct_path_patching(adapter, step, step_cf, batch_size, weight, layers, against)
        elif path == ESTIMATE:
            sums = attribution_step(adapter, step, step_cf, max(1, batch_size // 2), weight, layers, against)
        else:
            recompute = path == "total"
            sums = downstream_path_patching(adapter, step, step_cf, recompute, batch_size, weight, layers, against)
        total.add_rows(step.rows_in_parent, sums)
    steps_n = {str(step.step or 0): len(step) for step, _ in steps}
    return PathPatching(
        **total.means(), path=path, scoring=scored, answer_steps_n=steps_n, contrast=CONTRASTS[contrast]
    )


def _rows_of(adapter: ModelAdapter, value_ZBD: torch.Tensor, layer: int, dtype: torch.dtype) -> torch.Tensor:
    """One value per row (row z*B + b of the last-token pass): [Z*B, 1, D], where that layer's attention runs."""
    return value_ZBD.reshape(-1, 1, value_ZBD.shape[-1]).to(execution_device(adapter.attention(layer)), dtype)


def _patch_rows(rows: slice, new_BD: torch.Tensor):
    """A module output whose given rows take new values."""

    def fn(out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[rows, -1] = new_BD.to(out.device, out.dtype)
        return out

    return fn


@torch.no_grad()
def downstream_path_patching(
    adapter: ModelAdapter,
    task: Task,
    cf: Counterfactual,
    recompute_attention: bool,
    batch_size: int = 32,
    weight_P: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
    contrast_P: torch.Tensor | None = None,
) -> EffectSums:
    """Wang's path patching (heads frozen, MLPs recompute) or, with recompute_attention, activation patching on one
    answer step: per layer one last-token pass of rows [clean, H heads, MLP] x problems."""

    L, H = adapter.n_layers, adapter.n_heads
    P = len(task)
    sums = EffectSums.zeros(P, L, H, layers)
    patched = sorted(layers) if layers is not None else list(range(L))
    weight_P = torch.ones(P) if weight_P is None else weight_P
    Z = H + 2  # row groups: the clean reference, each head, the MLP
    path = "total (activation patching)" if recompute_attention else "wang"
    for sl in progress(list(batches(P, batch_size)), desc=f"path patching, {path}"):
        ids = task.input_ids_PT[sl]
        sites = [FINAL] + [
            s
            for layer in range(L)
            for s in (head_inputs(layer), attention_output(layer), mlp_output(layer), residual(layer))
        ]
        with record(adapter, sites, last_only=True) as clean:
            base = forward_last(adapter.model, ids, task.context_len).to(adapter.device)
        with record(
            adapter,
            [FINAL, *(s for layer in range(L) for s in (head_inputs(layer), mlp_output(layer)))],
            last_only=True,
        ) as corrupt:
            forward_last(adapter.model, cf.input_ids_PT[sl], task.context_len)
        kv = capture_problem_kv(adapter, ids, task.context_len) if recompute_attention else None
        answer = task.answer_ids_P[sl].to(base.device)
        B = len(answer)
        unembed = AnswerRows.of(adapter, base, answer, None if contrast_P is None else contrast_P[sl])
        sums.gap_P[sl] = counterfactual_gap(adapter, unembed, clean[FINAL], corrupt[FINAL], weight_P[sl])
        inputs = last_token_inputs(adapter, ids.repeat(Z, 1))
        problem_of_row = torch.arange(B).repeat(Z)
        for layer in patched:
            start_BD = inputs.hidden_BTD[:B, -1] if layer == 0 else clean[residual(layer - 1)]
            deltas_HBD = head_deltas(adapter, layer, clean[head_inputs(layer)], corrupt[head_inputs(layer)])
            zero = torch.zeros_like(deltas_HBD[:1])
            attn_ZBD = clean[attention_output(layer)][None] + torch.cat([zero, deltas_HBD.to(zero.device), zero])
            mlp_rows = slice((Z - 1) * B, Z * B)

            edits = {mlp_output(layer): _patch_rows(mlp_rows, corrupt[mlp_output(layer)])}
            fixed = {layer: _rows_of(adapter, attn_ZBD, layer, start_BD.dtype)}  # clean plus one head's change
            plans = {}
            for later in range(layer + 1, L):
                if kv is None:  # heads frozen: the attention output stays clean (and is not computed)
                    clean_ZBD = clean[attention_output(later)][None].expand(Z, -1, -1)
                    fixed[later] = _rows_of(adapter, clean_ZBD, later, start_BD.dtype)
                else:  # the last token attends to the clean earlier positions and to itself
                    prefix = (kv.keys[later][problem_of_row], kv.values[later][problem_of_row])
                    plans[later] = LayerPlan(prefix_kv=prefix, replace_mask=True)
            h = start_BD.repeat(Z, 1)[:, None]
            with edit_sites(adapter, edits), fixed_attention(adapter, fixed), attention_plans(adapter, plans):
                h = adapter.run_layers(h, inputs, layer)
            logits = unembed.logits(adapter, h[:, -1].reshape(Z, B, -1))
            w = weight_P[sl].to(logits.device)
            rel, diff = logit_change_rows(logits, w)
            sums.rel_PLH[sl, layer] = rel[:H].T
            sums.diff_PLH[sl, layer] = diff[:H].T
            sums.rel_L[layer] += rel[H].sum()
            sums.diff_L[layer] += diff[H].sum()
            if layer == patched[0]:  # the clean row is the same at every layer
                sums.clean_diff += float(((logits[0, :, 0] - logits[0, :, 1]) * w).sum())
    return sums


PER_PROBLEM = (
    "relative_logit_change_problem_layer_head",
    "logit_diff_change_problem_layer_head",
    "counterfactual_gap_problem",
)


def layout_path_patching(
    adapter: ModelAdapter,
    kept: Task,
    tokenizer: Tokenizer,
    path: str,
    kind: str | None = None,
    scoring: str | None = None,
    layers: Sequence[int] | None = None,
    contrast: Contrast = "top wrong",
) -> tuple[PooledPathPatching, Counterfactual]:
    """Path patching per token layout, each with its own counterfactual, pooled by n (a layout no replacement keeps is
    left out and said so); effects in `kept`'s order, NaN where left out."""
    runs: list[tuple[Task, Counterfactual]] = []
    skipped: list[LayoutNotPatched] = []
    for _, group in per_layout(kept):
        try:  # a layout where no value of the slot (or its null value) keeps the token layout has none
            cf = counterfactual(group, tokenizer, kind)
            if contrast == "answer kept" and (cf := cf.controlled()) is None:
                raise Af1Error(f"no problem of layout {group.layout_id} has an answer-keeping counterfactual")
            runs.append((group, cf))
        except Af1Error as exc:
            if not kept.groups:
                raise
            skipped.append(LayoutNotPatched(layout=group.layout_id, n=len(group), reason=str(exc)))
    if not runs:
        raise Af1Error(f"no token layout has a counterfactual: {skipped[0]['reason']}")
    n = sum(len(group) for group, _ in runs)
    parts = [
        (
            len(group) / n,
            path_patching(adapter, group, cf, path, scoring=scoring, layers=layers, contrast=contrast != "top wrong"),
        )
        for group, cf in runs
    ]
    steps_n: dict[str, int] = {}
    for _, part in parts:  # layouts may have answers of different lengths: their steps' counts add up
        for k, count in part["answer_steps_n"].items():
            steps_n[k] = steps_n.get(k, 0) + count
    per_problem = ("answer_steps_n", *PER_PROBLEM)
    effects = pooled([(w, {k: v for k, v in part.items() if k not in per_problem}) for w, part in parts])
    rows: list[dict[str, Any] | None] = [None] * len(kept)
    every = {key: torch.full((len(kept), *parts[0][1][key].shape[1:]), float("nan")) for key in PER_PROBLEM}
    for (group, cf), (_, part) in zip(runs, parts, strict=True):
        where = group.where_P.tolist() if kept.groups else list(range(len(kept)))
        for r, row in zip(where, cf.rows(), strict=True):
            rows[r] = {**row, "layout": group.layout_id} if kept.groups else row
        for key in PER_PROBLEM:
            every[key][where] = part[key]
    result = PooledPathPatching(
        **effects,
        relative_logit_change_problem_layer_head=every[PER_PROBLEM[0]],
        logit_diff_change_problem_layer_head=every[PER_PROBLEM[1]],
        counterfactual_gap_problem=every[PER_PROBLEM[2]],
        answer_steps_n=steps_n,
        counterfactual_rows=rows,
    )
    if kept.groups:
        result["layouts_patched"] = [LayoutPatched(layout=g.layout_id, n=len(g)) for g, _ in runs]
        result["layouts_not_patched"] = skipped
    return result, runs[0][1]
