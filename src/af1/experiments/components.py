"""components: CAMA alone (no attention mask) and ABP alone (no ablation) per L_wait: does either part of AF1 keep
the answer by itself?"""

from __future__ import annotations

from pydantic import Field

from af1.experiments import base, costs
from af1.methods import allforone
from af1.report.markup import Tab
from af1.stats import rate_text
from af1.tasks.evaluation import ProblemInputs


class Options(base.GatedOptions):
    waits: list[int] | None = Field(default=None, description="L_wait values (default: 0, L/3, L/2, 2L/3, L-5 and L-3)")
    transfer: int = Field(default=2, ge=0, description="peek layers of ABP alone")
    threshold: float = Field(default=0.9, ge=0, le=1, description="faithfulness the claims read each part against")


class Result(base.SetupFields, allforone.components.Components):
    """The components' part (`allforone.components.Components`) on the setup it was measured on."""

    inputs: ProblemInputs | None = None  # sets: solved


def default_waits(n_layers: int) -> list[int]:
    """The L_wait values components measure unless told: 0, L/3, L/2, 2L/3, L-5 and L-3 (in range, once each)."""
    L = n_layers
    return sorted({w for w in (0, L // 3, L // 2, 2 * L // 3, L - 5, L - 3) if 0 <= w < L})


class Components(base.Experiment):
    name = "components"
    Options = Options
    Result = Result
    small = {"waits": [0, 1], "transfer": 1}
    cost = costs.Cost(slowdown=1.17)

    def work(self, options: Options, s: costs.Shapes) -> costs.Work:
        t, L, solved = s.on, s.model.layers, s.found.solved
        waits = [w for w in options.waits or default_waits(L) if 0 <= w < L]
        runs = sum(L - 1 - w for w in waits)
        return 2 * runs * solved * t.step_tokens() + s.clean, 2 * len(waits) * solved * t.steps, 0.0

    def run(self, inputs: base.Inputs, options: Options) -> Result:
        setup = inputs.resources.setup(inputs.spec)
        L = setup.adapter.n_layers
        waits = options.waits or default_waits(L)
        return Result.of(
            setup.describe(),
            allforone.components.components(setup, waits, transfer=options.transfer, threshold=options.threshold),
            inputs=allforone.faithfulness.setup_inputs(setup),
        )

    def tables(self, result: Result) -> list[Tab]:
        r = result
        rows = [[w, rate_text(v), rate_text(r.abp_only[w])] for w, v in r.cama_only.items()]
        return [Tab(["L_wait", "CAMA alone [95 % CI]", "ABP alone [95 % CI]"], rows)]

    def section(self, result: Result) -> list[str]:
        return [
            "<h2>CAMA alone and ABP alone</h2><p>CAMA alone: the ablation at L_wait with no attention mask. "
            f"ABP alone: no ablation, the mask from L_wait+1 with {result.transfer} peek layers.</p>",
            *super().section(result),
        ]
