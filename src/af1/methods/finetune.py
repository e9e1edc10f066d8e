"""Precise fine-tuning (docs/methods.md §2): train only chosen heads' slices of W_Q, W_K, W_V, W_O.

Gradients outside the slices are zeroed by hooks and the optimiser is Adam without weight
decay, so every frozen entry keeps its exact value (checked after every run, with NaNs).
With grouped-query attention a query head shares its key/value head with its siblings: the
shared K/V rows of every chosen head's group are trained (stated in every result). Baselines:
full fine-tuning and as many random heads, with the same data and steps. Every answer token
is trained and scored; each variant's learning rate is chosen on a validation split and the
chosen one is run with several seeds, reported on held-out problems with their spread.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field
from safetensors.torch import load_file, save_file
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import Claim, adjust, mean_interval, paired_greater
from af1.errors import Af1Error
from af1.interventions.heads import matched_draws
from af1.models.adapter import ModelAdapter, weight_of
from af1.progress import stage
from af1.stats import mean_std
from af1.tasks.evaluation import batches, evaluate
from af1.tasks.task import PAD, Task

GQA_CHOICE = "the key/value rows of each chosen query head's KV group are trained (shared with its sibling heads)"
PROJECTIONS = {"q": ("q_proj",), "k": ("k_proj",), "v": ("v_proj",)}


class FinetuneConfig(BaseModel):
    steps: int = Field(default=200, ge=1)
    lr: float = Field(default=1e-4, gt=0)
    batch_size: int = Field(default=16, ge=1)
    seed: int = 0


def answer_batch(task: Task, index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts followed by what scores them [B, L] (the whole answer, then the token that ends it where the task
    checks the end, so training sees where an answer stops as evaluation does) and, aligned with the logits, the
    label each position must predict [B, L] (-100 where none: the prompt, padding). Padding comes after each row, so
    causality ignores it; rows of a task of several token layouts keep their own lengths."""
    targets = task.scored_tokens
    rows = [[t for t in task.input_ids_PT[i].tolist() if t != PAD] + list(targets[i]) for i in index]
    L = max(map(len, rows))
    ids = torch.zeros(len(index), L, dtype=torch.long)
    labels = torch.full((len(index), L), -100, dtype=torch.long)
    for row, (i, tokens) in enumerate(zip(index, rows, strict=True)):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        start = len(tokens) - len(targets[i]) - 1  # the last prompt position predicts answer token 0
        labels[row, start : len(tokens) - 1] = torch.tensor(targets[i], dtype=torch.long)
    return ids, labels


def head_slices(adapter: ModelAdapter, heads: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Boolean masks over the attention parameters that belong to the chosen heads."""
    if (reason := adapter.no_head_slices()) is not None:
        raise Af1Error(f"precise fine-tuning does not support {reason}")
    d, group = adapter.head_dim, adapter.n_heads // adapter.n_kv_heads
    masks: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in adapter.model.named_parameters()}
    for layer, h in heads:
        if not (0 <= layer < adapter.n_layers and 0 <= h < adapter.n_heads):
            raise Af1Error(f"head ({layer}, {h}) is out of range: {adapter.n_layers} layers x {adapter.n_heads} heads")
        attn = adapter.attention(layer)
        for proj, rows in (("q_proj", h), ("k_proj", h // group), ("v_proj", h // group)):
            for p in getattr(attn, proj).parameters():
                m = masks.setdefault(names[id(p)], torch.zeros_like(p, dtype=torch.bool))
                m[rows * d : (rows + 1) * d] = True
        o = adapter.o_proj(layer)
        w = weight_of(o)
        m = masks.setdefault(names[id(w)], torch.zeros_like(w, dtype=torch.bool))
        m[:, h * d : (h + 1) * d] = True
    return masks


def check_disjoint(train: Task, evaluation: Task) -> None:
    overlap = {p.prompt for p in train.problems} & {p.prompt for p in evaluation.problems}
    if overlap:
        raise Af1Error(f"{len(overlap)} training problems are also evaluation problems (e.g. {sorted(overlap)[0]!r})")


@dataclass
class TrainResult:
    losses: list[float]
    trained_parameters: int


def train(
    adapter: ModelAdapter, task: Task, config: FinetuneConfig, masks: dict[str, torch.Tensor] | None
) -> TrainResult:
    """Cross-entropy on every answer token (teacher forced); masks None trains every parameter."""
    if adapter.offloaded():
        raise Af1Error("fine-tuning needs every weight in device memory: use a device map without CPU/disk offload")
    model = adapter.model
    named = dict(model.named_parameters())
    params = [named[n] for n in masks] if masks is not None else list(named.values())
    hooks = []
    for p in params:
        p.requires_grad_(True)
    if masks is not None:
        for n, m in masks.items():
            hooks.append(named[n].register_hook(lambda g, m=m: g * m.to(g.dtype)))
    optimiser = torch.optim.Adam(params, lr=config.lr, weight_decay=0.0)
    rng = random.Random(config.seed)
    losses = []
    model.train()
    try:
        for _ in range(config.steps):
            index = rng.sample(range(len(task)), min(config.batch_size, len(task)))
            ids, labels = answer_batch(task, index)
            logits = model(input_ids=ids.to(adapter.device), use_cache=False).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.to(logits.device).flatten())
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
    finally:
        model.eval()
        for h in hooks:
            h.remove()
        for p in params:
            p.requires_grad_(False)
            p.grad = None
    count = sum(int(m.sum()) for m in masks.values()) if masks is not None else sum(p.numel() for p in params)
    return TrainResult(losses, count)


class TextMeasures(TypedDict):
    """The non-math measure on general text: perplexity and next-token accuracy, each with its 95 % bootstrap
    interval over windows."""

    perplexity: float
    perplexity_ci: list[float]
    next_token_accuracy: float
    next_token_accuracy_ci: list[float]


class Measured(TextMeasures):
    """A model's full-answer accuracy on the held-out problems (with its 95 % interval) and its text measures."""

    arithmetic_accuracy: float
    arithmetic_accuracy_ci: list[float]


class Trial(TypedDict):
    """A learning rate tried on the validation problems (None and diverged: the weights became NaN)."""

    accuracy: float | None
    mean_p_correct: float | None
    diverged: NotRequired[bool]


class Run(TypedDict):
    """One training run at the chosen learning rate (random heads: which draw of heads it trained) and what the
    trained model measures."""

    seed: int
    draw: NotRequired[int]
    heads: NotRequired[list[list[int]]]
    arithmetic_accuracy: float
    arithmetic_accuracy_ci: list[float]
    correct: str  # right ("1") or wrong ("0") on each held-out problem, in order: what the paired tests read
    perplexity: float
    perplexity_ci: list[float]
    next_token_accuracy: float
    next_token_accuracy_ci: list[float]
    loss_first: float
    loss_last: float


class Variant(TypedDict):
    """A variant (precise, random heads, full): its learning rate chosen on the validation problems, its runs and
    each measure's mean and std over them."""

    lr: float
    validation_by_lr: dict[str, Trial]  # by the learning rate as text
    runs: list[Run]
    arithmetic_accuracy: float
    perplexity: float
    next_token_accuracy: float
    arithmetic_accuracy_std: float
    perplexity_std: float
    next_token_accuracy_std: float
    trained_parameters: int
    frozen_entries_checked: bool
    lr_at_edge: bool  # the chosen learning rate is the grid's smallest or largest: a wider grid may do better
    draws: NotRequired[int]  # random heads: the seeded draws of heads
    random_matched: NotRequired[dict[str, int]]  # random heads: matched by layer and key/value group, by layer, nearest
    note: NotRequired[str]


class Compared(TypedDict):
    """Precise vs random heads vs full fine-tuning (`compare`): the heads, the set sizes, the base model and each
    variant."""

    heads: list[list[int]]
    gqa: str
    config: FinetuneConfig
    scoring: str
    lr_grid: list[float]
    seeds: list[int]
    n_train: int
    n_val: int
    n_eval: int
    arithmetic_baseline: float
    base: Measured
    base_correct: str  # the base model on each held-out problem ("1"/"0")
    precise: Variant
    random_heads: Variant
    full: Variant
    claims: list[Claim]  # precise against random heads and against full tuning, on the same problems (Holm)


@torch.no_grad()
def text_measures(adapter: ModelAdapter, windows_NT: torch.Tensor) -> TextMeasures:
    """Perplexity and next-token accuracy on general text (the non-math measure), each with a 95 % bootstrap interval
    over windows (a window's tokens are not independent, so they stay together)."""
    nll_N = torch.zeros(len(windows_NT), dtype=torch.float64)
    right_N = torch.zeros(len(windows_NT), dtype=torch.float64)
    for sl in batches(len(windows_NT), 4):
        ids = windows_NT[sl].to(adapter.device)
        logits = adapter.model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        target = ids[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        nll_N[sl] = nll.double().mean(-1).cpu()
        right_N[sl] = (logits.argmax(-1) == target).double().mean(-1).cpu()
    low, high = mean_interval(nll_N.tolist())  # windows of one length: the mean of their means is the mean
    return TextMeasures(
        perplexity=float(nll_N.mean().exp()),
        perplexity_ci=[float(torch.tensor(low).exp()), float(torch.tensor(high).exp())],
        next_token_accuracy=float(right_N.mean()),
        next_token_accuracy_ci=mean_interval(right_N.tolist()),
    )


def save_slices(adapter: ModelAdapter, masks: dict[str, torch.Tensor], path: Path, meta: dict[str, Any]) -> Path:
    """Only the trained entries, with their masks, as safetensors; `load_slices` puts them back on a base model."""
    named = dict(adapter.model.named_parameters())
    tensors = {}
    for n, m in masks.items():
        tensors[f"{n}::values"] = named[n].detach()[m].cpu().contiguous()
        tensors[f"{n}::mask"] = m.cpu().contiguous()
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"af1": json.dumps(meta)})
    return path


@torch.no_grad()
def load_slices(adapter: ModelAdapter, path: Path) -> None:
    named = dict(adapter.model.named_parameters())
    tensors = load_file(str(path))
    for key, values in tensors.items():
        if key.endswith("::values"):
            name = key.removesuffix("::values")
            if name not in named:
                raise Af1Error(f"{path} holds a slice of '{name}', which this model does not have")
            mask = tensors[f"{name}::mask"].to(named[name].device)
            named[name][mask] = values.to(named[name].dtype).to(named[name].device)


def check_frozen(adapter: ModelAdapter, base: dict[str, torch.Tensor], masks: dict[str, torch.Tensor] | None) -> None:
    """After training: no weight is NaN, and every entry outside the trained slices is bit-identical to the base."""
    for name, value in adapter.model.state_dict().items():
        if torch.isnan(value).any():
            raise Af1Error(f"fine-tuning made {name} NaN: lower the learning rate")
        if masks is None:
            continue
        frozen = ~masks[name].to(value.device) if name in masks else torch.ones_like(value, dtype=torch.bool)
        if not torch.equal(value[frozen], base[name].to(value.device)[frozen]):
            raise Af1Error(f"a frozen entry of {name} changed during precise fine-tuning")


def compare(
    adapter: ModelAdapter,
    train_task: Task,
    val_task: Task,
    eval_task: Task,
    text_NT: torch.Tensor,
    heads: list[tuple[int, int]],
    config: FinetuneConfig,
    lrs: tuple[float, ...] = (1e-5, 1e-4, 1e-3),
    seeds: tuple[int, ...] = (0, 1, 2),
    out_dir: Path | None = None,
    random_draws: int = 3,
) -> Compared:
    """Precise vs random heads vs full fine-tuning from the same base weights: each variant's learning rate chosen
    on the validation problems, then one run per seed; full-answer accuracy on held-out problems and the text
    measures, mean and spread over seeds. Random heads: `random_draws` seeded sets of as many heads, none of the
    chosen ones, the learning rate chosen on the first, draw i run with seed i (cycling through the seeds): mean and
    spread over draws, at the cost of as many runs as seeds when draws = seeds. The three problem sets are
    disjoint."""

    check_disjoint(train_task, eval_task)
    check_disjoint(train_task, val_task)
    check_disjoint(val_task, eval_task)
    base_state = {k: v.detach().clone() for k, v in adapter.model.state_dict().items()}

    def measure() -> tuple[Measured, float, str]:
        """The model as it is now on the held-out problems and on text; the constant guess's score; each held-out
        problem right or wrong."""
        scores = evaluate(adapter.model, eval_task)
        r = scores.rate(eval_task)
        measured = Measured(
            arithmetic_accuracy=r["value"], arithmetic_accuracy_ci=r["ci"], **text_measures(adapter, text_NT)
        )
        return measured, r["baseline"], "".join("1" if c else "0" for c in scores.correct_P.tolist())

    base, baseline, base_correct = measure()
    chosen = [list(h) for h in heads]
    random_sets, matched = matched_draws(adapter, heads, range(config.seed, config.seed + random_draws), heads)
    variants: dict[str, list[dict[str, torch.Tensor] | None]] = {
        "precise": [head_slices(adapter, heads)],
        "random_heads": [head_slices(adapter, h) for h in random_sets],
        "full": [None],
    }
    done: dict[str, Variant] = {}
    for name, draws in variants.items():
        masks = draws[0]
        grid: dict[str, Trial] = {}
        for lr in lrs:  # chosen on the validation problems, with the first seed (random heads: the first draw)
            adapter.model.load_state_dict(base_state)
            with stage(f"finetune {name}: lr {lr} on the validation problems"):
                train(adapter, train_task, config.model_copy(update={"lr": lr, "seed": seeds[0]}), masks)
            if any(torch.isnan(v).any() for v in adapter.model.state_dict().values()):  # diverged: not a choice
                grid[str(lr)] = Trial(accuracy=None, mean_p_correct=None, diverged=True)
                continue
            check_frozen(adapter, base_state, masks)
            scores = evaluate(adapter.model, val_task)
            grid[str(lr)] = Trial(accuracy=scores.accuracy, mean_p_correct=scores.mean_p_correct)
        usable = [lr for lr in lrs if not grid[str(lr)].get("diverged")]
        if not usable:
            raise Af1Error(f"fine-tuning ({name}) diverged at every learning rate of {list(lrs)}: try smaller ones")
        best = max(  # a usable rate's scores are never None (only a diverged one's are)
            usable, key=lambda lr: (grid[str(lr)]["accuracy"] or 0.0, grid[str(lr)]["mean_p_correct"] or 0.0, -lr)
        )
        runs: list[Run] = []
        # one run per seed; random heads: one run per draw, draw i with seed i (cycling)
        plan = [(masks, seed, None) for seed in seeds] if name != "random_heads" else []
        plan += [(m, seeds[d % len(seeds)], d) for d, m in enumerate(draws) if name == "random_heads"]
        trained_parameters = 0
        for masks, seed, draw in plan:
            adapter.model.load_state_dict(base_state)
            with stage(f"finetune {name}: lr {best}, seed {seed}" + (f", draw {draw}" if draw is not None else "")):
                trained = train(adapter, train_task, config.model_copy(update={"lr": best, "seed": seed}), masks)
            check_frozen(adapter, base_state, masks)
            trained_parameters = trained.trained_parameters
            measured, _, correct = measure()
            run = Run(
                seed=seed, **measured, correct=correct, loss_first=trained.losses[0], loss_last=trained.losses[-1]
            )
            if draw is not None:  # which heads this draw trained
                run.update(draw=draw, heads=[list(h) for h in random_sets[draw]])
            runs.append(run)
            if name == "precise" and out_dir is not None and seed == seeds[0] and masks is not None:
                save_slices(adapter, masks, out_dir / "precise_heads.safetensors", {"heads": chosen})
        accuracy = mean_std([r["arithmetic_accuracy"] for r in runs])
        perplexity = mean_std([r["perplexity"] for r in runs])
        next_token = mean_std([r["next_token_accuracy"] for r in runs])
        variant = Variant(
            lr=best,
            validation_by_lr=grid,
            runs=runs,
            arithmetic_accuracy=accuracy["mean"],
            perplexity=perplexity["mean"],
            next_token_accuracy=next_token["mean"],
            arithmetic_accuracy_std=accuracy["std"],
            perplexity_std=perplexity["std"],
            next_token_accuracy_std=next_token["std"],
            trained_parameters=trained_parameters,
            frozen_entries_checked=masks is not None,
            lr_at_edge=len(lrs) > 1 and best in (min(lrs), max(lrs)),
        )
        if name == "full":
            variant["note"] = "full fine-tuning also updates the (tied) embedding"
        if name == "random_heads":
            variant["draws"] = len(random_sets)
            variant["random_matched"] = matched
            variant["note"] = (
                f"{len(random_sets)} seeded draws of {len(heads)} heads, each chosen head matched by one of the same "
                "layer and key/value group (else the same layer, else the nearest), none of the chosen ones; learning "
                "rate chosen on the first draw; mean ± std over draws (each with one seed: the spread is over "
                "both the heads and the seed)"
            )
        done[name] = variant
    adapter.model.load_state_dict(base_state)

    def share_right(variant: Variant) -> list[float]:
        """Each held-out problem's share of the variant's runs that get it right."""
        bits = torch.tensor([[c == "1" for c in run["correct"]] for run in variant["runs"]], dtype=torch.float)
        return bits.mean(0).tolist()

    on = f"the {len(eval_task)} held-out problems"
    precise = share_right(done["precise"])
    claims = [
        paired_greater(
            "precise_vs_random",
            f"tuning the chosen heads leaves more held-out problems right than tuning these {len(random_sets)} draws "
            "of matched random heads (held fixed)",
            precise,
            share_right(done["random_heads"]),
            on,
        ),
        paired_greater(
            "precise_vs_full",
            "tuning the chosen heads and tuning the whole model differ on the held-out problems",
            precise,
            share_right(done["full"]),
            on,
            alternative="two-sided",
        ),
    ]
    return Compared(
        heads=chosen,
        gqa=GQA_CHOICE,
        config=config,
        scoring="every answer token trained; full-answer greedy exact match (teacher forced) reported",
        lr_grid=list(lrs),
        seeds=list(seeds),
        n_train=len(train_task),
        n_val=len(val_task),
        n_eval=len(eval_task),
        arithmetic_baseline=baseline,
        base=base,
        base_correct=base_correct,
        precise=done["precise"],
        random_heads=done["random_heads"],
        full=done["full"],
        claims=adjust(claims, "fine-tuning"),
    )
