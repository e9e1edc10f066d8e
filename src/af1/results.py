"""Results as data: atomic writes and the provenance every result carries."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Self

VERSION = metadata.version("af1")  # declared once, in pyproject.toml


class Part(BaseModel):
    """A method's own part of a result, where its fields are declared once: the experiment's `Result` extends it
    (and the setup's description, itself a part); an undeclared field is refused."""

    model_config = ConfigDict(extra="forbid")

    warnings: list[str] = Field(default_factory=list)  # what its numbers should be read with

    @classmethod
    def of(cls, *parts: Part, **more: Any) -> Self:
        """This part (or result) made of other parts' fields, as they are, and `more`: a field two of them give is
        refused, except the warnings, which are kept together in order."""
        fields: dict[str, Any] = {}
        warnings: list[str] = []
        for given in [*(dict(part) for part in parts), more]:
            warnings += given.pop("warnings", [])
            if twice := fields.keys() & given.keys():
                raise ValueError(f"{cls.__name__}: {sorted(twice)} given twice")
            fields |= given
        return cls(**fields, warnings=warnings)


def git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def provenance(model_info: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """Where a result came from: model source, library versions, machine, git revision, time."""
    import transformers

    from af1 import threads

    return {
        "model": model_info or {},
        "af1_version": VERSION,
        "git_revision": git_revision(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count()},
        "threads": {"threads": torch.get_num_threads(), "from": threads.CHOSEN.get("from", "torch's default")},
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _clean(value.tolist())
    if isinstance(value, BaseModel):  # a typed value inside a method's result (ProblemInputs, AF1Config)
        return _clean(value.model_dump())
    if isinstance(value, Path):
        return str(value)
    return value


def to_json(data: Any) -> str:
    return json.dumps(_clean(data), indent=2)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write a file so that readers see either the old or the whole new content."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, data: Any) -> Path:
    return write_atomic(path, to_json(data) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())
