"""Models: loading and one adapter per architecture family."""

from af1.models.adapter import LayerInputs, ModelAdapter, family_of
from af1.models.families import FAMILIES, Family, supported_model_types
from af1.models.loading import LoadedModel, load_model

__all__ = [
    "FAMILIES",
    "Family",
    "LayerInputs",
    "LoadedModel",
    "ModelAdapter",
    "family_of",
    "load_model",
    "supported_model_types",
]
