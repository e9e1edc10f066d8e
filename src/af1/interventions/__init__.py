"""Intervention primitives over an unmodified HF model, each a context manager."""

from af1.interventions.attention import LayerPlan, attention_plans
from af1.interventions.masks import ABP_VARIANTS, abp_masks, last_token_knockout, self_and_context
from af1.interventions.means import PositionMeans, cached_means, compute_means
from af1.interventions.residual import edit_residual
from af1.interventions.sites import FINAL, Site, head_inputs, mlp_output, record, residual

__all__ = [
    "ABP_VARIANTS",
    "FINAL",
    "LayerPlan",
    "PositionMeans",
    "Site",
    "abp_masks",
    "attention_plans",
    "cached_means",
    "compute_means",
    "edit_residual",
    "head_inputs",
    "last_token_knockout",
    "mlp_output",
    "record",
    "residual",
    "self_and_context",
]
