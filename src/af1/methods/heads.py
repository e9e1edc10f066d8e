"""Arithmetic heads (docs/methods.md §2, Zhang et al. 2024): path patching, key heads, knockout, overlap.

Each sender (a head or an MLP) has its output at the last position taken from the counterfactual
run (the operator replaced by a null word or symbol, or an operand by another value drawn per problem);
the receiver is the last position's logits. Every teacher-forced step of the answer's tokens is scored
(`SCORED`; not the end-of-answer step AF1 also scores: heads are ranked by the arithmetic, not the newline):
at step k the clean run reads the prompt and the first k answer tokens, the counterfactual run
the counterfactual prompt and the same k tokens; per problem the SPEC's effect (the relative change of the
correct token's logit, and the change of the logit difference) is averaged over its steps, then over
problems, so that each problem counts once and the threshold of -5 % keeps its meaning per token. (The
change of the whole answer's log-probability would need the full softmax of every patched row; the
relative logit change is what Zhang et al. threshold.) First-token scoring is the task's `--scoring first`,
reported with its first-token constant guess.
Three definitions of what else changes (`PATHS`):

- wang (Wang et al. 2023, which Zhang et al. use): every other head's output stays at its clean
  value, MLPs recompute. Only the last position changes downstream of the sender, and with every
  head frozen the last token needs no attention: the senders of a layer run as rows of one
  last-token pass through the later blocks, with each attention module's output set to its clean
  value;
- direct: only the sender's direct path into the final residual stream changes (later MLPs frozen
  too); one clean and one counterfactual forward serve every sender;
- total (activation patching): everything downstream recomputes, attention included; the last token
  attends to the clean keys/values of the earlier positions, so again one last-token pass per layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import ConfigDict, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import Claim, adjust, confirmed, mean_below, paired_greater
from af1.errors import Af1Error
from af1.executors.fast import capture_problem_kv, last_token_inputs
from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.heads import HeadSums, head_sums, matched_draws, replace_heads
from af1.interventions.sites import (
    FINAL,
    Site,
    attention_output,
    edit_outputs,
    fixed_attention,
    head_inputs,
    mlp_output,
    record,
    residual,
)
from af1.methods.counterfactuals import NOT_OPERANDS, Counterfactual, counterfactual, counterfactual_problems
from af1.models.adapter import ModelAdapter, execution_device, weight_of
from af1.models.forward import forward_last, suffix_start
from af1.progress import progress
from af1.progress import stage as progress_stage
from af1.stats import baseline_warning, constant_baseline, split_indices
from af1.tasks.evaluation import Evaluated, Scores, batches, evaluated, require_solved, solved
from af1.tasks.task import LayoutRow, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from af1.models.loading import LoadedModel
    from af1.tasks.spec import TaskSpec
    from af1.tasks.task import Tokenizer

# --- capture of head and MLP outputs -------------------------------------------------------------


@torch.no_grad()
def run_last(
    adapter: ModelAdapter, ids_BT: torch.Tensor, context_len: int = 0
) -> tuple[dict[Site, torch.Tensor], torch.Tensor]:
    """One forward (the shared context once); at the last position every layer's head inputs [B, E] and MLP
    output [B, D], the final norm's
    input [B, D]; and the last logits [B, V]."""
    sites = [FINAL, *(s for layer in range(adapter.n_layers) for s in (head_inputs(layer), mlp_output(layer)))]
    with record(adapter, sites, last_only=True) as cache:
        logits = forward_last(adapter.model, ids_BT, context_len).to(adapter.device)
    return cache, logits


@dataclass
class AnswerRows:
    """The unembedding rows [B, 2, D] (and bias [B, 2]) of each problem's correct and top wrong token."""

    rows_BRD: torch.Tensor
    bias_BR: torch.Tensor | None

    @classmethod
    def of(cls, adapter: ModelAdapter, clean_logits_BV: torch.Tensor, answer_B: torch.Tensor) -> AnswerRows:
        """The rows of each problem's correct token and of the clean run's best wrong token."""
        wrong = clean_logits_BV.clone()
        wrong[torch.arange(len(answer_B)), answer_B] = -float("inf")
        return cls.read(adapter, torch.stack([answer_B, wrong.argmax(-1)], -1))

    @classmethod
    def read(cls, adapter: ModelAdapter, pair_B2: torch.Tensor) -> AnswerRows:
        """Gathered once per batch, so an offloaded unembedding is brought in once, not per layer."""
        with adapter.onloaded(adapter.lm_head):
            W_U, bias = weight_of(adapter.lm_head), getattr(adapter.lm_head, "bias", None)
            pair = pair_B2.to(W_U.device)
            return cls(W_U[pair], bias[pair] if bias is not None else None)

    def logits(self, adapter: ModelAdapter, final_ZBD: torch.Tensor) -> torch.Tensor:
        """Logits [N, B, 2]: the final norm, then these rows (and the family's soft-capping)."""
        normed = adapter.final_norm(final_ZBD.to(execution_device(adapter.final_norm)))
        # a product and a sum per row, not a batched matmul: a GEMM's low bits may depend on where a row sits in
        # the batch (seen on AVX-512), and the clean row 0 must go through the same arithmetic as a patched row
        logits = (normed.to(self.rows_BRD.device).float()[:, :, None, :] * self.rows_BRD.float()).sum(-1)
        return adapter.soft_capped(logits if self.bias_BR is None else logits + self.bias_BR)


def _direct_effects(
    adapter: ModelAdapter, final_BD: torch.Tensor, deltas_ZBD: torch.Tensor, answer: AnswerRows, weight_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For N residual deltas, per problem ([N, B], weighted): the relative change of the correct logit and the change
    of (correct - top wrong). The clean reference goes through the same arithmetic, so a zero delta gives zero."""
    deltas_ZBD = deltas_ZBD.to(final_BD.device)
    both = torch.cat([torch.zeros_like(deltas_ZBD[:1]), deltas_ZBD])
    return logit_change_rows(answer.logits(adapter, final_BD[None] + both), weight_B)


def logit_change_rows(
    logits_ZBR: torch.Tensor, weight_B: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0 the clean reference, rows 1.. patched ([Z, B, correct/wrong]): per patched row and problem ([Z-1, B],
    each weighted when weights are given), the relative change of the correct logit and the change of
    (correct - clean top wrong)."""
    (c0, w0), (c1, w1) = logits_ZBR[0].unbind(-1), logits_ZBR[1:].unbind(-1)
    w = torch.ones_like(c0) if weight_B is None else weight_B.to(c0.device, c0.dtype)
    rel = (c1 - c0) / c0.abs().clamp(min=1e-6) * w
    return rel.cpu(), (((c1 - w1) - (c0 - w0)) * w).cpu()


class Effects(TypedDict):
    """Per sender the mean path-patching effects ([layer, head]; [layer] for the MLPs) and the clean logit
    difference they are measured against."""

    relative_logit_change_layer_head: torch.Tensor
    logit_diff_change_layer_head: torch.Tensor
    relative_logit_change_mlp_layer: torch.Tensor
    logit_diff_change_mlp_layer: torch.Tensor
    clean_logit_diff: float


class ProblemEffects(Effects):
    """The effects and each problem's ([P, L, H]; its mean over answer steps): what key heads are confirmed with."""

    relative_logit_change_problem_layer_head: torch.Tensor
    logit_diff_change_problem_layer_head: torch.Tensor


class PathPatching(ProblemEffects):
    """Path patching on problems of one token layout (`path_patching`): the effects, by which path, what was
    scored, and how many problems have each answer step."""

    path: str
    scoring: str
    answer_steps_n: dict[str, int]


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


@dataclass
class EffectSums:
    """Path-patching effects of the heads per weighted problem row ([P, L, H]; NaN in layers not patched) and of
    the MLPs summed over them, of one or several answer steps."""

    rel_PLH: torch.Tensor
    diff_PLH: torch.Tensor
    rel_L: torch.Tensor
    diff_L: torch.Tensor
    clean_diff: float = 0.0

    @classmethod
    def zeros(cls, P: int, L: int, H: int, layers: Sequence[int] | None = None) -> EffectSums:
        """Zeros in the patched layers (all, or `layers`), NaN in the others."""
        heads, mlps = torch.zeros(P, L, H), torch.zeros(L)
        if layers is not None:
            unpatched = [layer for layer in range(L) if layer not in layers]
            heads[:, unpatched], mlps[unpatched] = float("nan"), float("nan")
        return cls(heads, heads.clone(), mlps, mlps.clone())

    def add_rows(self, rows_P: torch.Tensor, other: EffectSums) -> None:
        """Add an answer step's sums, whose problem rows are `rows_P` of these."""
        self.rel_PLH[rows_P] += other.rel_PLH
        self.diff_PLH[rows_P] += other.diff_PLH
        self.rel_L += other.rel_L
        self.diff_L += other.diff_L
        self.clean_diff += other.clean_diff

    def means(self) -> ProblemEffects:
        """Divided by the number of problems: the per-problem means path patching reports, and each problem's."""
        P = len(self.rel_PLH)
        return ProblemEffects(
            relative_logit_change_layer_head=self.rel_PLH.sum(0) / P,
            logit_diff_change_layer_head=self.diff_PLH.sum(0) / P,
            relative_logit_change_mlp_layer=self.rel_L / P,
            logit_diff_change_mlp_layer=self.diff_L / P,
            clean_logit_diff=self.clean_diff / P,
            relative_logit_change_problem_layer_head=self.rel_PLH,
            logit_diff_change_problem_layer_head=self.diff_PLH,
        )


SCORED = {
    "full": "every teacher-forced step of the answer's tokens (not the end-of-answer step): per problem the mean "
    "over its answer steps of the relative change of "
    "the correct token's logit, (patched - clean) / |clean|, and of the change of (correct - clean top wrong), then "
    "the mean over problems (each problem counts once); the counterfactual at step k is the counterfactual prompt "
    "followed by the same k clean answer tokens",
    "first": "the first answer token only: per problem the relative change of its logit, (patched - clean) / "
    "|clean|, and the change of (correct - clean top wrong), then the mean over problems",
}


def scored_steps(task: Task, scoring: str | None = None) -> tuple[str, list[tuple[Task, torch.Tensor]]]:
    """What path patching, attention shares and the logit lens score (the task's own scoring unless `scoring` says
    first): the answer's steps (`Task.steps()` without the end-of-answer step: heads are ranked by the arithmetic,
    not by the separator after it), each with its rows' weights, 1 / (the problem's number of scored steps), so that
    summed over steps and divided by the problems each problem counts once."""
    first = scoring == "first" or task.spec.scoring == "first"
    steps = [s for s in task.answer_only().steps() if not first or not s.step]
    count = torch.zeros(len(task))
    for step in steps:
        count[step.rows_in_parent] += 1
    return ("first" if first else "full"), [(step, 1 / count[step.rows_in_parent]) for step in steps]


def head_deltas(adapter: ModelAdapter, layer: int, z_clean_BE: torch.Tensor, z_new_BE: torch.Tensor) -> torch.Tensor:
    """[H, B, D]: what each head's change of output adds to the residual stream through o_proj."""
    H, d = adapter.n_heads, adapter.head_dim
    with adapter.onloaded(adapter.o_proj(layer)):
        W = adapter.o_proj_weight(layer)
        return torch.einsum("bhe,dhe->hbd", (z_new_BE - z_clean_BE).to(W.device).view(-1, H, d), W.view(-1, H, d))


def check_direct_paths(adapter: ModelAdapter) -> None:
    if (reason := adapter.nonlinear_outputs()) is not None:
        raise Af1Error(f"{reason}: their direct paths to the logits are not linear, so path patching is not offered")


PATHS = ("wang", "direct", "total")


def path_patching(
    adapter: ModelAdapter,
    task: Task,
    cf: Counterfactual,
    path: str = "wang",
    batch_size: int = 32,
    scoring: str | None = None,
    layers: Sequence[int] | None = None,
) -> PathPatching:
    """The effect of every head and MLP (of `layers`, else every layer) on the last-position logits, by one of
    `PATHS`, over every teacher-forced answer step (first-token scoring: the first; `SCORED` says how they are
    averaged): per sender the mean relative change of the correct logit and the mean change of (correct - clean top
    wrong), each problem's too, with the clean logit difference they are measured against. `task` is of one token
    layout."""
    if path not in PATHS:
        raise Af1Error(f"unknown path '{path}': one of {', '.join(PATHS)}")
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
        if path == "direct":
            sums = direct_path_patching(adapter, step, step_cf, batch_size, weight, layers)
        else:
            sums = downstream_path_patching(adapter, step, step_cf, path == "total", batch_size, weight, layers)
        total.add_rows(step.rows_in_parent, sums)
    steps_n = {str(step.step or 0): len(step) for step, _ in steps}
    return PathPatching(**total.means(), path=path, scoring=scored, answer_steps_n=steps_n)


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
) -> EffectSums:
    """Wang's path patching (heads frozen, MLPs recompute) or, with recompute_attention, activation patching
    at the last position, on one answer step (its rows weighted by weight_P), the senders of `layers` (else every
    layer). Per layer one last-token pass with rows [clean, H heads, the MLP] x problems."""

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
            adapter, [s for layer in range(L) for s in (head_inputs(layer), mlp_output(layer))], last_only=True
        ) as corrupt:
            forward_last(adapter.model, cf.input_ids_PT[sl], task.context_len)
        kv = capture_problem_kv(adapter, ids, task.context_len) if recompute_attention else None
        answer = task.answer_ids_P[sl].to(base.device)
        B = len(answer)
        unembed = AnswerRows.of(adapter, base, answer)
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
            with edit_outputs(adapter, edits), fixed_attention(adapter, fixed), attention_plans(adapter, plans):
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


@torch.no_grad()
def direct_path_patching(
    adapter: ModelAdapter,
    task: Task,
    cf: Counterfactual,
    batch_size: int = 32,
    weight_P: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
) -> EffectSums:
    """Direct-path effect of every head and MLP (of `layers`, else every layer) on the last-position logits of the
    correct answer, on one answer step (its rows weighted by weight_P): relative changes of the correct logit and
    changes of (correct - clean top wrong)."""
    check_direct_paths(adapter)
    L, H = adapter.n_layers, adapter.n_heads
    P = len(task)
    sums = EffectSums.zeros(P, L, H, layers)
    weight_P = torch.ones(P) if weight_P is None else weight_P
    for sl in batches(P, batch_size):
        clean, base = run_last(adapter, task.input_ids_PT[sl], task.context_len)
        corrupt, _ = run_last(adapter, cf.input_ids_PT[sl], task.context_len)
        unembed = AnswerRows.of(adapter, base, task.answer_ids_P[sl].to(base.device))
        w = weight_P[sl]
        c0, w0 = unembed.logits(adapter, clean[FINAL][None])[0].unbind(-1)
        sums.clean_diff += float(((c0 - w0) * w.to(c0.device)).sum())
        for layer in sorted(layers) if layers is not None else range(L):
            deltas = head_deltas(adapter, layer, clean[head_inputs(layer)], corrupt[head_inputs(layer)])
            r, g = _direct_effects(adapter, clean[FINAL], deltas, unembed, w)
            sums.rel_PLH[sl, layer] = r.T
            sums.diff_PLH[sl, layer] = g.T
            dm = (corrupt[mlp_output(layer)] - clean[mlp_output(layer)])[None]
            r, g = _direct_effects(adapter, clean[FINAL], dm, unembed, w)
            sums.rel_L[layer] += r[0].sum()
            sums.diff_L[layer] += g[0].sum()
    return sums


# --- activation patching and mean ablation of heads ------------------------------------------------


@torch.no_grad()
def knocked_step(
    adapter: ModelAdapter,
    step: Task,
    head_sets: list[list[tuple[int, int]]],
    sums: HeadSums,
    batch_size: int = 32,
) -> list[Scores]:
    """One answer step's next-token scores with each set of heads mean-ablated at every position, a `Scores` per set.
    The mean leaves the problem's own state out where the problem is inside it (`HeadSums.loo`: its clean,
    unablated head input, recorded in one clean forward per batch for the knocked layers only). Several sets share
    a forward (rows set x problem). At the shared context's positions a head's mean is its own output (the same in
    every problem): only the suffix is rewritten, and it runs on the context's cache."""
    c = suffix_start(adapter.model, step.input_ids_PT, step.context_len)
    layers = sorted({layer for heads in head_sets for layer, _ in heads})
    member_P = sums.member_B(step.input_ids_PT)
    parts: list[list[Scores]] = [[] for _ in head_sets]
    for sl in batches(len(step), batch_size):
        ids = step.input_ids_PT[sl]
        B = len(ids)
        own: dict[Site, torch.Tensor] = {}
        if layers:
            with record(adapter, [head_inputs(layer) for layer in layers]) as own:
                forward_last(adapter.model, ids, step.context_len)
        loo = {layer: sums.loo(layer, c, own[head_inputs(layer)], member_P[sl]) for layer in layers}
        for chunk in batches(len(head_sets), max(1, batch_size // B)):
            sets = head_sets[chunk]

            edits = {layer: _ablation(adapter, layer, sets, loo[layer]) for layer in layers}
            knocked = {layer for heads in sets for layer, _ in heads}
            with replace_heads(adapter, {layer: edit for layer, edit in edits.items() if layer in knocked}):
                logits = forward_last(adapter.model, ids.repeat(len(sets), 1), step.context_len)
            for s in range(len(sets)):
                parts[chunk.start + s].append(Scores.from_logits(logits[s * B : (s + 1) * B], step.answer_ids_P[sl]))
    return [Scores.concat(p) for p in parts]


def _ablation(adapter: ModelAdapter, layer: int, sets: list[list[tuple[int, int]]], mean_BTE: torch.Tensor):
    """The edit of a layer's head inputs for rows set x problem (row s*B + b: set s, problem b): each set's heads
    of this layer take the problem's mean."""
    d, B = adapter.head_dim, len(mean_BTE)
    mask_SE = torch.zeros(len(sets), adapter.n_heads * d, dtype=torch.bool)
    for s, heads in enumerate(sets):
        for hl, h in heads:
            if hl == layer:
                mask_SE[s, h * d : (h + 1) * d] = True
    mask_R1E = mask_SE.repeat_interleave(B, 0)[:, None]
    mean_RTE = mean_BTE.repeat(len(sets), 1, 1)

    def fn(z: torch.Tensor) -> torch.Tensor:
        return torch.where(mask_R1E.to(z.device), mean_RTE.to(z.device, z.dtype), z)

    return fn


def head_sums_by_step(adapter: ModelAdapter, task: Task) -> dict[Any, HeadSums]:
    """Head sums per token layout and answer step (teacher forced) over all the task's problems, by `part_key`:
    what knockout ablates to (leave-one-out for the problems among them)."""
    return {step.part_key: head_sums(adapter, step) for step in task.steps()}


def knockouts(
    adapter: ModelAdapter, kept: Task, head_sets: list[list[tuple[int, int]]], means: dict[Any, HeadSums]
) -> list[Scores]:
    """Every answer step of the solved problems with each set of heads mean-ablated (leave-one-out means), a
    `Scores` per set; the sets share forwards."""
    per_step = [knocked_step(adapter, step, head_sets, means[step.part_key]) for step in kept.steps()]
    return [Scores.combine(kept, [scores[i] for scores in per_step]) for i in range(len(head_sets))]


def knockout_scores(
    adapter: ModelAdapter, kept: Task, heads: list[tuple[int, int]], means: dict[Any, HeadSums]
) -> Scores:
    """Every answer step of the solved problems with the listed heads mean-ablated (leave-one-out means)."""
    return knockouts(adapter, kept, [heads], means)[0]


def loo_fallbacks(kept: Task, means: dict[Any, HeadSums]) -> int:
    """(problem, answer step) pieces whose mean has no other problem (a sum of one): they keep their own state."""
    return sum(
        int(sums.member_B(step.input_ids_PT).sum()) for step in kept.steps() if (sums := means[step.part_key]).n == 1
    )


def per_layout(task: Task) -> list[tuple[float, Task]]:
    """Each token layout's problems with its share of the task: measures that compare positions run per layout and
    are pooled by these weights (each problem counts once)."""
    return [(len(group) / len(task), group) for group in task.groups] or [(1.0, task)]


def pooled(weighted: list[tuple[float, Any]]) -> Any:
    """The weighted mean of per-layout results: tensors and numbers averaged, dicts by key, anything else (a name)
    taken from the first; None stays None."""
    first = weighted[0][1]
    if len(weighted) == 1 or first is None:
        return first
    if isinstance(first, dict):
        return {key: pooled([(w, v[key]) for w, v in weighted]) for key in first}
    if isinstance(first, torch.Tensor | float | int) and not isinstance(first, bool):
        return sum(w * v for w, v in weighted)
    return first


PER_PROBLEM = ("relative_logit_change_problem_layer_head", "logit_diff_change_problem_layer_head")


def layout_path_patching(
    adapter: ModelAdapter,
    kept: Task,
    tokenizer: Tokenizer,
    path: str,
    kind: str | None = None,
    scoring: str | None = None,
    layers: Sequence[int] | None = None,
) -> tuple[PooledPathPatching, Counterfactual]:
    """Path patching per token layout (each with its own counterfactual of `kind`), pooled over layouts by their n;
    a layout where no replacement keeps its token layout is left out and said so; the first layout's
    counterfactual describes them. `counterfactual_rows`: per problem of `kept`, its counterfactual (None where its
    layout was left out); each problem's effects in `kept`'s order (NaN where its layout was left out)."""
    runs: list[tuple[Task, Counterfactual]] = []
    skipped: list[LayoutNotPatched] = []
    for _, group in per_layout(kept):
        try:  # a layout where no value of the slot (or its null value) keeps the token layout has none
            runs.append((group, counterfactual(group, tokenizer, kind)))
        except Af1Error as exc:
            if not kept.groups:
                raise
            skipped.append(LayoutNotPatched(layout=group.layout_id, n=len(group), reason=str(exc)))
    if not runs:
        raise Af1Error(f"no token layout has a counterfactual: {skipped[0]['reason']}")
    n = sum(len(group) for group, _ in runs)
    parts = [
        (len(group) / n, path_patching(adapter, group, cf, path, scoring=scoring, layers=layers)) for group, cf in runs
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
        answer_steps_n=steps_n,
        counterfactual_rows=rows,
    )
    if kept.groups:
        result["layouts_patched"] = [LayoutPatched(layout=g.layout_id, n=len(g)) for g, _ in runs]
        result["layouts_not_patched"] = skipped
    return result, runs[0][1]


@torch.no_grad()
def activation_patching(
    adapter: ModelAdapter,
    task: Task,
    cf: Counterfactual,
    heads: list[tuple[int, int]],
    rows_per_forward: int = 64,
) -> torch.Tensor:
    """Last-position logits of the correct answer with one head at a time patched from the counterfactual run
    (effects flow through later layers): [head, problem]. Many heads share a forward: row r patches head r."""
    d = adapter.head_dim
    c = task.context_len
    c = c if torch.equal(cf.input_ids_PT[:, :c], task.input_ids_PT[:, :c]) else 0
    with record(adapter, [head_inputs(layer) for layer in range(adapter.n_layers)]) as cache:
        forward_last(adapter.model, cf.input_ids_PT, c)
    z_cf = {layer: cache[head_inputs(layer)].detach() for layer in range(adapter.n_layers)}  # [P, T, E]
    P = len(task)
    pairs = [(hi, p) for hi in range(len(heads)) for p in range(P)]
    result = torch.zeros(len(heads), P)
    for sl in batches(len(pairs), rows_per_forward):
        chunk = pairs[sl]
        ids = task.input_ids_PT[[p for _, p in chunk]].to(adapter.device)
        layers_needed = {heads[hi][0] for hi, _ in chunk}

        def patch(layer: int, chunk=chunk):
            def fn(z: torch.Tensor) -> torch.Tensor:
                z = z.clone()
                for row, (hi, p) in enumerate(chunk):
                    hl, hh = heads[hi]
                    if hl == layer:
                        z[row, :, hh * d : (hh + 1) * d] = z_cf[layer][p, :, hh * d : (hh + 1) * d]
                return z

            return fn

        with replace_heads(adapter, {layer: patch(layer) for layer in layers_needed}):
            logits = forward_last(adapter.model, ids, c)  # a shared context: both runs patch the suffix only
        for row, (hi, p) in enumerate(chunk):
            result[hi, p] = logits[row, task.answer_ids_P[p]]
    return result


# --- where key heads look, logit lens of MLPs, overlap ---------------------------------------------


@torch.no_grad()
def last_query_attention(
    adapter: ModelAdapter, task: Task, heads: list[tuple[int, int]], scoring: str | None = None
) -> dict[str, dict[str, float]]:
    """Share of each head's attention from the last position to operands, the token after an operand (the operator,
    "=", " and": whatever the style puts there; a task file: slots, the token after a slot), context, the earlier
    answer tokens, the last position itself and the rest, at every scored answer step (`scored_steps`: per problem
    the mean over its steps, then over problems)."""
    if task.groups:
        return pooled([(w, last_query_attention(adapter, group, heads, scoring)) for w, group in per_layout(task)])
    scored, steps = scored_steps(task, scoring)
    out: dict[str, dict[str, float]] = {}
    for step, weight in steps:
        for head, shares in _step_attention(adapter, step, heads, task.n_positions, scored == "full").items():
            into = out.setdefault(head, {})
            for g, share_P in shares.items():
                into[g] = into.get(g, 0.0) + float((share_P * weight).sum()) / len(task)
    return out


def _step_attention(
    adapter: ModelAdapter, step: Task, heads: list[tuple[int, int]], n_prompt: int, answer_group: bool
) -> dict[str, dict[str, torch.Tensor]]:
    """At one answer step: per head and position group, each problem's share of the last query's attention [P]."""
    probs = last_query_probs(adapter, step.input_ids_PT.to(adapter.device), heads, step.context_len)
    roles = list(step.layout)
    n = len(roles)
    prompt = range(n_prompt - 1)  # the prompt's positions but its last (the query at step 0; "other" after it)
    file = step.spec.file is not None  # a task file has slots, and the token after one, not operands and operators
    groups = {
        # the last position is its own group even when it spells a slot (induction)
        "slots" if file else "operands": [t for t in prompt if roles[t] not in NOT_OPERANDS],
        "after a slot" if file else "after an operand": [
            t for t in prompt if roles[t] == "const" and t > 0 and roles[t - 1] not in NOT_OPERANDS
        ],
        "context": [t for t in prompt if roles[t] == "context"],
    }
    if answer_group:
        groups["earlier answer tokens"] = list(range(n_prompt, n - 1))
    groups["last"] = [n - 1]
    named = {t for g in groups.values() for t in g}
    groups["other"] = [t for t in range(n) if t not in named]
    out = {}
    for layer, h in heads:
        p = probs[layer][:, h].cpu()  # [P, T]
        out[f"{layer}.{h}"] = {g: p[:, idx].sum(-1) for g, idx in groups.items()}
    return out


def last_query_probs(
    adapter: ModelAdapter, ids_PT: torch.Tensor, heads: list[tuple[int, int]], context_len: int = 0
) -> dict[int, torch.Tensor]:
    """Per layer of `heads`, the last position's attention over every position [P, head, T], in float32 from the
    queries and keys the attention interface receives (`context_len`: a shared prefix computed once)."""
    probs: dict[int, torch.Tensor] = {}
    group = adapter.n_heads // adapter.n_kv_heads

    def capture(layer: int):
        def fn(module, q, k, _v):
            k = k.repeat_interleave(group, dim=1) if k.shape[1] != q.shape[1] else k
            scale = getattr(module, "scaling", None) or q.shape[-1] ** -0.5
            probs[layer] = torch.softmax((q[:, :, -1:].float() @ k.float().transpose(-1, -2))[:, :, 0] * scale, -1)

        return fn

    layers = sorted({layer for layer, _ in heads})
    with attention_plans(adapter, {layer: LayerPlan(capture=capture(layer)) for layer in layers}):
        forward_last(adapter.model, ids_PT, context_len)
    return probs


@with_config(ConfigDict(extra="forbid"))
class TokenAttention(TypedDict):
    """One problem's tokens with each head's attention from the last position over them (`token_attention`)."""

    problem: int  # its row in the problems it was taken from
    prompt: str
    answer_step: int
    tokens: list[str]
    roles: list[str]
    heads: dict[str, list[float]]  # "layer.head" -> a weight per token


@torch.no_grad()
def token_attention(
    adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase, task: Task, heads: list[tuple[int, int]]
) -> TokenAttention | None:
    """Each head's attention from the last position over every token of one problem (the first of `task`, at its
    first answer step): the per-token picture behind `last_query_attention`'s shares, for the report to draw."""
    if not len(task) or not heads:
        return None
    step = task.steps()[0]
    row = int(step.rows_in_parent[0])  # the problem's row in `task`
    ids = step.input_ids_PT[:1].to(adapter.device)
    probs = last_query_probs(adapter, ids, heads)  # the whole input, context included: a weight for every token
    return TokenAttention(
        problem=row,
        prompt=task.problems[row].prompt,
        answer_step=0,
        tokens=[str(tokenizer.decode([t])) for t in ids[0].tolist()],
        roles=list(step.layout),
        heads={f"{layer}.{h}": [round(float(x), 5) for x in probs[layer][0, h].cpu()] for layer, h in heads},
    )


def norm_read(norm: torch.nn.Module, x_BD: torch.Tensor, m_BD: torch.Tensor) -> torch.Tensor:
    """What a residual component m contributes to norm(x) when the norm's scale is frozen at x's: g * c(m) / s(x)
    (c: centring for LayerNorm, s: its std or RMS). Summed over the components of x it gives norm(x) minus its
    bias, so the reads of all components add up to the logits. Uses the module itself: norm(m) = g * c(m) / s(m)."""
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
    """Per layer: what the MLP's output at the last position adds to the correct token's logit, read through the
    final norm with its scale frozen at the final residual (`norm_read`) and the unembedding, at every scored answer
    step (`scored_steps`: per problem the mean over its steps, then over problems). None for families whose MLP
    output is normalised again before the residual sum (post-norms)."""
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


METRICS = ("relative", "logit_diff")
OWN_SPLIT = "the heads study's own seeded split"  # where the heads are chosen without a search's split


def problem_effects(pp: ProblemEffects, metric: str) -> torch.Tensor:
    """[problem, layer, head] by one metric (`effect_of`'s, per problem; its mean over problems is `effect_of`)."""
    if metric == "relative":
        return pp["relative_logit_change_problem_layer_head"]
    if metric == "logit_diff":
        return pp["logit_diff_change_problem_layer_head"] / max(abs(pp["clean_logit_diff"]), 1e-6)
    raise Af1Error(f"unknown metric '{metric}': one of {', '.join(METRICS)}")


def effect_of(pp: Effects, metric: str) -> torch.Tensor:
    """[layer, head] by one metric: the relative change of the correct logit, or the change of (correct - clean
    top wrong) as a share of the clean logit difference; negative: the head supports the answer."""
    if metric == "relative":
        return pp["relative_logit_change_layer_head"]
    if metric == "logit_diff":
        return pp["logit_diff_change_layer_head"] / max(abs(pp["clean_logit_diff"]), 1e-6)
    raise Af1Error(f"unknown metric '{metric}': one of {', '.join(METRICS)}")


def key_heads(effect_LH: torch.Tensor, threshold: float = -0.05) -> list[tuple[int, int]]:
    """Heads whose path-patching effect is below the threshold, strongest first."""
    found = [(float(effect_LH[layer, h]), layer, h) for layer, h in (effect_LH < threshold).nonzero().tolist()]
    return [(layer, h) for _, layer, h in sorted(found)]


@with_config(ConfigDict(extra="forbid"))
class Overlap(TypedDict):
    """Two head sets compared: Jaccard (None when both are empty), the share of their top k in common, what the
    first top k would share on average with random heads drawn in the second's layers (as many per layer: high
    effects cluster in a few layers), and the chance of sharing as many or more under that draw."""

    jaccard: float | None
    top_k_overlap: float
    k: int
    top_k_overlap_chance: float
    top_k_overlap_p: float


OVERLAP_DRAWS = 10_000  # draws of the layer-matched null: the smallest p is 1 / 10,001


def overlap(
    a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], heads_per_layer: int, k: int | None = None
) -> Overlap:
    """Jaccard of two head sets (None when both are empty) and the overlap of their top-k, against chance: `b`'s
    top k redrawn at random within their own layers, a seeded Monte-Carlo p."""
    sa, sb = set(map(tuple, a)), set(map(tuple, b))
    jac = len(sa & sb) / len(sa | sb) if sa | sb else None
    k = k or min(len(a), len(b))
    top_a, top_b = set(map(tuple, a[:k])), [tuple(h) for h in b[:k]]
    shared = len(top_a & set(top_b))
    rng = np.random.default_rng(0)
    simulated = np.zeros(OVERLAP_DRAWS, dtype=int)
    expected = 0.0
    for layer in sorted({h[0] for h in top_b}):
        count = sum(h[0] == layer for h in top_b)
        mine = np.array([h in top_a for h in ((layer, j) for j in range(heads_per_layer))])
        drawn = rng.permuted(np.tile(np.arange(heads_per_layer), (OVERLAP_DRAWS, 1)), axis=1)[:, :count]
        simulated += mine[drawn].sum(1)
        expected += count * mine.sum() / heads_per_layer
    return Overlap(
        jaccard=jac,
        top_k_overlap=shared / k if k else 1.0,
        k=k,
        top_k_overlap_chance=float(expected / k) if k else 0.0,
        top_k_overlap_p=float((1 + (simulated >= shared).sum()) / (OVERLAP_DRAWS + 1)),
    )


def top_heads(effect_LH: torch.Tensor, k: int) -> list[tuple[int, int]]:
    """The k heads with the most negative effect."""
    order = effect_LH.flatten().argsort()[:k].tolist()
    H = effect_LH.shape[1]
    return [(i // H, i % H) for i in order]


@with_config(ConfigDict(extra="forbid"))
class ScoringNote(TypedDict):
    """What path patching scored, on how many problems, and the constant guess of it (a warning when near one)."""

    scoring: str
    definition: str
    n: int
    constant_guess: float
    constant_guess_by_step: dict[str, float]
    warning: str | None


def scoring_note(on: Task, scored: str) -> ScoringNote:
    """What path patching scored on these problems (those it patched), with the constant guess of what it scored
    (one guess per token layout, which the prompt shows): the whole answer and each answer step's token (full), or
    the first token (first, with a warning when it is near constant)."""
    answers, layouts = on.answer_tokens, on.layout_P.tolist()
    first = constant_baseline([a[0] for a in answers], layouts)
    by_step = {}
    for k in range(max(map(len, answers)) if scored == "full" else 1):
        rows = [i for i, a in enumerate(answers) if len(a) > k]
        by_step[str(k)] = constant_baseline([answers[i][k] for i in rows], [layouts[i] for i in rows])
    return ScoringNote(
        scoring=scored,
        definition=SCORED[scored],
        n=len(on),
        constant_guess=first if scored == "first" else constant_baseline([tuple(a) for a in answers], layouts),
        constant_guess_by_step=by_step,
        warning=baseline_warning("the first answer token path patching scores", first, len(on))
        if scored == "first"
        else None,
    )


class Ranked(TypedDict):
    """Heads ranked by path patching with one counterfactual (`ranked`): the patching, the effect by the chosen
    metric, the top k, what was scored, and the counterfactual."""

    pp: PooledPathPatching
    counterfactual: str
    counterfactual_kind: str
    top_heads: list[tuple[int, int]]
    effect: torch.Tensor
    scoring: ScoringNote


def ranked(
    adapter: ModelAdapter,
    on: Task,
    tokenizer: Tokenizer,
    path: str,
    metric: str,
    k: int,
    kind: str | None = None,
    scoring: str | None = None,
) -> Ranked:
    """Path patching on these problems with one counterfactual and the heads it ranks: the effects, the top k
    (by `metric`), what was scored, the counterfactual and each problem's counterfactual input."""
    pp, cf = layout_path_patching(adapter, on, tokenizer, path, kind, scoring)
    effect = effect_of(pp, metric)
    patched = on.subset([i for i, row in enumerate(pp["counterfactual_rows"]) if row is not None])
    return Ranked(
        pp=pp,
        counterfactual=cf.replacement,
        counterfactual_kind=cf.kind,
        top_heads=top_heads(effect, k),
        effect=effect,
        scoring=scoring_note(patched, pp["scoring"]),
    )


def problem_split(n: int, split: tuple[float, int]) -> tuple[list[int], list[int]]:
    """(selection, confirmation) rows of n solved problems: heads are chosen on the first and tested on the
    second."""
    if n < 2:
        raise Af1Error(
            f"{n} solved problem: heads are chosen on one half of the solved problems and tested on the other, "
            "which needs at least 2"
        )
    selection, seed = split
    sel, conf = split_indices(n, selection, seed)
    if not sel or not conf:
        raise Af1Error(f"the split of {n} solved problems at {selection} leaves one half empty: use more problems")
    return sel, conf


# which solved problems chose the heads and which tested them ("from": the split's origin; a keyword, so this form)
Split = with_config(ConfigDict(extra="forbid"))(
    TypedDict(
        "Split",
        {
            "from": str,
            "selection_fraction": float,
            "split_seed": int,
            "n_selection": int,
            "n_confirmation": int,
            "heads_chosen_on": str,
            "tested_on": str,
        },
    )
)


@with_config(ConfigDict(extra="forbid"))
class Knockout(TypedDict):
    """The top k heads mean-ablated against random sets of k, on the confirmation part, with intervals."""

    k: int
    heads: list[list[int]]
    scoring: str
    means: str
    means_without_other_problems: int
    measured_on: str
    n: int
    accuracy_top_k: float
    accuracy_top_k_ci: list[float]
    random_drawn_from: str
    random_matched: dict[str, int]  # over all draws: heads matched by layer and key/value group, by layer, nearest
    random_heads: list[list[list[int]]]
    top_rank_among_random: int  # random sets that leave as few problems right as the top set, or fewer
    top_rank_p: (
        float  # (1 + those) / (draws + 1): how rare the top set is among random draws (at least 1 / (draws + 1))
    )
    accuracy_random_k_mean: float
    accuracy_random_k_std: float
    accuracy_random_k: list[float]
    accuracy_random_k_ci: list[list[float]]
    accuracy_baseline: float
    base_accuracy: float


@with_config(ConfigDict(extra="forbid"))
class SecondCounterfactual(TypedDict):
    """The heads a second counterfactual ranks, path patching only on the same selection part."""

    counterfactual_kind: str
    counterfactual: str
    measured: str
    top_heads: list[list[int]]
    key_heads: list[list[int]]
    effect_layer_head: list[list[float | None]]
    top_k_overlap: float
    top_k_overlap_chance: float
    top_k_overlap_p: float
    counterfactual_problems: list[dict[str, Any]]


@with_config(ConfigDict(extra="forbid"))
class NoSecondCounterfactual(TypedDict):
    """Why the second counterfactual has no ranking (e.g. no other operand value keeps a problem's layout)."""

    counterfactual_kind: str
    error: str


@with_config(ConfigDict(extra="forbid"))
class TaskOverlap(TypedDict):
    """Key and top-k heads of another task (chosen on its own selection part) against this one's; or why it has
    none (`error`)."""

    task: str
    style: str
    error: NotRequired[str]
    n_solved: NotRequired[int]
    n_selection: NotRequired[int]
    key_heads: NotRequired[list[list[int]]]
    key_heads_jaccard: NotRequired[float | None]
    top_k_overlap: NotRequired[float]
    top_k_overlap_chance: NotRequired[float]
    top_k_overlap_p: NotRequired[float]
    k: NotRequired[int]


class HeadsStudy(TypedDict):
    """The arithmetic-heads study (`study`): path patching's effects and what it scored, the key and top heads
    chosen on the selection part, their knock-out and attention on the confirmation part, the MLP logit lens, a
    second counterfactual's ranking and other tasks' heads."""

    model: str | None
    task: str
    style: str
    n: int
    n_solved: int
    layouts: list[LayoutRow]  # path patching, knock-outs and attention per layout, pooled by each one's n
    scoring: str
    path_patching_scoring: ScoringNote
    base_accuracy_all: float
    split: Split
    counterfactual: str
    counterfactual_kind: str
    counterfactual_problems: list[dict[str, Any]]
    n_heads: int
    threshold: float
    path: str
    metric: str
    key_heads: list[list[int]]
    key_head_share: float
    key_heads_by_metric: dict[str, list[list[int]]]
    top_heads: list[list[int]]
    relative_logit_change_layer_head: list[list[float | None]]
    logit_diff_change_layer_head: list[list[float | None]]
    relative_logit_change_mlp_layer: list[float | None]
    logit_diff_change_mlp_layer: list[float | None]
    clean_logit_diff: float
    answer_steps_n: dict[str, int]  # solved problems of the selection part with an answer step k, by k
    layouts_patched: NotRequired[list[LayoutPatched]]
    layouts_not_patched: NotRequired[list[LayoutNotPatched]]
    knockout: Knockout
    attention_of_top_heads: dict[str, dict[str, float]]
    attention_measured_on: str
    attention_over_tokens: TokenAttention | None
    mlp_logit_lens_layer: list[float | None] | None  # None: a family whose MLP output is not linear in its input
    mlp_logit_lens_measured_on: str
    warnings: list[str]
    second_counterfactual: NotRequired[SecondCounterfactual | NoSecondCounterfactual]
    overlap: list[TaskOverlap]
    confirmed_key_heads: list[list[int]]  # key heads whose claim is confirmed on the confirmation part
    claims: list[Claim]  # each key head's, and the top heads' against matched random heads: one family


def key_head_claims(
    adapter: ModelAdapter,
    tested_on: Task,
    tokenizer: Tokenizer,
    candidates: list[tuple[int, int]],
    *,
    threshold: float,
    path: str,
    metric: str,
    kind: str | None,
) -> list[Claim]:
    """Each key head chosen on the selection part, judged on the confirmation part: path patching of its layers
    there, its per-problem effects' mean against the threshold (one-sided t test, bootstrap interval)."""
    if not candidates:
        return []
    layers = sorted({layer for layer, _ in candidates})
    with progress_stage(f"key heads confirmed: path patching of {len(layers)} layers on the confirmation part"):
        pp, _ = layout_path_patching(adapter, tested_on, tokenizer, path, kind, layers=layers)
    effect_PLH = problem_effects(pp, metric)
    return [
        mean_below(
            "key_head",
            f"head {layer}.{h} is a key head (path-patching effect below {threshold})",
            effect_PLH[:, layer, h].tolist(),
            threshold,
            f"the confirmation part ({len(tested_on)} solved problems that did not choose the head)",
            subject=f"{layer}.{h}",
        )
        for layer, h in candidates
    ]


def top_vs_random_claim(top: Scores, randoms: list[Scores], k: int, measured_on: str) -> Claim:
    """'Knocking out the top k heads leaves fewer problems right than knocking out matched random sets of k': per
    problem, the share of random sets that leave it right against whether the top set does (paired permutation
    test over problems)."""
    random_correct = torch.stack([s.correct_P.float() for s in randoms])  # [random set, problem]
    return paired_greater(
        "top_vs_random",
        f"mean-ablating the top {k} heads leaves fewer problems right than these {len(randoms)} random sets of {k} "
        "from the same layers and key/value groups (the draws held fixed: over new draws, `top_rank_p`)",
        random_correct.mean(0).tolist(),
        top.correct_P.float().tolist(),
        measured_on,
    )


FAMILY = "the heads study"


def decide(claims: list[Claim]) -> tuple[list[Claim], list[list[int]]]:
    """The study's claims adjusted as one family (Holm), and the key heads that stay confirmed."""
    family = adjust(claims, FAMILY)
    return family, [list(map(int, h.split("."))) for h in confirmed(family, "key_head")]


def study(
    lm: LoadedModel,
    spec: TaskSpec,
    *,
    threshold: float,
    k: int,
    draws: int,
    path: str,
    metric: str,
    split: tuple[float, int],
    split_from: str,
    kind: str | None = None,
    second_kind: str | None = None,
    compare_specs: list[TaskSpec] | None = None,
    done: Evaluated | None = None,
) -> HeadsStudy:
    """Path patching (by `path`, counterfactual `kind`, every answer step unless the task scores the first token)
    and key and top-k heads (by `metric`, both metrics kept), chosen on the selection part of the solved problems
    (`split`: the search's where there is one); on the confirmation part, knockout of the top k against `draws`
    random sets of k drawn from the heads not chosen (leave-one-out head means, every answer token scored, with
    intervals) and where the top heads look; the MLP logit lens on all solved problems; the ranking of a second
    counterfactual (`second_kind`, path patching only); overlap with other tasks (each chosen on its own selection
    part); `done` is an evaluation of the same spec already made."""
    adapter = lm.adapter
    done = evaluated(lm.model, lm.tokenizer, spec, done)
    task, base = done.task, done.base
    require_solved(int(base.correct_P.sum()), spec)
    kept = solved(task, base)
    sel, conf = problem_split(len(kept), split)
    chosen_on, tested_on = kept.subset(sel), kept.subset(conf)
    main = ranked(adapter, chosen_on, lm.tokenizer, path, metric, k, kind)
    pp, effect, top = main["pp"], main["effect"], main["top_heads"]
    keys = key_heads(effect, threshold)
    chosen = list(dict.fromkeys(top + keys))
    means = head_sums_by_step(adapter, task)
    rand_sets, matched = matched_draws(adapter, top, range(draws), chosen)
    second: Ranked | None = None
    with progress_stage(f"knock-outs: top {k} and {draws} random sets"):
        top_scores, *rand_scores = knockouts(adapter, tested_on, [top, *rand_sets], means)
    randoms_detail = [s.rate(tested_on) for s in rand_scores]
    randoms = [r["value"] for r in randoms_detail]
    rand = torch.tensor(randoms)
    top_rate = top_scores.rate(tested_on)
    conf_text = "the confirmation part of the solved problems"
    claims = [
        *key_head_claims(
            adapter, tested_on, lm.tokenizer, keys, threshold=threshold, path=path, metric=metric, kind=kind
        ),
        top_vs_random_claim(top_scores, rand_scores, k, conf_text),
    ]
    n_heads = adapter.n_layers * adapter.n_heads
    warnings = [w for w in [main["scoring"]["warning"]] if w]
    knock_warning = baseline_warning(f"the knock-outs ({spec.scoring} answer)", top_rate["baseline"], len(tested_on))
    warnings += [knock_warning] if knock_warning else []
    split_record = Split(
        {
            "from": split_from,
            "selection_fraction": split[0],
            "split_seed": split[1],
            "n_selection": len(sel),
            "n_confirmation": len(conf),
            "heads_chosen_on": "the selection part (path patching)",
            "tested_on": "the confirmation part (knock-outs, attention of the top heads)",
        }
    )
    knockout = Knockout(
        k=k,
        heads=[list(h) for h in top],
        scoring=spec.scoring,
        means="per answer step and position, over all the task's problems, each knocked-out problem's own "
        "clean state left out (leave-one-out); a (problem, step) that no other problem shares keeps its own "
        "state, so its heads are not knocked out there (counted in means_without_other_problems)",
        means_without_other_problems=loo_fallbacks(tested_on, means),
        measured_on=conf_text,
        n=len(tested_on),
        accuracy_top_k=top_rate["value"],
        accuracy_top_k_ci=top_rate["ci"],
        random_drawn_from=f"for each top head, one of the same layer and key/value group (else the same layer, else "
        f"the nearest), among the {n_heads - len(chosen)} heads neither in the top {k} nor key heads",
        random_matched=matched,
        random_heads=[[list(h) for h in heads] for heads in rand_sets],
        top_rank_among_random=sum(r <= top_rate["value"] for r in randoms),
        top_rank_p=(1 + sum(r <= top_rate["value"] for r in randoms)) / (draws + 1),
        accuracy_random_k_mean=float(rand.mean()),
        accuracy_random_k_std=float(rand.std()) if draws > 1 else 0.0,
        accuracy_random_k=randoms,
        accuracy_random_k_ci=[r["ci"] for r in randoms_detail],
        accuracy_baseline=top_rate["baseline"],
        base_accuracy=1.0,
    )
    lens = mlp_logit_lens(adapter, kept)
    result = HeadsStudy(
        model=lm.info.get("spec"),
        task=spec.name,
        style=spec.style_name,
        n=len(task),
        n_solved=len(kept),
        layouts=kept.layouts(),  # path patching, knock-outs and attention per layout, pooled by each one's n
        scoring=spec.scoring,
        path_patching_scoring=main["scoring"],
        base_accuracy_all=base.accuracy,
        split=split_record,
        counterfactual=main["counterfactual"],
        counterfactual_kind=main["counterfactual_kind"],
        counterfactual_problems=counterfactual_problems(kept, sel, pp["counterfactual_rows"]),
        n_heads=n_heads,
        threshold=threshold,
        path=pp["path"],
        metric=metric,
        key_heads=[list(h) for h in keys],
        key_head_share=len(keys) / n_heads,
        key_heads_by_metric={m: [list(h) for h in key_heads(effect_of(pp, m), threshold)] for m in METRICS},
        top_heads=[list(h) for h in top],
        relative_logit_change_layer_head=pp["relative_logit_change_layer_head"].tolist(),
        logit_diff_change_layer_head=pp["logit_diff_change_layer_head"].tolist(),
        relative_logit_change_mlp_layer=pp["relative_logit_change_mlp_layer"].tolist(),
        logit_diff_change_mlp_layer=pp["logit_diff_change_mlp_layer"].tolist(),
        clean_logit_diff=float(pp["clean_logit_diff"]),
        answer_steps_n=pp["answer_steps_n"],
        knockout=knockout,
        attention_of_top_heads=last_query_attention(adapter, tested_on, top[: min(k, 5)]),
        attention_measured_on="the confirmation part of the solved problems",
        # one problem's tokens (the confirmation part's first): where each top and key head looks, token by token
        attention_over_tokens=token_attention(adapter, lm.tokenizer, tested_on, list(dict.fromkeys(top + keys))[:16]),
        mlp_logit_lens_layer=None if lens is None else lens.tolist(),
        mlp_logit_lens_measured_on="all solved problems (no head is chosen by it)",
        warnings=warnings,
        overlap=[],
        confirmed_key_heads=[],
        claims=[],
    )
    result["claims"], result["confirmed_key_heads"] = decide(claims)
    if "layouts_patched" in pp:
        result["layouts_patched"] = pp["layouts_patched"]
    if "layouts_not_patched" in pp:
        result["layouts_not_patched"] = pp["layouts_not_patched"]
    if second_kind is not None:
        try:
            second = ranked(adapter, chosen_on, lm.tokenizer, path, metric, k, second_kind)
        except Af1Error as exc:  # e.g. no other operand value keeps a problem's token layout: said, not fatal
            result["second_counterfactual"] = NoSecondCounterfactual(counterfactual_kind=second_kind, error=str(exc))
    if second_kind is not None and second is not None:
        second_overlap = overlap(top, second["top_heads"], adapter.n_heads, k)
        result["second_counterfactual"] = SecondCounterfactual(
            counterfactual=second["counterfactual"],
            counterfactual_kind=second["counterfactual_kind"],
            measured="path patching only, on the same selection part (no knock-outs)",
            top_heads=[list(h) for h in second["top_heads"]],
            key_heads=[list(h) for h in key_heads(second["effect"], threshold)],
            effect_layer_head=second["effect"].tolist(),
            top_k_overlap=second_overlap["top_k_overlap"],
            top_k_overlap_chance=second_overlap["top_k_overlap_chance"],
            top_k_overlap_p=second_overlap["top_k_overlap_p"],
            counterfactual_problems=counterfactual_problems(
                kept, sel, second["pp"]["counterfactual_rows"], prompt=False
            ),
        )
    for other in compare_specs or []:
        try:
            o = evaluated(lm.model, lm.tokenizer, other)
            o_kept = solved(o.task, o.base)
            require_solved(len(o_kept), other)
            o_sel, _ = problem_split(len(o_kept), split)
            o_effect = ranked(adapter, o_kept.subset(o_sel), lm.tokenizer, path, metric, k, kind)["effect"]
        except Af1Error as exc:
            result["overlap"].append(TaskOverlap(task=other.operation, style=other.style, error=str(exc)))
            continue
        shared = overlap(top, top_heads(o_effect, k), adapter.n_heads, k)
        result["overlap"].append(
            TaskOverlap(
                task=other.operation,
                style=other.style,
                n_solved=len(o_kept),
                n_selection=len(o_sel),
                key_heads=[list(h) for h in key_heads(o_effect, threshold)],
                key_heads_jaccard=overlap(keys, key_heads(o_effect, threshold), adapter.n_heads)["jaccard"],
                top_k_overlap=shared["top_k_overlap"],
                top_k_overlap_chance=shared["top_k_overlap_chance"],
                top_k_overlap_p=shared["top_k_overlap_p"],
                k=k,
            )
        )
    return result


@with_config(ConfigDict(extra="forbid"))
class ChosenHeads(TypedDict):
    """The top-k heads by path patching on every solved problem of an evaluation, with what was scored."""

    top_heads: list[tuple[int, int]]
    n_solved: int
    path: str
    scoring: ScoringNote


def choose_heads(lm: LoadedModel, done: Evaluated, k: int, path: str = "wang", metric: str = "relative") -> ChosenHeads:
    """The top-k heads by path patching on all of an evaluation's solved problems (for fine-tuning, which tests
    them on other problems): the heads, what was scored and on how many."""
    kept = solved(done.task, done.base)
    require_solved(len(kept), done.task.spec)
    found = ranked(lm.adapter, kept, lm.tokenizer, path, metric, k)
    return ChosenHeads(top_heads=found["top_heads"], n_solved=len(kept), path=path, scoring=found["scoring"])
