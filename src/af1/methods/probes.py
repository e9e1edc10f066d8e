"""Probes of the last token's state after each block, unmodified and under AF1 (docs/methods.md §4). Shapes
(af1.shapes): P problems, L blocks, D the model's width, O a probe's outputs, M label columns, Y values."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from af1.claims import About, Claim, adjust, paired_greater
from af1.errors import Af1Error
from af1.interventions.af1 import AF1Config, af1_intervention
from af1.interventions.sites import Site, record, residual
from af1.methods.ridge import ridge_predict
from af1.methods.setup import Setup
from af1.models.forward import forward_last
from af1.results import Part
from af1.stats import exact_interval
from af1.tasks.evaluation import batches
from af1.tasks.task import Task

PERIODS = (2, 5, 10, 100)  # the Fourier probe reads cos and sin of 2 pi value / T for each period T
KINDS = ("fourier", "linear")
MIN_PROBLEMS = 10  # fewer problems than this cannot be cross-validated in folds worth reading


class Curve(TypedDict):
    """One probe of one target per block: held-out accuracy (each problem read by the fold that did not train on it)
    with its 95 % interval, beside shuffled labels and the constant guess; descriptive."""

    target: str
    kind: str
    n: int
    accuracy: list[float]
    accuracy_ci: list[list[float]]
    shuffled: list[float]
    majority: float
    above_chance: list[bool]  # where the interval's lower end clears both the majority share and the shuffled probe


class Probes(Part):
    """The probes' part: each target's curves unmodified and, with a configuration, under AF1 and under its no-transfer
    control; and the claims about where under AF1 the operands arrive and the answer is computed."""

    n_probed: int
    folds: int
    periods: list[int]
    targets: list[str]
    unmodified: list[Curve]
    under_af1: list[Curve] = []
    no_transfer: list[Curve] = []  # the same CAMA with no transfer layers: what its leave-one-out trace alone holds
    config: AF1Config | None = None
    claims: list[Claim] = []


def labels(task: Task) -> dict[str, list[int]]:
    """Integer targets of every problem: each operand (a, b, ...), the answer, and its digits where it has several
    (units first); a target whose values are not all integers (a task file's words) is left out."""
    out: dict[str, list[int]] = {}
    problems = task.problems
    for i, name in enumerate("abcdefg"[: len(problems[0].operands)] if problems else ""):
        if (values := _integers([p.operands[i] for p in problems])) is not None:
            out[name] = values
    if problems and (answers := _integers([p.answer for p in problems])) is not None:
        out["answer"] = answers
        places = len(str(max(abs(a) for a in out["answer"])))
        for place in range(places if places > 1 else 0):
            out[f"answer digit {place + 1}"] = [abs(a) // 10**place % 10 for a in out["answer"]]
    return {name: values for name, values in out.items() if len(set(values)) > 1}  # a constant says nothing


def _integers(values: list[object]) -> list[int] | None:
    """The values as integers, None where one is not an integer."""
    try:
        return [int(str(v).strip()) for v in values]
    except ValueError:
        return None


@torch.no_grad()
def last_token_values(
    setup: Setup, config: AF1Config | None, sites: Sequence[Site], batch_size: int = 32
) -> dict[Site, torch.Tensor]:
    """Each site's value at the last prompt position ([P, ...], float64, CPU), rows as `setup.kept`'s, on the
    unmodified model or under AF1 (the reference executor's hooks, with each step's means)."""
    adapter, kept = setup.adapter, setup.kept
    out: dict[Site, torch.Tensor] = {}
    filled = torch.zeros(len(kept), dtype=torch.bool)
    for step in setup.steps:
        if step.kept.step not in (None, 0) or step.kept.index_P is None:
            continue  # the prompt alone: the state that predicts the answer's first token
        ids = step.kept.input_ids_PT
        for sl in batches(len(ids), batch_size):
            batch = ids[sl].to(adapter.device)
            edits = (
                af1_intervention(adapter, step.kept, config, step.means, batch)
                if config is not None
                else contextlib.nullcontext()
            )
            with edits, record(adapter, sites, last_only=True) as cache:
                forward_last(adapter.model, batch)
            rows = step.kept.index_P[sl]
            for site in sites:
                if site not in out:
                    out[site] = torch.zeros(len(kept), *cache[site].shape[1:], dtype=torch.float64)
                out[site][rows] = cache[site].double().cpu()
            filled[rows] = True
    assert bool(filled.all()), "every problem's prompt is the first step of one token layout"
    return out


def last_token_states(setup: Setup, config: AF1Config | None) -> torch.Tensor:
    """The residual state at the last prompt position after every block [P, L, D] (`last_token_values`)."""
    sites = [residual(layer) for layer in range(setup.adapter.n_layers)]
    values = last_token_values(setup, config, sites)
    return torch.stack([values[s] for s in sites], 1)


def features(labels: torch.Tensor, kind: str, periods: Sequence[int]) -> torch.Tensor:
    """What a probe regresses for labels [...]: the value itself (linear) or, Fourier, each value on a circle per
    period T, cos and sin of 2 pi v / T (sin left out for T = 2, where it is 0) [..., O]."""
    if kind == "linear":
        return labels.double()[..., None]
    out = []
    for t in periods:
        angle = 2 * math.pi * labels.double() / t
        out += [torch.cos(angle)] + ([torch.sin(angle)] if t != 2 else [])
    return torch.stack(out, -1)


def held_out(
    states_PD: torch.Tensor,
    probes: list[tuple[torch.Tensor, str]],
    folds: list[torch.Tensor],
    periods: Sequence[int],
    fit_PD: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """For each probe (labels [P, M], kind), every problem's label [P, M] decoded by the fold that did not train on it:
    the nearest value, outputs weighted by leave-one-out error; one ridge fit per fold serves every probe (`fit_PD`)."""
    fit_PD = states_PD if fit_PD is None else fit_PD
    values = [labels_PM[:, 0].unique() for labels_PM, _ in probes]
    decoded = [torch.empty_like(labels_PM) for labels_PM, _ in probes]
    for k, test in enumerate(folds):
        train = torch.cat([f for j, f in enumerate(folds) if j != k])
        targets = [features(labels_PM[train], kind, periods) for labels_PM, kind in probes]
        flat = torch.cat([t.reshape(len(train), -1) for t in targets], 1)
        predicted, error = ridge_predict(fit_PD[train], flat, states_PD[test])
        start = 0
        for (_, kind), target_PMO, values_Y, out in zip(probes, targets, values, decoded, strict=True):
            _, m, o = target_PMO.shape
            cols = slice(start, start + m * o)
            start += m * o
            predicted_PMO = predicted[:, cols].reshape(-1, m, o)
            weight_MO = 1 / error[cols].reshape(m, o).clamp_min(1e-12)
            features_YO = features(values_Y, kind, periods)
            distance_PMY = ((predicted_PMO[:, :, None] - features_YO) ** 2 * weight_MO[:, None]).sum(-1)
            out[test] = values_Y[distance_PMY.argmin(-1)]
    return decoded


def first_above_chance(curve: Curve, start: int = 0) -> int | None:
    """The first block from `start` whose state the probe reads above chance (descriptive), None where none is."""
    return next((i for i, above in enumerate(curve["above_chance"]) if above and i >= start), None)


def curves(
    states_PLD: torch.Tensor,
    targets: dict[str, list[int]],
    folds: int,
    seed: int,
    periods: Sequence[int],
    fit_PLD: torch.Tensor | None = None,
) -> tuple[list[Curve], dict[tuple[str, str], torch.Tensor]]:
    """Every target's probes block by block, and each probe's right/wrong per problem and block [P, L]; `fit_PLD`:
    the states the probes are fitted on (default: the states they read)."""
    order = torch.randperm(len(states_PLD), generator=torch.Generator().manual_seed(seed))
    parts = [part for part in order.chunk(folds) if len(part)]  # a seeded partition into folds of nearly equal size
    labels = {name: torch.tensor(values) for name, values in targets.items()}
    probed = [(name, kind) for name in targets for kind in KINDS]
    permuted = {n: v[torch.randperm(len(v), generator=torch.Generator().manual_seed(seed))] for n, v in labels.items()}
    columns = [(torch.stack([labels[n], permuted[n]], 1), kind) for n, kind in probed]  # true labels, one shuffle
    fit = states_PLD if fit_PLD is None else fit_PLD
    by_layer = [
        held_out(states_PLD[:, layer], columns, parts, periods, fit[:, layer]) for layer in range(states_PLD.shape[1])
    ]
    made, right = [], {}
    for i, (name, kind) in enumerate(probed):
        label, got = labels[name], [layer[i] for layer in by_layer]
        majority = float(label.unique(return_counts=True)[1].max()) / len(label)
        right[name, kind] = torch.stack([d[:, 0] == label for d in got], 1)
        n = len(label)
        k = right[name, kind].sum(0).tolist()
        shuffled = [float((d[:, 1] == label).double().mean()) for d in got]
        ci = [list(exact_interval(x, n)) for x in k]
        made.append(
            Curve(
                target=name,
                kind=kind,
                n=n,
                accuracy=[x / n for x in k],
                accuracy_ci=ci,
                shuffled=shuffled,
                majority=majority,
                above_chance=[c[0] > max(majority, s) for c, s in zip(ci, shuffled, strict=True)],
            )
        )
    return made, right


def spoken(target: str) -> str:
    """A target in words: 'operand a', 'the answer', "the answer's units digit"."""
    if len(target) == 1:
        return f"operand {target}"
    place = int(target.removeprefix("answer digit ") or 0) if target != "answer" else 0
    digit = {1: "units", 2: "tens"}.get(place, f"10^{place - 1}")
    return f"the answer's {digit} digit" if place else "the answer"


def computed_target(targets: Sequence[str]) -> str | None:
    """The target that shows the answer computed: the units digit where answers have several (a sum is linear in its
    operands, its value modulo 10 is not), else the answer itself."""
    return next((t for t in ("answer digit 1", "answer") if t in targets), None)


def stage_claims(
    targets: list[str],
    right: dict[tuple[str, str], torch.Tensor],
    control: dict[tuple[str, str], torch.Tensor] | None,
    config: AF1Config,
    measured_on: str,
) -> list[Claim]:
    """AF1's stages as paired permutation claims (one Holm family; approximate: folds are shared), docs/methods.md §4:
    operands and computed target beyond the no-transfer control, and the target better after the last block."""
    last = next(iter(right.values())).shape[1] - 1
    after = max(config.peek_layers(), default=config.wait)
    where = f"under AF1 ({config.cell}), {measured_on}"
    result = computed_target(targets)
    claims = []
    for kind in KINDS:
        if control is not None:
            for name, block in [*((t, after) for t in targets if len(t) == 1), *([(result, last)] if result else [])]:
                statement = (
                    f"{spoken(name)} is read better after block {block} under AF1 than with no transfer layers (the "
                    f"same CAMA, its trace alone; {kind} probe fitted on the unmodified model's states)"
                )
                about = About("probe_transferred", statement, where, name)
                a, b = right[name, kind][:, block].double(), control[name, kind][:, block].double()
                claims.append(paired_greater(about, a.tolist(), b.tolist()))
        if result is not None and after < last:
            read = right[result, kind].double()
            statement = (
                f"{spoken(result)} is read better after block {last} than after block {after}, the last transfer "
                f"block ({kind} probe)"
            )
            about = About("probe_computed", statement, where, result)
            claims.append(paired_greater(about, read[:, last].tolist(), read[:, after].tolist()))
    return adjust(claims, "probes under AF1")


def probes(setup: Setup, config: AF1Config | None, *, folds: int, seed: int, measured_on: str) -> Probes:
    """The probes on the setup's kept problems: unmodified, and where a configuration is given under AF1 and under
    its matched control (the same CAMA, no transfer layers)."""
    targets = labels(setup.kept)
    n = len(setup.kept)
    if n < max(MIN_PROBLEMS, 2 * folds):
        raise Af1Error(f"{n} problems are too few to probe in {folds} folds (at least {max(MIN_PROBLEMS, 2 * folds)})")
    if not targets:
        raise Af1Error("no target to probe: the task's operands and answer are not integers, or never vary")
    clean_PLD = last_token_states(setup, None)
    unmodified, _ = curves(clean_PLD, targets, folds, seed, PERIODS)
    found = Probes(n_probed=n, folds=folds, periods=list(PERIODS), targets=list(targets), unmodified=unmodified)
    if config is None:
        return found
    # probes fitted on the unmodified states read the intervened ones: they cannot learn the trace a problem leaves
    # in CAMA's leave-one-out means (which no unmodified state holds)
    under, right = curves(last_token_states(setup, config), targets, folds, seed, PERIODS, clean_PLD)
    control, control_right = [], None
    if config.transfer > 0:
        alone = config.model_copy(update={"transfer": 0})
        control, control_right = curves(last_token_states(setup, alone), targets, folds, seed, PERIODS, clean_PLD)
    claims = stage_claims(list(targets), right, control_right, config, measured_on)
    return found.model_copy(update={"under_af1": under, "no_transfer": control, "config": config, "claims": claims})
