"""Studies across models, tasks and experiments: a plan file, a resumable results store, local or Ray runs."""

from af1.study.plan import StudyPlan, Unit, expand, load_plan
from af1.study.runner import StudySummary, run_study

__all__ = ["StudyPlan", "StudySummary", "Unit", "expand", "load_plan", "run_study"]
