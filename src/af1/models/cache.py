"""Where af1 keeps what it computes once (converted models, means): AF1_CACHE_DIR, else ~/.cache/af1."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("AF1_CACHE_DIR") or Path.home() / ".cache" / "af1"
    return Path(root)
