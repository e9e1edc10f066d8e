"""A model and a task measured once for AF1: base scores, the solved problems, each answer step's CAMA means over
the means sample, and the notes on thin means; what every AF1 method runs on."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.errors import Af1Error
from af1.executors.protocol import Executor, pick
from af1.executors.step import StepSetup
from af1.interventions.af1 import AF1Config
from af1.interventions.attention import check_maskable
from af1.interventions.means import PositionMeans, cached_step_means, compute_step_means
from af1.models import LoadedModel, ModelAdapter
from af1.stats import baseline_warning, constant_baseline
from af1.tasks.evaluation import Evaluated, Scores, TaskDescription, evaluated, require_solved, solved
from af1.tasks.means_sample import distribution_task
from af1.tasks.spec import TaskSpec
from af1.tasks.task import AnswerEnd, BosToken, LayoutRow, Task

LOW_COUNT = 5  # a conditional mean over fewer problems than this is flagged
ALL_SOLVED = "the solved problems"  # what a measure on every solved problem says it was measured on


@with_config(ConfigDict(extra="forbid"))
class ThinMeans(TypedDict):
    """Where CAMA's means are thin for the evaluated problems of one step (`low_count_positions`)."""

    positions: list[int]
    n_problems_low: int
    n_inside: int
    n_fallback_pairs: int
    n_problems_fallback: int


@with_config(ConfigDict(extra="forbid"))
class MeansStep(ThinMeans):
    """One answer step's CAMA means on one layout: thin positions and leave-one-out fallbacks."""

    layout: int
    step: int | None  # a setup's steps always have one (None: a task not split into steps)


@with_config(ConfigDict(extra="forbid"))
class MeansFrom(TypedDict):
    """Where CAMA's means come from: the sample, whether the evaluated problems are left out of it, fallbacks."""

    origin: str
    n_problems: int
    leave_one_out: str
    n_fallback_pairs: int
    per_step: list[MeansStep]


class SetupDescription(TaskDescription):
    """What every result measured on a setup carries beyond the task (`Setup.describe`), declared once here: token
    layouts, whether the answer's end is checked, and where CAMA's means come from."""

    layouts: list[LayoutRow] = Field(default_factory=list)
    n_layers: int
    n_heads: int
    context_len: int | None = None  # None for several layouts: see `layouts`
    n_positions: int | None = None
    bos_prepended: BosToken | None = None  # the document-start token put before every prompt, if any
    end: AnswerEnd
    means_from: MeansFrom


@dataclass
class Setup:
    """A model and a task, measured: base scores, the solved problems, per-step means and caches."""

    lm: LoadedModel
    spec: TaskSpec
    task: Task
    base: Scores
    kept: Task
    distribution: Task  # what CAMA averages over
    steps: list[StepSetup]
    warnings: list[str] = field(default_factory=list)  # about the task and its baseline (the means' are computed)

    @property
    def adapter(self) -> ModelAdapter:
        """The model's adapter."""
        return self.lm.adapter

    @property
    def means(self) -> PositionMeans:
        """The first step's means (the only step under first-token scoring)."""
        return self.steps[0].means

    @property
    def evaluated(self) -> Evaluated:
        """The task and base scores this setup was made from, for experiments that need no more."""
        return Evaluated(self.task, self.base, id(self.lm.model))

    def on(self, index: list[int]) -> Setup:
        """The same setup restricted to some solved problems (a split); means and fast-path tables are shared."""
        kept = self.kept.subset(index)
        by_part = {s.kept.part_key: s for s in self.steps}
        return replace(self, kept=kept, steps=[replace(by_part[k.part_key], kept=k) for k in kept.steps()])

    @property
    def means_notes(self) -> list[MeansStep]:
        """Per step of the kept problems (a split counts its own): thin means, leave-one-out fallbacks."""
        return [
            MeansStep(layout=s.kept.layout_id, step=s.kept.step, **low_count_positions(s.means, s.kept))
            for s in self.steps
        ]

    def means_warnings(self) -> list[str]:
        """One line per step where CAMA's means are thin or fall back, for the kept problems."""
        out = []
        for s, thin in zip(self.steps, self.means_notes, strict=True):
            where = (f"layout {s.kept.layout_id}, " if self.task.groups else "") + f"step {s.kept.step}"
            if thin["positions"]:
                out.append(
                    f"{where}: CAMA means over fewer than {LOW_COUNT} other problems at positions {thin['positions']} "
                    f"({self.distribution.origin} of {len(s.donors)} problems"
                    + (", each problem's own state left out" if thin["n_inside"] else "")
                    + f"), for {thin['n_problems_low']} of {len(s.kept)} solved problems: noisy there (near a resample)"
                )
            if thin["n_fallback_pairs"]:
                out.append(
                    f"{where}: at {thin['n_fallback_pairs']} (problem, position) pairs of "
                    f"{thin['n_problems_fallback']} solved problems no other problem has the token: CAMA uses the "
                    "leave-one-out token-agnostic mean there"
                )
        return out

    def describe(self) -> SetupDescription:
        """What every result measured on this setup carries: the model, the task and its base accuracy, the token
        layouts, whether the end of the answer is checked, and where CAMA's means come from."""
        if self.task.end is None:
            raise Af1Error("a setup's task is built by af1.tasks.task.build_task, which settles the end of its answers")
        notes = self.means_notes
        solved_P = self.kept.layout_P.tolist()
        layouts = self.task.layouts()
        for row in layouts:
            row["n_solved"] = solved_P.count(row["layout"])
        return SetupDescription(
            model=self.lm.info.get("spec"),
            task=self.spec.name,
            style=self.spec.style_name,
            shots=self.spec.shots,
            scoring=self.spec.scoring,
            n=len(self.task),
            n_solved=len(self.kept),
            base_accuracy=self.base.rate(self.task),
            layouts=layouts,
            n_layers=self.adapter.n_layers,
            n_heads=self.adapter.n_heads,
            context_len=None if self.task.groups else self.task.context_len,  # several layouts: see `layouts`
            n_positions=None if self.task.groups else self.task.n_positions,
            bos_prepended=self.task.bos_prepended,
            end=self.task.end,  # whether full scoring checks that the model stops after the answer
            means_from=MeansFrom(
                origin=self.distribution.origin,
                n_problems=len(self.distribution),
                leave_one_out="each solved problem inside the means is left out of them"
                if any(n["n_inside"] for n in notes)
                else "the means are over other problems only",
                n_fallback_pairs=sum(n["n_fallback_pairs"] for n in notes),
                per_step=notes,
            ),
            warnings=self.warnings + self.means_warnings(),
        )


def low_count_positions(means: PositionMeans, task: Task) -> ThinMeans:
    """Where CAMA's means are thin: positions where some problem's mean is over fewer than LOW_COUNT others, how many
    problems have one, and how many (problem, position) pairs fall back to the token-agnostic mean."""
    ids = task.input_ids_PT
    inside_P = means.inside(ids)
    others_PT = means.counts(ids) - inside_P[:, None].float()
    low_PT = others_PT < LOW_COUNT
    low_PT[:, : task.context_len + 1] = False  # context, and the first varying position: already its own mean
    fallback_PT = means.fallbacks(ids, task.context_len + 1)
    return ThinMeans(
        positions=low_PT.any(0).nonzero().flatten().tolist(),
        n_problems_low=int(low_PT.any(1).sum()),
        n_inside=int(inside_P.sum()),
        n_fallback_pairs=int(fallback_PT.sum()),
        n_problems_fallback=int(fallback_PT.any(1).sum()),
    )


def prepare(lm: LoadedModel, spec: TaskSpec, means_dir: Path | None = None, done: Evaluated | None = None) -> Setup:
    """Build the task, keep the solved problems, and get each step's position means over the task distribution;
    `done` is an evaluation of the same spec already made. Refuses kernels that cannot take masks first."""
    check_maskable(lm.adapter)
    done = evaluated(lm.model, lm.tokenizer, spec, done)
    require_solved(int(done.base.correct_P.sum()), spec)
    return make_setup(lm, spec, done.task, done.base, distribution_task(spec, lm.tokenizer, done.task), means_dir)


def make_setup(
    lm: LoadedModel,
    spec: TaskSpec,
    task: Task,
    base: Scores,
    distribution: Task,
    means_dir: Path | None = None,
    cache_means: bool = True,
) -> Setup:
    """A setup from a task, its base scores and the distribution CAMA averages over: one StepSetup per answer step."""
    kept = solved(task, base)
    dist_steps = {part.part_key: part for part in distribution.steps()}
    kept_steps = kept.steps()
    if any(k.part_key not in dist_steps for k in kept_steps):
        raise Af1Error("the means sample has no answer as long as some solved problems' answers")
    checked = ((f"base accuracy ({spec.scoring} scoring)", task), ("faithfulness on the solved problems", kept))
    constant = [
        baseline_warning(w, constant_baseline(on.targets(), on.layout_P.tolist()), len(on)) for w, on in checked
    ]
    warnings = [w for w in (task.sampling_note, task.exclusion_note, task.end_note, *constant) if w]
    all_means = step_means(lm.adapter, distribution, [k.part_key for k in kept_steps], means_dir, cache_means)
    steps = [StepSetup(lm.adapter, k, all_means[k.part_key], dist_steps[k.part_key]) for k in kept_steps]
    return Setup(lm, spec, task, base, kept, distribution, steps, warnings)


def step_means(
    adapter: ModelAdapter,
    distribution: Task,
    wanted: list[Any],
    means_dir: Path | None = None,
    cache: bool = True,
) -> dict[Any, PositionMeans]:
    """The position means of the answer steps `wanted` (by `part_key`): each layout's steps in one pass, read from or
    written to the store (`means_dir`, else af1's cache); `cache` False bypasses the store."""
    out: dict[Any, PositionMeans] = {}
    for group in distribution.groups or [distribution]:
        steps = [s for s in group.steps() if s.part_key in wanted]
        means = cached_step_means(adapter, steps, means_dir) if cache else compute_step_means(adapter, steps)
        out.update({s.part_key: m for s, m in zip(steps, means, strict=True)})
    return out


def executors(setup: Setup, config: AF1Config, reference: bool = False) -> list[tuple[Executor, str | None]]:
    """The executor of each step for a config, picked once (`recorded` says what a result keeps of them)."""
    return [pick(step.adapter, step.kept, config, reference) for step in setup.steps]
