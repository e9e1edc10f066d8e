"""af1: where and when a language model does mental arithmetic."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from af1.errors import Af1Error

if TYPE_CHECKING:
    from af1.models import LoadedModel, ModelAdapter, load_model

    __version__: str

__all__ = ["Af1Error", "LoadedModel", "ModelAdapter", "__version__", "load_model"]


def __getattr__(name: str) -> Any:
    """The model names and the version (kept with the results' provenance) import torch, so only when asked for:
    `af1 --help` and plan checks stay fast."""
    if name == "__version__":
        from af1.results import VERSION

        return VERSION
    if name in {"LoadedModel", "ModelAdapter", "load_model"}:
        from af1 import models

        return getattr(models, name)
    raise AttributeError(f"module 'af1' has no attribute {name!r}")
