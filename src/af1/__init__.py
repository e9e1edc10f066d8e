"""af1: where and when a language model does mental arithmetic."""

from af1.errors import Af1Error
from af1.models import LoadedModel, ModelAdapter, load_model

__version__ = "0.1.0"
__all__ = ["Af1Error", "LoadedModel", "ModelAdapter", "__version__", "load_model"]
