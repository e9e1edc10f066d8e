"""Arithmetic heads (SPEC.md §2, Zhang et al. 2024): path patching, key heads, knockout, overlap.

Each sender (a head or an MLP) has its output at the last position taken from the counterfactual
run (the operator replaced by a null word or symbol); the receiver is the last position's logits.
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

import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from af1.context import forward_last, suffix_start
from af1.errors import Af1Error
from af1.evaluation import Evaluated, Scores, batches, evaluated, require_solved, solved
from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.heads import head_means, replace_heads
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
from af1.models.adapter import ModelAdapter, execution_device, weight_of
from af1.progress import progress
from af1.stats import constant_baseline
from af1.tasks import NAMES, OPERATIONS, Task, _template

NOT_OPERANDS = ("context", "const", "bos")  # roles that are not an operand (or a task file's slot)

# Where the operation is named in each style, and the null replacements tried (same token count).
OPERATOR_TEXT = {
    "original": {"+": "+", "-": "-", "*": "*"},
    "calculate": {"+": "+", "-": "-", "*": "*"},
    "code": {"+": "+", "-": "-"},
    "verbal": {"+": "sum", "-": "difference"},
    "question": {"+": "sum", "-": "difference"},
    "instruction": {"+": "add", "-": "subtract"},
    "word": {"+": "Together", "-": "gave"},
}
NULL_SYMBOLS = ("@", "#", "&", "~", "|", "^")
NULL_WORDS = ("nothing", "thing", "stuff", "none", "null", "blank")


@dataclass
class Counterfactual:
    input_ids_PT: torch.Tensor
    replacement: str
    operator_positions: list[int]


def _operator_spans(prompt: str, style: str, operation: str, operands: tuple[int, ...]) -> list[tuple[int, int]]:
    """Character spans of the operator text inside the problem's own prompt (not the few-shot prefix)."""
    op = OPERATIONS[operation]
    template = _template(op, style)
    spans, rendered = [], ""
    for literal, name, _, _ in string.Formatter().parse(template):
        for o in set(op.operators):
            word = OPERATOR_TEXT[style][o]
            start = 0
            while (k := literal.find(word, start)) >= 0:
                spans.append((len(rendered) + k, len(rendered) + k + len(word)))
                start = k + len(word)
        rendered += literal
        if name:
            rendered += str(operands[NAMES.index(name)])
    return spans


def slot_counterfactual(task: Task, tokenizer: Any) -> Counterfactual:
    """A task file's prompts with the slot it names replaced, everywhere it stands, by its null value, or else by
    another of the slot's values that keeps the token layout, changing only that slot's tokens. The value is drawn
    per problem from the file's values, seeded by the task's seed and the prompt alone (so a problem gets the same
    counterfactual in any sample or layout group); in a `distinct` task it is none of the problem's other slot
    values."""
    from af1.taskfile import read_task_file, slot_values

    assert task.spec.file is not None
    described = read_task_file(task.spec.file)
    named = described.counterfactual
    if named is None:
        raise Af1Error(
            f"task file {task.spec.file} names no counterfactual slot (counterfactual: {{slot: ..., null_value: ...}})"
        )
    values = sorted(set(slot_values(task.spec.file, described, named.slot)))
    bos = [task.bos[0]] if task.bos is not None else []
    rows, positions = [], set()
    for i, p in enumerate(task.problems):
        spans = sorted(((a, b) for n, a, b in p.spans if n == named.slot), reverse=True)  # right to left
        if not spans:
            raise Af1Error(f"problem {p.prompt!r} has no slot '{named.slot}'")
        own = p.prompt[spans[0][0] : spans[0][1]]
        taken = set(p.operands) if described.distinct else {own}  # a distinct task's other slots stay distinct
        candidates = [named.null_value] if named.null_value is not None else [v for v in values if v not in taken]
        random.Random(f"{task.spec.seed}:{p.prompt}").shuffle(candidates)
        offset = len(p.text) - len(p.prompt)
        found, changed = None, []
        for value in candidates:
            text = p.text
            for a, b in spans:
                text = text[: offset + a] + value + text[offset + b :]
            ids = bos + tokenizer(text)["input_ids"]
            if len(ids) != task.n_positions:
                continue
            changed = (torch.tensor(ids) != task.input_ids_PT[i]).nonzero().flatten().tolist()
            if all(task.layout[t] == named.slot for t in changed):  # nothing but the slot's tokens moved
                found = ids
                break
        if found is None:
            raise Af1Error(
                f"no value of slot '{named.slot}' keeps the token layout of {p.prompt!r} "
                + ("(its null value has another token length)" if named.null_value is not None else "")
            )
        rows.append(found)
        positions |= set(changed)
    replacement = named.null_value if named.null_value is not None else f"another value of {named.slot}"
    return Counterfactual(torch.tensor(rows), replacement, sorted(positions))


def counterfactual(task: Task, tokenizer: Any) -> Counterfactual:
    """The task's prompts with the operator replaced by a null symbol or word that keeps the token layout (for a
    task file: its named slot replaced, `slot_counterfactual`)."""
    if task.spec.file is not None:
        return slot_counterfactual(task, tokenizer)
    style, operation = task.spec.style, task.spec.operation
    if style not in OPERATOR_TEXT:
        raise Af1Error(f"no counterfactual is defined for style '{style}'")
    symbol = all(len(w) == 1 for w in OPERATOR_TEXT[style].values())
    bos = [task.bos[0]] if task.bos is not None else []  # the prompts run with the BOS af1 prepended: so do these
    for null in NULL_SYMBOLS if symbol else NULL_WORDS:
        rows, ok = [], True
        for i, p in enumerate(task.problems):
            spans = _operator_spans(p.prompt, style, operation, p.operands)
            offset = len(p.text) - len(p.prompt)
            text = p.text
            for a, b in sorted(spans, reverse=True):
                text = text[: offset + a] + null + text[offset + b :]
            ids = bos + tokenizer(text)["input_ids"]
            if len(ids) != task.n_positions:
                ok = False
                break
            rows.append(ids)
            if i == 0:
                changed = (torch.tensor(ids) != task.input_ids_PT[0]).nonzero().flatten().tolist()
        if ok:
            cf = torch.tensor(rows)
            diff = (cf != task.input_ids_PT).any(0).nonzero().flatten().tolist()
            if diff == changed and len(diff) > 0:
                return Counterfactual(cf, null, diff)
    raise Af1Error(f"no null replacement of the operator keeps the token layout of {operation} ({style})")


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


def o_proj_weight(adapter: ModelAdapter, layer: int) -> torch.Tensor:
    """[D, H*d]: the output projection as a matrix acting on the concatenated heads (GPT-2's Conv1D transposed)."""
    proj = adapter.o_proj(layer)
    return weight_of(proj).T if adapter.family.conv1d else weight_of(proj)


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
        logits = torch.einsum("zbd,brd->zbr", normed.to(self.rows_BRD.device), self.rows_BRD).float()
        logits = logits if self.bias_BR is None else logits + self.bias_BR
        cap = getattr(adapter.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits


def _direct_effects(
    adapter: ModelAdapter, final_BD: torch.Tensor, deltas_ZBD: torch.Tensor, answer: AnswerRows
) -> tuple[torch.Tensor, torch.Tensor]:
    """For N residual deltas, summed over problems: the relative change of the correct logit and the change of
    (correct - top wrong). The clean reference goes through the same arithmetic, so a zero delta gives zero."""
    deltas_ZBD = deltas_ZBD.to(final_BD.device)
    both = torch.cat([torch.zeros_like(deltas_ZBD[:1]), deltas_ZBD])
    return logit_changes(answer.logits(adapter, final_BD[None] + both))


def logit_changes(logits_ZBR: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0 the clean reference, rows 1.. patched ([Z, B, correct/wrong]): per patched row, summed over problems,
    the relative change of the correct logit and the change of (correct - top wrong)."""
    (c0, w0), (c1, w1) = logits_ZBR[0].unbind(-1), logits_ZBR[1:].unbind(-1)
    rel = ((c1 - c0) / c0.abs().clamp(min=1e-6)).sum(-1)
    return rel.cpu(), ((c1 - w1) - (c0 - w0)).sum(-1).cpu()


def _effects(
    rel_LH: torch.Tensor, diff_LH: torch.Tensor, rel_L: torch.Tensor, diff_L: torch.Tensor, clean_diff: float, P: int
) -> dict[str, Any]:
    """Sums over problems as the per-problem means path patching reports."""
    return {
        "relative_logit_change_layer_head": rel_LH / P,
        "logit_diff_change_layer_head": diff_LH / P,
        "relative_logit_change_mlp_layer": rel_L / P,
        "logit_diff_change_mlp_layer": diff_L / P,
        "clean_logit_diff": clean_diff / P,
    }


def head_deltas(adapter: ModelAdapter, layer: int, z_clean_BE: torch.Tensor, z_new_BE: torch.Tensor) -> torch.Tensor:
    """[H, B, D]: what each head's change of output adds to the residual stream through o_proj."""
    H, d = adapter.n_heads, adapter.head_dim
    with adapter.onloaded(adapter.o_proj(layer)):
        W = o_proj_weight(adapter, layer)
        return torch.einsum("bhe,dhe->hbd", (z_new_BE - z_clean_BE).to(W.device).view(-1, H, d), W.view(-1, H, d))


def check_direct_paths(adapter: ModelAdapter) -> None:
    if adapter.family.post_norms:
        raise Af1Error(
            f"{adapter.family.name} normalises attention and MLP outputs before the residual stream: "
            "their direct paths to the logits are not linear, so path patching is not offered for it"
        )


PATHS = ("wang", "direct", "total")


def path_patching(
    adapter: ModelAdapter, task: Task, cf: Counterfactual, path: str = "wang", batch_size: int = 32
) -> dict[str, Any]:
    """The effect of every head and MLP on the last-position logits, by one of `PATHS`: per sender the mean
    relative change of the correct logit and the mean change of (correct - clean top wrong), with the clean
    logit difference they are measured against."""
    if path == "direct":
        return {**direct_path_patching(adapter, task, cf, batch_size), "path": path}
    if path not in PATHS:
        raise Af1Error(f"unknown path '{path}': one of {', '.join(PATHS)}")
    if path == "total" and not adapter.family.uses_attention_interface:
        raise Af1Error(
            f"--path total reads earlier keys/values through the attention interface, which the "
            f"{adapter.family.name} family does not use: try --path wang"
        )
    return {**downstream_path_patching(adapter, task, cf, path == "total", batch_size), "path": path}


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
    adapter: ModelAdapter, task: Task, cf: Counterfactual, recompute_attention: bool, batch_size: int = 32
) -> dict[str, Any]:
    """Wang's path patching (heads frozen, MLPs recompute) or, with recompute_attention, activation patching
    at the last position. Per layer one last-token pass with rows [clean, H heads, the MLP] x problems."""
    from af1.fast import _last_token_inputs, capture_problem_kv

    L, H = adapter.n_layers, adapter.n_heads
    rel_heads, diff_heads = torch.zeros(L, H), torch.zeros(L, H)
    rel_mlp, diff_mlp = torch.zeros(L), torch.zeros(L)
    clean_diff = 0.0
    P = len(task)
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
        inputs = _last_token_inputs(adapter, ids.repeat(Z, 1))
        problem_of_row = torch.arange(B).repeat(Z)
        for layer in range(L):
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
            rel, diff = logit_changes(logits)
            rel_heads[layer] += rel[:H]
            diff_heads[layer] += diff[:H]
            rel_mlp[layer] += rel[H]
            diff_mlp[layer] += diff[H]
            if layer == 0:  # the clean row is the same at every layer
                clean_diff += float((logits[0, :, 0] - logits[0, :, 1]).sum())
    return _effects(rel_heads, diff_heads, rel_mlp, diff_mlp, clean_diff, P)


@torch.no_grad()
def direct_path_patching(adapter: ModelAdapter, task: Task, cf: Counterfactual, batch_size: int = 32) -> dict[str, Any]:
    """Direct-path effect of every head and MLP on the last-position logits of the correct answer.

    Returns relative change of the correct logit [layer, head] / [layer] (mean over problems) and
    the change of (correct - clean top wrong) logit difference.
    """
    check_direct_paths(adapter)
    L, H = adapter.n_layers, adapter.n_heads
    rel_heads, diff_heads = torch.zeros(L, H), torch.zeros(L, H)
    rel_mlp, diff_mlp = torch.zeros(L), torch.zeros(L)
    clean_diff = 0.0
    P = len(task)
    for sl in batches(P, batch_size):
        clean, base = run_last(adapter, task.input_ids_PT[sl], task.context_len)
        corrupt, _ = run_last(adapter, cf.input_ids_PT[sl], task.context_len)
        unembed = AnswerRows.of(adapter, base, task.answer_ids_P[sl].to(base.device))
        c0, w0 = unembed.logits(adapter, clean[FINAL][None])[0].unbind(-1)
        clean_diff += float((c0 - w0).sum())
        for layer in range(L):
            deltas = head_deltas(adapter, layer, clean[head_inputs(layer)], corrupt[head_inputs(layer)])
            r, g = _direct_effects(adapter, clean[FINAL], deltas, unembed)
            rel_heads[layer] += r
            diff_heads[layer] += g
            dm = (corrupt[mlp_output(layer)] - clean[mlp_output(layer)])[None]
            r, g = _direct_effects(adapter, clean[FINAL], dm, unembed)
            rel_mlp[layer] += r[0]
            diff_mlp[layer] += g[0]
    return _effects(rel_heads, diff_heads, rel_mlp, diff_mlp, clean_diff, P)


# --- activation patching and mean ablation of heads ------------------------------------------------


@torch.no_grad()
def mean_ablated_logits(
    adapter: ModelAdapter,
    task: Task,
    heads: list[tuple[int, int]],
    means: dict[int, torch.Tensor],
    batch_size: int = 32,
) -> torch.Tensor:
    """Last-position logits [P, V] with the listed heads mean-ablated at every position (means [T, E] per layer).
    At the shared context's positions a head's mean is its own output (the same in every problem): only the suffix
    is rewritten, and it runs on the context's cache."""
    d = adapter.head_dim
    c = suffix_start(adapter.model, task.input_ids_PT, task.context_len)
    by_layer: dict[int, list[int]] = {}
    for layer, h in heads:
        by_layer.setdefault(layer, []).append(h)

    def ablate(layer: int, hs: list[int]):
        cols = torch.cat([torch.arange(h * d, (h + 1) * d) for h in hs])

        def fn(z: torch.Tensor) -> torch.Tensor:
            z = z.clone()
            z[..., cols] = means[layer][c:, cols].to(z.dtype).to(z.device)
            return z

        return fn

    out = []
    with replace_heads(adapter, {layer: ablate(layer, hs) for layer, hs in by_layer.items()}):
        for sl in batches(len(task), batch_size):
            out.append(forward_last(adapter.model, task.input_ids_PT[sl], task.context_len))
    return torch.cat(out)


def knockout_correct(
    adapter: ModelAdapter, task: Task, heads: list[tuple[int, int]], means: dict[int, torch.Tensor]
) -> list[bool]:
    """Per problem: is the first answer token still predicted with the listed heads mean-ablated everywhere."""
    return Scores.from_logits(mean_ablated_logits(adapter, task, heads, means), task.answer_ids_P).correct_P.tolist()


def step_means(adapter: ModelAdapter, task: Task) -> dict[Any, dict[int, torch.Tensor]]:
    """Head means per token layout and answer step (teacher forced) over all the task's problems, by `part_key`:
    what knockout ablates to."""
    return {step.part_key: head_means(adapter, step) for step in task.steps()}


def knockout_scores(
    adapter: ModelAdapter, kept: Task, heads: list[tuple[int, int]], means: dict[Any, dict[int, torch.Tensor]]
) -> Scores:
    """Every answer step of the solved problems with the listed heads mean-ablated (full-answer scoring)."""
    return Scores.from_steps(
        kept, [mean_ablated_logits(adapter, step, heads, means[step.part_key]) for step in kept.steps()]
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


def layout_path_patching(
    adapter: ModelAdapter, kept: Task, tokenizer: Any, path: str
) -> tuple[dict[str, Any], Counterfactual]:
    """Path patching per token layout (each with its own counterfactual), pooled over layouts by their n; a layout
    without a counterfactual (too few solved problems) is left out and said so; the first layout's counterfactual
    describes them."""
    runs, skipped = [], []
    for _, group in per_layout(kept):
        try:  # a layout where no value of the slot (or its null value) keeps the token layout has none
            runs.append((group, counterfactual(group, tokenizer)))
        except Af1Error as exc:
            if not kept.groups:
                raise
            skipped.append({"layout": group.layout_id, "n": len(group), "reason": str(exc)})
    if not runs:
        raise Af1Error(f"no token layout has a counterfactual: {skipped[0]['reason']}")
    n = sum(len(group) for group, _ in runs)
    result = pooled([(len(group) / n, path_patching(adapter, group, cf, path)) for group, cf in runs])
    if kept.groups:
        result["layouts_patched"] = [{"layout": g.layout_id, "n": len(g)} for g, _ in runs]
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
    adapter: ModelAdapter, task: Task, heads: list[tuple[int, int]]
) -> dict[str, dict[str, float]]:
    """Share of each head's attention from the last position to operands, operator (a task file: slots, the token
    after a slot), context, the last position itself and the rest."""
    from af1.interventions.attention import LayerPlan, attention_plans

    probs: dict[int, torch.Tensor] = {}
    group = adapter.n_heads // adapter.n_kv_heads

    def capture(layer: int):
        def fn(module, q, k, _v):
            k = k.repeat_interleave(group, dim=1) if k.shape[1] != q.shape[1] else k
            scale = getattr(module, "scaling", None) or q.shape[-1] ** -0.5
            probs[layer] = torch.softmax((q[:, :, -1:].float() @ k.float().transpose(-1, -2))[:, :, 0] * scale, -1)

        return fn

    if task.groups:
        return pooled([(w, last_query_attention(adapter, group, heads)) for w, group in per_layout(task)])
    layers = sorted({layer for layer, _ in heads})
    ids = task.input_ids_PT.to(adapter.device)
    with attention_plans(adapter, {layer: LayerPlan(capture=capture(layer)) for layer in layers}):
        forward_last(adapter.model, ids, task.context_len)
    roles = list(task.layout)
    n = len(roles)
    file = task.spec.file is not None  # a task file has slots, and the token after one, not operands and operators
    groups = {
        # the last position is its own group even when it spells a slot (induction)
        "slots" if file else "operands": [t for t, r in enumerate(roles) if r not in NOT_OPERANDS and t < n - 1],
        "after a slot" if file else "operator": [
            t for t, r in enumerate(roles) if r == "const" and t < n - 1 and t > 0 and roles[t - 1] not in NOT_OPERANDS
        ],
        "context": [t for t, r in enumerate(roles) if r == "context"],
    }
    groups["last"] = [n - 1]
    named = {t for g in groups.values() for t in g}
    groups["other"] = [t for t in range(n) if t not in named]
    out = {}
    for layer, h in heads:
        p = probs[layer][:, h].mean(0).cpu()
        out[f"{layer}.{h}"] = {g: float(p[idx].sum()) for g, idx in groups.items()}
    return out


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
def mlp_logit_lens(adapter: ModelAdapter, task: Task) -> torch.Tensor | None:
    """Per layer: mean over problems of what the MLP's output at the last position adds to the correct answer's
    logit, read through the final norm with its scale frozen at the final residual (`norm_read`) and the
    unembedding. None for families whose MLP output is normalised again before the residual sum (post-norms)."""
    if adapter.family.post_norms:
        return None
    if task.groups:
        return pooled([(w, mlp_logit_lens(adapter, group)) for w, group in per_layout(task)])
    cache, _ = run_last(adapter, task.input_ids_PT, task.context_len)
    final = cache[FINAL].to(execution_device(adapter.final_norm))
    with adapter.onloaded(adapter.lm_head):
        W_U = weight_of(adapter.lm_head)
        answer_rows = W_U[task.answer_ids_P.to(W_U.device)]  # [P, D]
        out = []
        for layer in range(adapter.n_layers):
            read = norm_read(adapter.final_norm, final, cache[mlp_output(layer)].to(final.device, final.dtype))
            out.append((read.to(W_U.device) * answer_rows).sum(-1).mean().cpu())
        return torch.stack(out)


METRICS = ("relative", "logit_diff")


def effect_of(pp: dict[str, Any], metric: str) -> torch.Tensor:
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


def overlap(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], k: int | None = None) -> dict[str, float | None]:
    """Jaccard of two head sets (None when both are empty) and the overlap of their top-k."""
    sa, sb = set(map(tuple, a)), set(map(tuple, b))
    jac = len(sa & sb) / len(sa | sb) if sa | sb else None
    k = k or min(len(a), len(b))
    top = len(set(map(tuple, a[:k])) & set(map(tuple, b[:k]))) / k if k else 1.0
    return {"jaccard": jac, "top_k_overlap": top, "k": k}


def random_heads(
    adapter: ModelAdapter, k: int, seed: int, exclude: list[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    skip = set(exclude or [])
    pool = [(layer, h) for layer in range(adapter.n_layers) for h in range(adapter.n_heads) if (layer, h) not in skip]
    return random.Random(seed).sample(pool, k)


def top_heads(effect_LH: torch.Tensor, k: int) -> list[tuple[int, int]]:
    """The k heads with the most negative effect."""
    order = effect_LH.flatten().argsort()[:k].tolist()
    H = effect_LH.shape[1]
    return [(i // H, i % H) for i in order]


def study(
    lm: Any,
    spec: Any,
    threshold: float = -0.05,
    k: int = 10,
    draws: int = 10,
    compare_specs: list[Any] | None = None,
    done: Evaluated | None = None,
    path: str = "wang",
    metric: str = "relative",
) -> dict[str, Any]:
    """Path patching (by `path`), key heads (by `metric`, both metrics kept), knockout of the top k against `draws`
    random sets of k (every answer token scored, with intervals), where the top heads look, the MLP logit lens,
    overlap with other tasks; `done` is an evaluation of the same spec already made."""
    adapter = lm.adapter
    done = evaluated(lm.model, lm.tokenizer, spec, done)
    task, base = done.task, done.base
    require_solved(int(base.correct_P.sum()), spec)
    kept = solved(task, base)
    pp, cf = layout_path_patching(adapter, kept, lm.tokenizer, path)
    effect = effect_of(pp, metric)
    keys = key_heads(effect, threshold)
    top = top_heads(effect, k)
    means = step_means(adapter, task)
    targets = kept.targets()

    def knocked(heads_: list[tuple[int, int]]) -> dict[str, Any]:
        r = knockout_scores(adapter, kept, heads_, means).rate(kept)
        return {"accuracy": r["value"], "accuracy_ci": r["ci"], "n": r["n"]}

    randoms_detail = [
        knocked(random_heads(adapter, k, seed, top)) for seed in progress(range(draws), "random knock-outs")
    ]
    randoms = [r["accuracy"] for r in randoms_detail]
    rand = torch.tensor(randoms)
    top_knocked = knocked(top)
    n_heads = adapter.n_layers * adapter.n_heads
    result: dict[str, Any] = {
        "model": lm.info.get("spec"),
        "task": spec.name,
        "style": spec.style_name,
        "n": len(task),
        "n_solved": len(kept),
        "layouts": kept.layouts(),  # path patching, knock-outs and attention per layout, pooled by each one's n
        "scoring": spec.scoring,
        "base_accuracy_all": base.accuracy,
        "counterfactual": cf.replacement,
        "n_heads": n_heads,
        "threshold": threshold,
        "metric": metric,
        "key_heads": [list(h) for h in keys],
        "key_head_share": len(keys) / n_heads,
        "key_heads_by_metric": {m: [list(h) for h in key_heads(effect_of(pp, m), threshold)] for m in METRICS},
        "top_heads": [list(h) for h in top],
        **pp,
        "knockout": {
            "k": k,
            "heads": [list(h) for h in top],
            "scoring": spec.scoring,
            "means": "per answer step and position, over all the task's problems",
            "n": len(kept),
            "accuracy_top_k": top_knocked["accuracy"],
            "accuracy_top_k_ci": top_knocked["accuracy_ci"],
            "accuracy_random_k_mean": float(rand.mean()),
            "accuracy_random_k_std": float(rand.std()) if draws > 1 else 0.0,
            "accuracy_random_k": randoms,
            "accuracy_random_k_ci": [r["accuracy_ci"] for r in randoms_detail],
            "accuracy_baseline": constant_baseline(targets),
            "base_accuracy": 1.0,
        },
        "attention_of_top_heads": last_query_attention(adapter, kept, top[: min(k, 5)]),
        "mlp_logit_lens_layer": mlp_logit_lens(adapter, kept),
    }
    overlaps = []
    for other in compare_specs or []:
        try:
            o = evaluated(lm.model, lm.tokenizer, other)
            o_kept = solved(o.task, o.base)
            require_solved(len(o_kept), other)
            o_effect = effect_of(layout_path_patching(adapter, o_kept, lm.tokenizer, path)[0], metric)
        except Af1Error as exc:
            overlaps.append({"task": other.operation, "style": other.style, "error": str(exc)})
            continue
        overlaps.append(
            {
                "task": other.operation,
                "style": other.style,
                "n_solved": len(o_kept),
                "key_heads": [list(h) for h in key_heads(o_effect, threshold)],
                "key_heads_jaccard": overlap(keys, key_heads(o_effect, threshold))["jaccard"],
                **{f"top_{k}_overlap": overlap(top, top_heads(o_effect, k), k)["top_k_overlap"]},
            }
        )
    result["overlap"] = overlaps
    return result
