"""Capture of head and MLP outputs at the last position, and the arithmetic of their effects on the answer's logits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.interventions.sites import FINAL, Site, head_inputs, mlp_output, record
from af1.models.adapter import ModelAdapter, execution_device, weight_of
from af1.models.forward import forward_last
from af1.tasks.task import Task

if TYPE_CHECKING:
    pass


@torch.no_grad()
def run_last(
    adapter: ModelAdapter, ids_BT: torch.Tensor, context_len: int = 0
) -> tuple[dict[Site, torch.Tensor], torch.Tensor]:
    """One forward (the shared context once): at the last position every layer's head inputs [B, E] and MLP output [B,
    D], the final norm's input [B, D], and the last logits [B, V]."""
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
    def of(
        cls,
        adapter: ModelAdapter,
        clean_logits_BV: torch.Tensor,
        answer_B: torch.Tensor,
        contrast_B: torch.Tensor | None = None,
    ) -> AnswerRows:
        """The rows of each problem's correct token and of the token it is contrasted with: the counterfactual's
        answer token where given, else the clean run's best wrong token."""
        if contrast_B is None:
            wrong = clean_logits_BV.clone()
            wrong[torch.arange(len(answer_B)), answer_B] = -float("inf")
            contrast_B = wrong.argmax(-1)
        return cls.read(adapter, torch.stack([answer_B, contrast_B.to(answer_B.device)], -1))

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


def direct_effects(
    adapter: ModelAdapter, final_BD: torch.Tensor, deltas_ZBD: torch.Tensor, answer: AnswerRows, weight_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For N residual deltas, per problem ([N, B], weighted): the relative change of the correct logit and the change
    of (correct - top wrong). The clean reference goes through the same arithmetic, so a zero delta gives zero."""
    deltas_ZBD = deltas_ZBD.to(final_BD.device)
    both = torch.cat([torch.zeros_like(deltas_ZBD[:1]), deltas_ZBD])
    return logit_change_rows(answer.logits(adapter, final_BD[None] + both), weight_B)


def counterfactual_gap(
    adapter: ModelAdapter, unembed: AnswerRows, clean_BD: torch.Tensor, corrupt_BD: torch.Tensor, weight_B: torch.Tensor
) -> torch.Tensor:
    """[B]: how far the counterfactual run moves each problem's logit difference (its final state against the
    clean one, through the same arithmetic), weighted."""
    both = unembed.logits(adapter, torch.stack([clean_BD, corrupt_BD.to(clean_BD.device)]))
    ld_ZB = both[..., 0] - both[..., 1]
    return ((ld_ZB[1] - ld_ZB[0]) * weight_B.to(ld_ZB.device)).cpu()


def logit_change_rows(
    logits_ZBR: torch.Tensor, weight_B: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0 clean, rows 1.. patched ([Z, B, correct/wrong]): per patched row and problem [Z-1, B] (weighted where
    given) the relative change of the correct logit and the change of (correct - clean top wrong)."""
    (c0, w0), (c1, w1) = logits_ZBR[0].unbind(-1), logits_ZBR[1:].unbind(-1)
    w = torch.ones_like(c0) if weight_B is None else weight_B.to(c0.device, c0.dtype)
    rel = (c1 - c0) / c0.abs().clamp(min=1e-6) * w
    return rel.cpu(), (((c1 - w1) - (c0 - w0)) * w).cpu()


class Effects(TypedDict):
    """Per sender the mean path-patching effects ([layer, head]; [layer] for MLPs), the clean logit difference, and the
    counterfactual run's change of it (`counterfactual_gap`, where it contrasts that answer)."""

    relative_logit_change_layer_head: torch.Tensor
    logit_diff_change_layer_head: torch.Tensor
    relative_logit_change_mlp_layer: torch.Tensor
    logit_diff_change_mlp_layer: torch.Tensor
    clean_logit_diff: float
    counterfactual_gap: float


class ProblemEffects(Effects):
    """The effects and each problem's ([P, L, H]; its mean over answer steps): what key heads are confirmed with."""

    relative_logit_change_problem_layer_head: torch.Tensor
    logit_diff_change_problem_layer_head: torch.Tensor
    counterfactual_gap_problem: torch.Tensor  # [P]


# what the logit difference is taken against: the counterfactual's answer (the share metric), or the clean top wrong
CONTRASTS = {True: "the counterfactual's answer token", False: "the clean run's top wrong token"}


@dataclass
class EffectSums:
    """Path-patching effects of the heads per weighted problem row ([P, L, H]; NaN in layers not patched) and of
    the MLPs summed over them, of one or several answer steps."""

    rel_PLH: torch.Tensor
    diff_PLH: torch.Tensor
    rel_L: torch.Tensor
    diff_L: torch.Tensor
    gap_P: torch.Tensor  # per problem row, the counterfactual run's change of the logit difference (weighted)
    clean_diff: float = 0.0

    @classmethod
    def zeros(cls, P: int, L: int, H: int, layers: Sequence[int] | None = None) -> EffectSums:
        """Zeros in the patched layers (all, or `layers`), NaN in the others."""
        heads, mlps = torch.zeros(P, L, H), torch.zeros(L)
        if layers is not None:
            unpatched = [layer for layer in range(L) if layer not in layers]
            heads[:, unpatched], mlps[unpatched] = float("nan"), float("nan")
        return cls(heads, heads.clone(), mlps, mlps.clone(), torch.zeros(P))

    def add_rows(self, rows_P: torch.Tensor, other: EffectSums) -> None:
        """Add an answer step's sums, whose problem rows are `rows_P` of these."""
        self.rel_PLH[rows_P] += other.rel_PLH
        self.diff_PLH[rows_P] += other.diff_PLH
        self.rel_L += other.rel_L
        self.diff_L += other.diff_L
        self.gap_P[rows_P] += other.gap_P
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
            counterfactual_gap=float(self.gap_P.sum()) / P,
            relative_logit_change_problem_layer_head=self.rel_PLH,
            logit_diff_change_problem_layer_head=self.diff_PLH,
            counterfactual_gap_problem=self.gap_P,
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
    """The answer steps path patching, attention and the lens score (not the end-of-answer step), each row weighted 1 /
    its problem's scored steps so that each problem counts once."""
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
