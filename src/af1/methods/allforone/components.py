"""Components: CAMA alone and ABP alone at each L_wait, each against the threshold (is either part enough?)."""

from __future__ import annotations

from collections.abc import Callable

from af1.claims import About, Claim, adjust, rate_below
from af1.interventions.af1 import AF1Config
from af1.methods.allforone.faithfulness import faithfulness
from af1.methods.setup import Setup
from af1.progress import progress
from af1.results import Part
from af1.stats import Rate, constant_baseline
from af1.tasks.evaluation import ExecutorChoice, Scores


class Components(Part):
    """CAMA alone and ABP alone per L_wait (`components`): faithfulness (a rate: interval, n, constant guess) and
    the executor that measured it."""

    transfer: int
    cama_only: dict[int, Rate]
    cama_only_executor: dict[int, ExecutorChoice | None]
    abp_only: dict[int, Rate]
    abp_only_executor: dict[int, ExecutorChoice | None]
    threshold: float
    claims: list[Claim]  # each part alone at each L_wait breaks the answer: one family (Holm)


def components(setup: Setup, waits: list[int], *, transfer: int, threshold: float) -> Components:
    """CAMA alone (no attention mask) and ABP alone (no ablation, `transfer` peek layers) per L_wait, each claimed
    to leave the last token answering less often than `threshold` (one-sided exact binomial tests, Holm)."""
    L = setup.adapter.n_layers
    waits = [w for w in waits if 0 <= w < L]

    def per_wait(name: str, make: Callable[[int], AF1Config]) -> tuple[dict[int, Scores], dict[int, Rate]]:
        scores = {w: faithfulness(setup, make(w)) for w in progress(waits, desc=name)}
        return scores, {w: s.rate(setup.kept) for w, s in scores.items()}

    cama, cama_rates = per_wait("cama_only", lambda w: AF1Config(wait=w, abp="none"))
    abp, abp_rates = per_wait(
        "abp_only", lambda w: AF1Config(wait=w, transfer=min(transfer, L - 1 - w), ablation="none")
    )
    baseline = constant_baseline(setup.kept.targets(), setup.kept.layout_P.tolist())
    on = f"the {len(setup.kept)} solved problems"
    claims = [
        rate_below(
            About(
                "component_alone",
                f"with {part} alone at L_wait {w}{how}, the last token answers less often than {threshold}",
                on,
                f"{part} alone, L_wait {w}",
                baseline,
            ),
            s.correct_P.tolist(),
            threshold,
        )
        for part, how, scored in (("CAMA", " (no attention mask)", cama), ("ABP", " (no ablation)", abp))
        for w, s in scored.items()
    ]
    return Components(
        transfer=transfer,
        cama_only=cama_rates,
        cama_only_executor={w: s.executor for w, s in cama.items()},
        abp_only=abp_rates,
        abp_only_executor={w: s.executor for w, s in abp.items()},
        threshold=threshold,
        claims=adjust(claims, "components: each part alone at each L_wait"),
    )
