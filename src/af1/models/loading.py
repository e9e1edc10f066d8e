"""Load a causal LM from the bundled SmolLM2, a local directory, a .gguf file or a cached hub id."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from af1.errors import Af1Error
from af1.models.adapter import ModelAdapter, family_of
from af1.models.bundled import BY_NAME, bundled_file
from af1.models.cache import cache_root
from af1.progress import enabled

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """A model, its tokenizer, its family adapter and where it came from."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    adapter: ModelAdapter
    info: dict[str, Any] = field(default_factory=dict)


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_gguf(path: Path) -> None:
    """Refuse, in one line and before any de-quantising, a GGUF whose header or tensors the file cannot hold (cut
    short, or not a GGUF at all)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, OSError, struct.error) as exc:
        raise Af1Error(
            f"{path} is not a readable GGUF file: it is damaged or cut short ({str(exc).splitlines()[0][:80]})"
        ) from exc
    size = path.stat().st_size
    if end > size:
        raise Af1Error(f"{path} is cut short: its tensors need {end:,} bytes, the file has {size:,}")


def _gguf_to_safetensors(gguf: Path, digest: str) -> Path:
    """Dequantise a GGUF once into a float32 safetensors directory keyed by the file's sha256 (the file checked
    first, `check_gguf`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target = cache_root() / "models" / digest[:32]
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    check_gguf(gguf)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise Af1Error(f"cannot load {gguf}: {str(exc).splitlines()[0]}") from exc
    config = AutoConfig.for_model(**{k: v for k, v in quantised.config.to_dict().items() if k != "quantization_config"})
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "source.txt").write_text(f"{gguf}\nsha256 {digest}\n")
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
            # another process finished the same conversion first: its copy is the same file
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _resolve(spec: str) -> tuple[Path | str, dict[str, Any]]:
    """Where to load from (a directory or a hub id) and what to record about the source."""
    if spec in BY_NAME:
        gguf, digest = bundled_file(spec)
        row = BY_NAME[spec]
        info = {"source": "bundled", "file": str(gguf), "sha256": digest, "packages": list(row.requirements)}
        return _gguf_to_safetensors(gguf, digest), {**info, "licence": row.licence, "description": row.description}
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise Af1Error(f"no such GGUF file: {spec}")
        digest = sha256_of(path)
        return _gguf_to_safetensors(path, digest), {"source": "gguf", "file": str(path), "sha256": digest}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise Af1Error(f"{spec} is a directory without config.json: not a HF model directory")
        return path, {"source": "directory", "path": str(path.resolve())}
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        names = ", ".join(BY_NAME)
        raise Af1Error(f"unknown model path: {spec} (expected {names}, a model directory, a .gguf file or a hub id)")
    return spec, {"source": "hub", "id": spec}


def load_model(
    spec: str = "smollm2",
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    device_map: str | dict[str, Any] | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer, check its family, and describe it with an adapter.

    Only safetensors weights are read (GGUF files are converted once into safetensors).
    `attn_implementation` None lets transformers choose (sdpa where the family has it, else eager).
    `device_map` ('auto', 'balanced', 'sequential' or a module -> device dict) lets accelerate place the
    model's parts, offloading to CPU or disk what does not fit; every intervention follows the placement.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not enabled():  # transformers' own loading bars follow af1's: none off a terminal
        hf_logging.disable_progress_bar()
    if dtype not in DTYPES:
        raise Af1Error(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}")
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise Af1Error(f"unknown device map '{device_map}'; choose one of {', '.join(DEVICE_MAPS)}")
    where, info = _resolve(spec)
    common: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    placement: dict[str, Any] = {}
    if device_map is not None:
        placement = {"device_map": device_map, "offload_folder": str(cache_root() / "offload" / _slug(spec))}
    if info["source"] == "hub":
        common["local_files_only"] = bool(os.environ.get("HF_HUB_OFFLINE")) or _hub_cached(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **common)
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(  # pyright: ignore[reportAssignmentType]
            where,
            dtype=DTYPES[dtype],
            attn_implementation=attn_implementation,
            use_safetensors=True,
            **placement,
            **common,
        )
    except Af1Error:
        raise
    except Exception as exc:  # transformers raises many types; the user needs one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        hint = " (model hubs are unreachable here: use a local directory or .gguf)" if info["source"] == "hub" else ""
        raise Af1Error(f"cannot load model '{spec}': {first}{hint}") from exc
    family_of(model)
    if device_map is None:
        model.to(device)  # pyright: ignore  (transformers types its decorated `to` oddly)
    model.eval()
    model.requires_grad_(False)
    info.update(
        spec=spec,
        model_type=model.config.model_type,
        dtype=dtype,
        attn_implementation=model.config._attn_implementation,
        n_layers=model.config.num_hidden_layers,
    )
    if (device_map_used := getattr(model, "hf_device_map", None)) is not None:
        info["device_map"] = {name: str(device) for name, device in device_map_used.items()}
    return LoadedModel(model, tokenizer, ModelAdapter(model), info)


def _slug(spec: str) -> str:
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def _hub_cached(model_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:
        return False
