"""Load a causal LM from the bundled SmolLM2, a local directory, a .gguf file or a cached hub id."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import shutil
import socket
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from af1.errors import Af1Error
from af1.models.adapter import ModelAdapter, family_of
from af1.models.bundled import BY_NAME, bundled_file
from af1.models.cache import cache_root
from af1.progress import enabled, note

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

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


SAFETENSORS_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2}
SAFETENSORS_BYTES |= {"U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_header(path: Path) -> dict[str, Any]:
    """The tensors a safetensors file declares (name -> dtype, shape, data_offsets), refused in one line where the
    file cannot hold its header or its tensors (cut short, or not safetensors at all)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n_header = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n_header <= size - 8:
            raise Af1Error(f"{path} is not a readable safetensors file: it is damaged or cut short (in its header)")
        try:
            header = json.loads(f.read(n_header))
        except (ValueError, UnicodeDecodeError) as exc:
            raise Af1Error(f"{path} is not a readable safetensors file: its header is damaged ({exc})") from exc
    if not isinstance(header, dict):
        raise Af1Error(f"{path} is not a readable safetensors file: its header is not a table of tensors")
    tensors = {name: t for name, t in header.items() if name != "__metadata__"}
    end = 0
    for name, t in tensors.items():
        try:
            start, stop = (int(x) for x in t["data_offsets"])
            need = SAFETENSORS_BYTES[t["dtype"]] * math.prod(int(d) for d in t["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise Af1Error(f"{path} is not a readable safetensors file: tensor {name} is damaged") from exc
        if stop - start != need:
            raise Af1Error(f"{path} is damaged: tensor {name} holds {stop - start:,} bytes, its shape needs {need:,}")
        end = max(end, stop)
    if end > size - 8 - n_header:
        raise Af1Error(f"{path} is cut short: its tensors need {end + 8 + n_header:,} bytes, the file has {size:,}")
    return tensors


def check_weights(directory: Path) -> None:
    """Refuse, in one line and before loading, a model directory whose safetensors weights are missing, cut short,
    damaged, or of other shapes than its config asks for."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise Af1Error(f"{index} is damaged: {type(exc).__name__}") from exc
        files = [directory / name for name in names]
        if missing := [f for f in files if not f.is_file()]:
            raise Af1Error(f"{directory} lacks {missing[0].name}, which {index.name} lists: the download is partial")
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickled = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt*")]
        why = f"only pickled weights ({pickled[0]}), which af1 never unpickles" if pickled else "no weights"
        raise Af1Error(f"{directory} has config.json but {why}: af1 reads model.safetensors (or its shards)")
    declared = {name: (path, t["shape"]) for path in files for name, t in safetensors_header(path).items()}
    expected = config_shapes(directory)
    for name, (path, shape) in declared.items():
        want = expected.get(name) or expected.get(f"model.{name}")  # a base model's checkpoint in a causal LM
        if want is not None and list(want) != list(shape):
            raise Af1Error(
                f"{path} does not fit {directory / 'config.json'}: {name} is {list(shape)}, the config makes it "
                f"{list(want)}"
            )


def config_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Each parameter's shape as the directory's config builds the model (on the meta device: no memory), or
    nothing where transformers cannot build it without the weights (the load then says why)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(directory)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:
        return {}
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def _gguf_to_safetensors(gguf: Path, digest: str) -> Path:
    """Dequantise a GGUF once into a float32 safetensors directory keyed by the file's sha256 (the file checked
    first, `check_gguf`); a converted copy found damaged is converted again."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target = cache_root() / "models" / digest[:32]
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        try:
            check_weights(target)
            return target
        except Af1Error as exc:
            note(f"af1's converted copy of {gguf.name} is damaged ({exc}); converting it again")
            shutil.rmtree(target, ignore_errors=True)
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


def resolve(spec: str) -> tuple[Path | str, dict[str, Any]]:
    """Where to load from (a directory or a hub id) and what to record about the source."""
    _quiet_transformers()
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
        check_weights(path)
        return path, {"source": "directory", "path": str(path.resolve())}
    names = ", ".join(BY_NAME)
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise Af1Error(f"unknown model path: {spec} (expected {names}, a model directory, a .gguf file or a hub id)")
    if spec.count("/") == 0:
        close = difflib.get_close_matches(spec.lower(), BY_NAME, n=1, cutoff=0.6)
        guess = f"did you mean {close[0]}? " if close else ""
        raise Af1Error(
            f"unknown model '{spec}': {guess}(a bundled name: {names}; a model directory; a .gguf file; or an "
            "org/name hub id)"
        )
    return _hub_snapshot(spec), {"source": "hub", "id": spec}


def _hub_snapshot(model_id: str) -> Path | str:
    """The cached snapshot directory of a hub id (checked like any directory), else the id itself once the hub is
    known to answer: no network, or HF_HUB_OFFLINE, is one line within seconds rather than minutes of retries."""
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # an id the hub would refuse is refused by the load, in its words
        cached = None
    if isinstance(cached, str):
        snapshot = Path(cached).parent
        check_weights(snapshot)
        return snapshot
    where = f"model '{model_id}' is not in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        raise Af1Error(f"{where} and HF_HUB_OFFLINE is set: download it where the hub is reachable")
    if unreachable := _hub_unreachable(constants.ENDPOINT):
        raise Af1Error(f"{where} and the hub {constants.ENDPOINT} is not reachable ({unreachable})")
    return model_id


def _hub_unreachable(endpoint: str, timeout: float = 5.0) -> str | None:
    """Why the hub cannot be reached (no name resolution, no connection), or None when it answers or a proxy is
    set (the proxy decides, not this probe)."""
    from urllib.parse import urlsplit

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlsplit(endpoint)
    try:
        socket.create_connection((url.hostname or "", url.port or 443), timeout=timeout).close()
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def check_load_options(dtype: str, device_map: str | dict[str, Any] | None) -> None:
    """Refuse an unknown dtype or device map before anything loads."""
    if dtype not in DTYPES:
        raise Af1Error(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}")
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise Af1Error(f"unknown device map '{device_map}'; choose one of {', '.join(DEVICE_MAPS)}")


def _quiet_transformers() -> None:
    """transformers' own bars (loading, de-quantising) only where af1's are bars: on a terminal, progress on."""
    from transformers.utils import logging as hf_logging

    if not enabled() or not sys.stderr.isatty():
        hf_logging.disable_progress_bar()


@cache
def _tokenizer(where: str, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """A tokenizer read once per process (the task is read with it before the model loads, then the model keeps it):
    af1 never changes a tokenizer, so one object serves both."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)


def load_tokenizer(spec: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """A model's tokenizer alone, from where its model would load: a task can be read and checked before the
    model's weights are."""
    where, _ = resolve(spec)
    try:
        return _tokenizer(str(where), trust_remote_code)
    except Exception as exc:  # transformers raises many types; the user needs one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise Af1Error(f"cannot load the tokenizer of '{spec}': {first}") from exc


def load_model(
    spec: str = "smollm2",
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    device_map: str | dict[str, Any] | None = None,
) -> LoadedModel:
    """Load a causal LM (safetensors only; GGUF converted once) and its tokenizer, check its family, give its adapter.
    `attn_implementation` None: transformers picks; `device_map`: accelerate places (and offloads) the model's parts."""
    from transformers import AutoModelForCausalLM

    check_load_options(dtype, device_map)
    where, info = resolve(spec)
    common: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    placement: dict[str, Any] = {}
    if device_map is not None:
        placement = {"device_map": device_map, "offload_folder": str(cache_root() / "offload" / _slug(spec))}
    try:
        tokenizer = _tokenizer(str(where), trust_remote_code)
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
        raise Af1Error(f"cannot load model '{spec}': {first}") from exc
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
