"""Every experiment af1 runs, one module each, in the order a model's units run (what an experiment reads comes
before it). The command line, plan files, the study runner, the HTML report and `af1.api` are derived from this
registry: adding an experiment is one module and one line here."""

from __future__ import annotations

from af1.errors import Af1Error
from af1.experiments.alternatives import Alternatives
from af1.experiments.base import Experiment, Inputs, NotApplicable
from af1.experiments.components import Components
from af1.experiments.eval import Eval
from af1.experiments.finetune import Finetune
from af1.experiments.heads import Heads
from af1.experiments.necessity import Necessity
from af1.experiments.positional import Positional
from af1.experiments.prune import Prune
from af1.experiments.run import Run
from af1.experiments.search import Search
from af1.experiments.styles import Styles
from af1.experiments.sweep import Sweep
from af1.experiments.transfer import Transfer

REGISTRY: dict[str, Experiment] = {
    e.name: e
    for e in (
        Eval(),
        Sweep(),
        Search(),
        Run(),
        Components(),
        Necessity(),
        Alternatives(),
        Prune(),
        Styles(),
        Heads(),
        Finetune(),
        Positional(),
        Transfer(),
    )
}


def register(experiment: Experiment) -> None:
    """Add an experiment from outside the package (a plugin, a notebook): it becomes a plan entry and an API call
    at once; a command too when registered before `af1.cli` is imported."""
    REGISTRY[experiment.name] = experiment
    _schema_changed()


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)
    _schema_changed()


def _schema_changed() -> None:
    import sys

    plan = sys.modules.get("af1.study.plan")
    if plan is not None:  # imported already: its schema was built from the registry as it was
        plan.rebuild_schema()


def get(name: str) -> Experiment:

    if name not in REGISTRY:
        raise Af1Error(f"unknown experiment {name!r}: choose from {', '.join(REGISTRY)}")
    return REGISTRY[name]


__all__ = ["REGISTRY", "Experiment", "Inputs", "NotApplicable", "get", "register", "unregister"]
