"""Arithmetic heads (SPEC.md §2, Zhang et al. 2024): path patching, key heads, knockout, overlap.

Path patching to the logits: each head's (or MLP's) output at the last position is taken
from the counterfactual run (the operator replaced by a null word or symbol) and only its
direct path into the final residual stream is changed; everything else stays clean. One
clean and one counterfactual forward pass serve every head and every MLP. Activation
patching (the change also flows through later layers) batches many heads per forward.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from af1.errors import Af1Error
from af1.evaluation import Evaluated, Scores, batches, evaluated, forward_last, require_solved, solved
from af1.interventions.heads import head_means, replace_heads
from af1.interventions.sites import FINAL, Site, head_inputs, mlp_output, record
from af1.models.adapter import ModelAdapter, execution_device, weight_of
from af1.stats import constant_baseline, rate
from af1.tasks import NAMES, OPERATIONS, Task, _template

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


def counterfactual(task: Task, tokenizer: Any) -> Counterfactual:
    """The task's prompts with the operator replaced by a null symbol or word that keeps the token layout."""
    style, operation = task.spec.style, task.spec.operation
    if style not in OPERATOR_TEXT:
        raise Af1Error(f"no counterfactual is defined for style '{style}'")
    symbol = all(len(w) == 1 for w in OPERATOR_TEXT[style].values())
    for null in NULL_SYMBOLS if symbol else NULL_WORDS:
        rows, ok = [], True
        for i, p in enumerate(task.problems):
            spans = _operator_spans(p.prompt, style, operation, p.operands)
            offset = len(p.text) - len(p.prompt)
            text = p.text
            for a, b in sorted(spans, reverse=True):
                text = text[: offset + a] + null + text[offset + b :]
            ids = tokenizer(text)["input_ids"]
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
def run_last(adapter: ModelAdapter, ids_BT: torch.Tensor) -> tuple[dict[Site, torch.Tensor], torch.Tensor]:
    """One forward; at the last position every layer's head inputs [B, E] and MLP output [B, D], the final norm's
    input [B, D]; and the last logits [B, V]."""
    sites = [FINAL, *(s for layer in range(adapter.n_layers) for s in (head_inputs(layer), mlp_output(layer)))]
    with record(adapter, sites, last_only=True) as cache:
        logits = forward_last(adapter.model, ids_BT).to(adapter.device)
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
    def read(cls, adapter: ModelAdapter, pair_B2: torch.Tensor) -> AnswerRows:
        """Gathered once per batch, so an offloaded unembedding is brought in once, not per layer."""
        with adapter.onloaded(adapter.lm_head):
            W_U, bias = weight_of(adapter.lm_head), getattr(adapter.lm_head, "bias", None)
            pair = pair_B2.to(W_U.device)
            return cls(W_U[pair], bias[pair] if bias is not None else None)

    def logits(self, adapter: ModelAdapter, final_ZBD: torch.Tensor) -> torch.Tensor:
        """Logits [N, B, 2]: the final norm, then these rows."""
        normed = adapter.final_norm(final_ZBD.to(execution_device(adapter.final_norm)))
        logits = torch.einsum("zbd,brd->zbr", normed.to(self.rows_BRD.device), self.rows_BRD).float()
        return logits if self.bias_BR is None else logits + self.bias_BR


def _direct_effects(
    adapter: ModelAdapter, final_BD: torch.Tensor, deltas_ZBD: torch.Tensor, answer: AnswerRows
) -> tuple[torch.Tensor, torch.Tensor]:
    """For N residual deltas, summed over problems: the relative change of the correct logit and the change of
    (correct - top wrong). The clean reference goes through the same arithmetic, so a zero delta gives zero."""
    deltas_ZBD = deltas_ZBD.to(final_BD.device)
    both = torch.cat([torch.zeros_like(deltas_ZBD[:1]), deltas_ZBD])
    logits = answer.logits(adapter, final_BD[None] + both)
    (c0, w0), (c1, w1) = logits[0].unbind(-1), logits[1:].unbind(-1)
    rel = ((c1 - c0) / c0.abs().clamp(min=1e-6)).sum(-1)
    return rel.cpu(), ((c1 - w1) - (c0 - w0)).sum(-1).cpu()


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


@torch.no_grad()
def path_patching(adapter: ModelAdapter, task: Task, cf: Counterfactual, batch_size: int = 32) -> dict[str, Any]:
    """Direct-path effect of every head and MLP on the last-position logits of the correct answer.

    Returns relative change of the correct logit [layer, head] / [layer] (mean over problems) and
    the change of (correct - clean top wrong) logit difference.
    """
    check_direct_paths(adapter)
    L, H = adapter.n_layers, adapter.n_heads
    rel_heads, diff_heads = torch.zeros(L, H), torch.zeros(L, H)
    rel_mlp, diff_mlp = torch.zeros(L), torch.zeros(L)
    P = len(task)
    for sl in batches(P, batch_size):
        clean, base = run_last(adapter, task.input_ids_PT[sl])
        corrupt, _ = run_last(adapter, cf.input_ids_PT[sl])
        answer = task.answer_ids_P[sl].to(base.device)
        rows = torch.arange(len(answer))
        wrong = base.clone()
        wrong[rows, answer] = -float("inf")
        wrong_id = wrong.argmax(-1)

        unembed = AnswerRows.read(adapter, torch.stack([answer, wrong_id], -1))
        for layer in range(L):
            deltas = head_deltas(adapter, layer, clean[head_inputs(layer)], corrupt[head_inputs(layer)])
            r, g = _direct_effects(adapter, clean[FINAL], deltas, unembed)
            rel_heads[layer] += r
            diff_heads[layer] += g
            dm = (corrupt[mlp_output(layer)] - clean[mlp_output(layer)])[None]
            r, g = _direct_effects(adapter, clean[FINAL], dm, unembed)
            rel_mlp[layer] += r[0]
            diff_mlp[layer] += g[0]
    return {
        "relative_logit_change_layer_head": rel_heads / P,
        "logit_diff_change_layer_head": diff_heads / P,
        "relative_logit_change_mlp_layer": rel_mlp / P,
        "logit_diff_change_mlp_layer": diff_mlp / P,
    }


# --- activation patching and mean ablation of heads ------------------------------------------------


@torch.no_grad()
def knockout_correct(
    adapter: ModelAdapter,
    task: Task,
    heads: list[tuple[int, int]],
    means: dict[int, torch.Tensor],
    batch_size: int = 32,
) -> list[bool]:
    """Per problem: is the first answer token still predicted with the listed heads mean-ablated everywhere."""
    d = adapter.head_dim
    by_layer: dict[int, list[int]] = {}
    for layer, h in heads:
        by_layer.setdefault(layer, []).append(h)

    def ablate(layer: int, hs: list[int]):
        cols = torch.cat([torch.arange(h * d, (h + 1) * d) for h in hs])

        def fn(z: torch.Tensor) -> torch.Tensor:
            z = z.clone()
            z[..., cols] = means[layer][: z.shape[1], cols].to(z.dtype).to(z.device)
            return z

        return fn

    out = []
    with replace_heads(adapter, {layer: ablate(layer, hs) for layer, hs in by_layer.items()}):
        for sl in batches(len(task), batch_size):
            ids = task.input_ids_PT[sl].to(adapter.device)
            out.append(forward_last(adapter.model, ids))
    return Scores.from_logits(torch.cat(out), task.answer_ids_P).correct_P.tolist()


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
    with record(adapter, [head_inputs(layer) for layer in range(adapter.n_layers)]) as cache:
        forward_last(adapter.model, cf.input_ids_PT)
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
            logits = forward_last(adapter.model, ids)
        for row, (hi, p) in enumerate(chunk):
            result[hi, p] = logits[row, task.answer_ids_P[p]]
    return result


# --- where key heads look, logit lens of MLPs, overlap ---------------------------------------------


@torch.no_grad()
def last_query_attention(
    adapter: ModelAdapter, task: Task, heads: list[tuple[int, int]]
) -> dict[str, dict[str, float]]:
    """Share of each head's attention from the last position to operands, operator, context and the rest."""
    from af1.interventions.attention import LayerPlan, attention_plans

    probs: dict[int, torch.Tensor] = {}
    group = adapter.n_heads // adapter.n_kv_heads

    def capture(layer: int):
        def fn(module, q, k, _v):
            k = k.repeat_interleave(group, dim=1) if k.shape[1] != q.shape[1] else k
            scale = getattr(module, "scaling", None) or q.shape[-1] ** -0.5
            probs[layer] = torch.softmax((q[:, :, -1:].float() @ k.float().transpose(-1, -2))[:, :, 0] * scale, -1)

        return fn

    layers = sorted({layer for layer, _ in heads})
    ids = task.input_ids_PT.to(adapter.device)
    with attention_plans(adapter, {layer: LayerPlan(capture=capture(layer)) for layer in layers}):
        adapter.model(input_ids=ids, use_cache=False, logits_to_keep=1)
    roles = list(task.layout)
    n = len(roles)
    groups = {
        "operands": [t for t, r in enumerate(roles) if r in NAMES],
        "operator": [t for t, r in enumerate(roles) if r == "const" and t < n - 1 and t > 0 and roles[t - 1] in NAMES],
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


@torch.no_grad()
def mlp_logit_lens(adapter: ModelAdapter, task: Task) -> torch.Tensor:
    """Per layer: mean over problems of the MLP output at the last position read by the answer's unembedding."""
    cache, _ = run_last(adapter, task.input_ids_PT)
    with adapter.onloaded(adapter.lm_head):
        W_U = weight_of(adapter.lm_head)
        answer_rows = W_U[task.answer_ids_P.to(W_U.device)]  # [P, D]
        return torch.stack(
            [
                (cache[mlp_output(layer)].to(W_U.device) * answer_rows).sum(-1).mean().cpu()
                for layer in range(adapter.n_layers)
            ]
        )


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
    draws: int = 5,
    compare_specs: list[Any] | None = None,
    done: Evaluated | None = None,
) -> dict[str, Any]:
    """Path patching, key heads, knockout of top-k vs random-k, where key heads look, MLP logit lens, overlap;
    `done` is an evaluation of the same spec already made."""
    adapter = lm.adapter
    done = evaluated(lm.model, lm.tokenizer, spec, done)
    task, base = done.task, done.base
    require_solved(int(base.correct_P.sum()), spec)
    kept = solved(task, base)
    cf = counterfactual(kept, lm.tokenizer)
    pp = path_patching(adapter, kept, cf)
    effect = pp["relative_logit_change_layer_head"]
    keys = key_heads(effect, threshold)
    top = top_heads(effect, k)
    means = head_means(adapter, task)
    first_targets = [str(a[0]) for a in kept.answer_tokens]  # knockout scores the first answer token (issue 14)

    def knocked(heads_: list[tuple[int, int]]) -> dict[str, Any]:
        r = rate(knockout_correct(adapter, kept, heads_, means), first_targets)
        return {"accuracy": r["value"], "accuracy_ci": r["ci"], "n": r["n"]}

    randoms_detail = [knocked(random_heads(adapter, k, seed, top)) for seed in range(draws)]
    randoms = [r["accuracy"] for r in randoms_detail]
    rand = torch.tensor(randoms)
    top_knocked = knocked(top)
    n_heads = adapter.n_layers * adapter.n_heads
    result: dict[str, Any] = {
        "model": lm.info.get("spec"),
        "task": spec.operation,
        "style": spec.style,
        "n": len(task),
        "n_solved": len(kept),
        "scoring": spec.scoring,  # of base accuracy and the solved set; patching and knockout read the first token
        "base_accuracy_all": base.accuracy,
        "counterfactual": cf.replacement,
        "n_heads": n_heads,
        "threshold": threshold,
        "key_heads": [list(h) for h in keys],
        "key_head_share": len(keys) / n_heads,
        "top_heads": [list(h) for h in top],
        **pp,
        "knockout": {
            "k": k,
            "heads": [list(h) for h in top],
            "scoring": "first",
            "n": len(kept),
            "accuracy_top_k": top_knocked["accuracy"],
            "accuracy_top_k_ci": top_knocked["accuracy_ci"],
            "accuracy_random_k_mean": float(rand.mean()),
            "accuracy_random_k_std": float(rand.std()) if draws > 1 else 0.0,
            "accuracy_random_k": randoms,
            "accuracy_random_k_ci": [r["accuracy_ci"] for r in randoms_detail],
            "accuracy_baseline": constant_baseline(first_targets),
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
            o_effect = path_patching(adapter, o_kept, counterfactual(o_kept, lm.tokenizer))[
                "relative_logit_change_layer_head"
            ]
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
