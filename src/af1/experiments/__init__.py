"""Every experiment, one module each, in the order a model's units run; the CLI, plans, runner, report and API derive
from this registry. Cheap to import: `REGISTRY` imports the modules on first use (`af1 --help` reads docstrings)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from af1.errors import Af1Error

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from af1.experiments.base import Experiment, Inputs, NotApplicable, Options, Result

    REGISTRY: dict[str, Experiment]

# modules of af1.experiments, each defining the Experiment named after it (eval: Eval)
BUILTIN = (
    "eval",
    "search",
    "sweep",
    "run",
    "components",
    "necessity",
    "groups",
    "probes",
    "neurons",
    "alternatives",
    "prune",
    "styles",
    "heads",
    "finetune",
    "positional",
    "transfer",
)
_LAZY = {"Experiment", "Inputs", "NotApplicable"}


def registry() -> dict[str, Experiment]:
    """Every registered experiment by name, the built-in ones imported on the first call."""
    if "REGISTRY" not in globals():
        modules = {name: importlib.import_module(f"{__name__}.{name}") for name in BUILTIN}
        globals()["REGISTRY"] = {name: getattr(m, name.capitalize())() for name, m in modules.items()}
    return globals()["REGISTRY"]


def __getattr__(attribute: str) -> Any:
    if attribute == "REGISTRY":
        return registry()
    if attribute in _LAZY:
        from af1.experiments import base

        return getattr(base, attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def register(experiment: Experiment) -> None:
    """Add an experiment from outside the package (a plugin, a notebook): it becomes a plan entry, an API call and a
    command at once."""
    registry()[experiment.name] = experiment
    _schema_changed()


def unregister(name: str) -> None:
    registry().pop(name, None)
    _schema_changed()


def _schema_changed() -> None:
    import sys

    plan = sys.modules.get("af1.study.plan")
    if plan is not None:  # imported already: its schema was built from the registry as it was
        plan.rebuild_schema()


def get(name: str) -> Experiment:
    known = registry()
    if name not in known:
        raise Af1Error(f"unknown experiment {name!r}: choose from {', '.join(known)}")
    return known[name]


def chain(named: Mapping[str, Options]) -> dict[str, tuple[Options, list[str]]]:
    """The named experiments and what they need (with default options), in the registry's order, each with its
    options and the experiments it reads: what it needs, and what it uses where that runs too."""
    known = registry()
    exps, todo = dict(named), list(named)
    while todo:
        name = todo.pop()
        for need in known[name].needs(exps[name]):
            if need not in exps:
                exps[need] = known[need].Options()
                todo.append(need)
    reads = {e: (*known[e].needs(o), *known[e].uses()) for e, o in exps.items()}
    return {e: (exps[e], [d for d in known if d in reads[e] and d in exps]) for e in known if e in exps}


def run_on(inputs: Inputs, name: str, options: Options, read: Iterable[Result] = ()) -> Result:
    """Experiment `name` on its inputs; not applicable where it asks for a chosen cell and the search chose none. Its
    warnings follow those of the results it read on its own model (`read`)."""
    from af1.experiments.search import check_found

    check_found(inputs, options)
    result = registry()[name].run(inputs, options)
    result.warnings = list(dict.fromkeys([*(w for r in read for w in r.warnings), *result.warnings]))
    return result


__all__ = [
    "BUILTIN",
    "REGISTRY",
    "Experiment",
    "Inputs",
    "NotApplicable",
    "chain",
    "get",
    "register",
    "run_on",
    "unregister",
]
