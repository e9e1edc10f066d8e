"""Precise fine-tuning (docs/methods.md §2): train only chosen heads' slices of W_Q, W_K, W_V, W_O (frozen entries
checked exact), against full and random-head tuning, on held-out problems and text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from typing_extensions import NotRequired, TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, groups_greater
from af1.errors import Af1Error
from af1.interventions.heads import matched_draws
from af1.methods.finetune.slices import GQA_CHOICE, check_frozen, head_slices, save_slices
from af1.methods.finetune.train import FinetuneConfig, TextMeasures, check_disjoint, text_measures, train
from af1.models.adapter import ModelAdapter
from af1.progress import stage
from af1.results import Part
from af1.stats import mean_std
from af1.tasks.evaluation import evaluate
from af1.tasks.task import Task


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


class Compared(Part):
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


@dataclass(frozen=True)
class Problems:
    """Three disjoint problem sets: trained on, learning rates chosen on, reported on."""

    train: Task
    val: Task
    held_out: Task

    def __post_init__(self) -> None:
        """Refuses sets that share a problem."""
        for trained, evaluated in ((self.train, self.held_out), (self.train, self.val), (self.val, self.held_out)):
            check_disjoint(trained, evaluated)


@dataclass(frozen=True)
class Grid:
    """The runs each variant gets: the learning rates tried (on the validation problems, with the first seed), the
    seeds the chosen one runs with, and the seeded draws of random heads."""

    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    random_draws: int


Masks = dict[str, torch.Tensor] | None  # a variant's trainable slices (None: every weight)


def compare(
    adapter: ModelAdapter,
    problems: Problems,
    text_NT: torch.Tensor,
    heads: list[tuple[int, int]],
    config: FinetuneConfig,
    grid: Grid,
    out_dir: Path | None = None,
) -> Compared:
    """Precise vs random heads (`grid.random_draws` seeded sets, draw i with seed i) vs full tuning from the same
    weights: learning rate chosen on validation, then runs per seed, held-out and text measures."""
    base_state = {k: v.detach().clone() for k, v in adapter.model.state_dict().items()}
    base, baseline, base_correct = measure(adapter, problems.held_out, text_NT)
    chosen = [list(h) for h in heads]
    random_sets, matched = matched_draws(adapter, heads, range(config.seed, config.seed + grid.random_draws), heads)
    variants: dict[str, list[Masks]] = {
        "precise": [head_slices(adapter, heads)],
        "random_heads": [head_slices(adapter, h) for h in random_sets],
        "full": [None],
    }
    done: dict[str, Variant] = {}
    for name, draws in variants.items():
        trials, best = choose_lr(adapter, problems, config, grid, draws[0], base_state, name)
        # one run per seed; random heads: one run per draw, draw i with seed i (cycling)
        plan = [(draws[0], seed, None) for seed in grid.seeds] if name != "random_heads" else []
        plan += [(m, grid.seeds[d % len(grid.seeds)], d) for d, m in enumerate(draws) if name == "random_heads"]
        runs, trained_parameters = [], 0
        for masks, seed, draw in plan:
            label = f"finetune {name}: lr {best}, seed {seed}" + (f", draw {draw}" if draw is not None else "")
            at = config.model_copy(update={"lr": best, "seed": seed})
            run, trained_parameters = seed_run(adapter, problems, text_NT, at, masks, base_state, label)
            if draw is not None:  # which heads this draw trained
                run.update(draw=draw, heads=[list(h) for h in random_sets[draw]])
            runs.append(run)
            if name == "precise" and out_dir is not None and seed == grid.seeds[0] and masks is not None:
                save_slices(adapter, masks, out_dir / "precise_heads.safetensors", {"heads": chosen})
        done[name] = variant_of(runs, trials, best, grid.lrs, trained_parameters, draws[0] is not None)
    adapter.model.load_state_dict(base_state)
    done["full"]["note"] = "full fine-tuning also updates the (tied) embedding"
    done["random_heads"].update(
        draws=len(random_sets),
        random_matched=matched,
        note=f"{len(random_sets)} seeded draws of {len(heads)} heads, each chosen head matched by one of the same "
        "layer and key/value group (else the same layer, else the nearest), none of the chosen ones; learning "
        "rate chosen on the first draw; mean ± std over draws (each with one seed: the spread is over "
        "both the heads and the seed)",
    )
    return Compared(
        heads=chosen,
        gqa=GQA_CHOICE,
        config=config,
        scoring="every answer token trained; full-answer greedy exact match (teacher forced) reported",
        lr_grid=list(grid.lrs),
        seeds=list(grid.seeds),
        n_train=len(problems.train),
        n_val=len(problems.val),
        n_eval=len(problems.held_out),
        arithmetic_baseline=baseline,
        base=base,
        base_correct=base_correct,
        precise=done["precise"],
        random_heads=done["random_heads"],
        full=done["full"],
        claims=compared_claims(done, len(random_sets), len(problems.held_out)),
    )


def measure(adapter: ModelAdapter, held_out: Task, text_NT: torch.Tensor) -> tuple[Measured, float, str]:
    """The model as it is now on the held-out problems and on text; the constant guess's score; each held-out
    problem right or wrong ("1"/"0")."""
    scores = evaluate(adapter.model, held_out)
    r = scores.rate(held_out)
    measured = Measured(
        arithmetic_accuracy=r["value"], arithmetic_accuracy_ci=r["ci"], **text_measures(adapter, text_NT)
    )
    return measured, r["baseline"], "".join("1" if c else "0" for c in scores.correct_P.tolist())


def choose_lr(
    adapter: ModelAdapter,
    problems: Problems,
    config: FinetuneConfig,
    grid: Grid,
    masks: Masks,
    base_state: dict[str, torch.Tensor],
    name: str,
) -> tuple[dict[str, Trial], float]:
    """Each learning rate trained with the first seed and scored on the validation problems; the best usable one
    (a rate whose weights became NaN is never chosen)."""
    trials: dict[str, Trial] = {}
    for lr in grid.lrs:
        adapter.model.load_state_dict(base_state)
        with stage(f"finetune {name}: lr {lr} on the validation problems"):
            train(adapter, problems.train, config.model_copy(update={"lr": lr, "seed": grid.seeds[0]}), masks)
        if any(torch.isnan(v).any() for v in adapter.model.state_dict().values()):  # diverged: not a choice
            trials[str(lr)] = Trial(accuracy=None, mean_p_correct=None, diverged=True)
            continue
        check_frozen(adapter, base_state, masks)
        scores = evaluate(adapter.model, problems.val)
        trials[str(lr)] = Trial(accuracy=scores.accuracy, mean_p_correct=scores.mean_p_correct)
    usable = [lr for lr in grid.lrs if not trials[str(lr)].get("diverged")]
    if not usable:
        raise Af1Error(f"fine-tuning ({name}) diverged at every learning rate of {list(grid.lrs)}: try smaller ones")
    best = max(  # a usable rate's scores are never None (only a diverged one's are)
        usable, key=lambda lr: (trials[str(lr)]["accuracy"] or 0.0, trials[str(lr)]["mean_p_correct"] or 0.0, -lr)
    )
    return trials, best


def seed_run(
    adapter: ModelAdapter,
    problems: Problems,
    text_NT: torch.Tensor,
    config: FinetuneConfig,
    masks: Masks,
    base_state: dict[str, torch.Tensor],
    label: str,
) -> tuple[Run, int]:
    """One run from the base weights at `config`'s learning rate and seed, checked and measured; its trained
    parameters."""
    adapter.model.load_state_dict(base_state)
    with stage(label):
        trained = train(adapter, problems.train, config, masks)
    check_frozen(adapter, base_state, masks)
    measured, _, correct = measure(adapter, problems.held_out, text_NT)
    run = Run(seed=config.seed, **measured, correct=correct, loss_first=trained.losses[0], loss_last=trained.losses[-1])
    return run, trained.trained_parameters


def variant_of(
    runs: list[Run], trials: dict[str, Trial], lr: float, lrs: tuple[float, ...], trained: int, sliced: bool
) -> Variant:
    """A variant's runs with each measure's mean and std over them."""
    accuracy = mean_std([r["arithmetic_accuracy"] for r in runs])
    perplexity = mean_std([r["perplexity"] for r in runs])
    next_token = mean_std([r["next_token_accuracy"] for r in runs])
    return Variant(
        lr=lr,
        validation_by_lr=trials,
        runs=runs,
        arithmetic_accuracy=accuracy["mean"],
        perplexity=perplexity["mean"],
        next_token_accuracy=next_token["mean"],
        arithmetic_accuracy_std=accuracy["std"],
        perplexity_std=perplexity["std"],
        next_token_accuracy_std=next_token["std"],
        trained_parameters=trained,
        frozen_entries_checked=sliced,
        lr_at_edge=len(lrs) > 1 and lr in (min(lrs), max(lrs)),
    )


def run_accuracies(variant: Variant) -> list[float]:
    """Each run's held-out accuracy: the unit the claims generalise over (a run is a seed, or a draw of heads)."""
    return [run["arithmetic_accuracy"] for run in variant["runs"]]


def compared_claims(done: dict[str, Variant], draws: int, n_held_out: int) -> list[Claim]:
    """Precise against random heads (one-sided) and against full tuning (two-sided), with the training run as the
    unit (each variant's runs' held-out accuracies, an exact permutation test), adjusted together (Holm)."""
    on = f"the {n_held_out} held-out problems, each run's accuracy one unit"
    precise = run_accuracies(done["precise"])
    against_random = About(
        "precise_vs_random",
        f"tuning the chosen heads leaves more held-out problems right than tuning matched random heads (over "
        f"training runs: {len(precise)} seeds against {draws} draws of random heads, each its own run)",
        on,
    )
    against_full = About(
        "precise_vs_full",
        "tuning the chosen heads and tuning the whole model differ on the held-out problems (over training "
        "runs: the seeds of each)",
        on,
    )
    claims = [
        groups_greater(against_random, precise, run_accuracies(done["random_heads"])),
        groups_greater(against_full, precise, run_accuracies(done["full"]), alternative="two-sided"),
    ]
    return adjust(claims, "fine-tuning")
