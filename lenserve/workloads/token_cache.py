"""Token counts kept between runs, so a dataset is tokenized once per tokenizer.

Counting a large dataset (ShareGPT: 37 MB of prompts and replies) takes longer than simulating
it, and every run with the same tokenizer computes the same numbers. Entries are keyed by a
digest of the text itself, so an edited or another dataset simply misses (only new texts are
tokenized), and each tokenizer has its own file, named after a digest of its full definition
(vocabulary, normalizer, post-processor, library version): another tokenizer never reads
another's counts. A prompt keeps its ids (they are the request); a reply keeps its length.

The directory is ``$LENSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/lenserve``, else
``~/.cache/lenserve``; ``LENSERVE_CACHE_DIR=off`` (or ``--no-token-cache``) turns it off. A file
that cannot be read is ignored with a warning and rewritten.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

_FORMAT = 1
_KEY = 16          # bytes of a text's digest
OFF = ("off", "0", "none", "false")


def default_cache_dir() -> Path | None:
    """Where token counts are kept, or None when turned off."""
    env = os.environ.get("LENSERVE_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in OFF or not env.strip() else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lenserve"


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """A digest of everything that decides a fast tokenizer's ids, or None for tokenizers
    whose definition cannot be read (those are not cached)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(tokenizer, "model_max_length"):
        return None
    try:
        definition = backend.to_str()
    except Exception:       # noqa: BLE001 - a tokenizer that cannot describe itself is not cached
        return None
    import tokenizers
    import transformers
    h = hashlib.blake2b(digest_size=20)
    for part in (f"format {_FORMAT}", type(tokenizer).__qualname__, tokenizers.__version__,
                 transformers.__version__, definition):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


class LazyTokenizer:
    """A tokenizer loaded on first use. Loading a Hugging Face tokenizer imports transformers
    and torch (seconds); a run whose texts are all counted in the cache never needs it.
    ``source`` names what the tokenizer is built from (files, library versions, the code that
    sets it up): under it the cache remembers the fingerprint, so a later run finds its counts
    without loading the tokenizer. None: not remembered (loaded for the fingerprint)."""

    def __init__(self, load: Callable[[], Any], source: str | None = None):
        self._load, self.source, self._tokenizer = load, source, None

    def loaded(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self._load()
        return self._tokenizer

    def __getattr__(self, name: str) -> Any:     # only for what this class does not define
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.loaded(), name)

    def __call__(self, *args, **kwargs):
        return self.loaded()(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.loaded())


def _remembered_fingerprint(tokenizer: LazyTokenizer, directory: Path) -> str | None:
    memo = directory / "tokenizer-fingerprints" / f"{tokenizer.source}.txt"
    try:
        remembered = memo.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        remembered = ""
    if len(remembered) == 40 and all(c in "0123456789abcdef" for c in remembered):
        return remembered
    fingerprint = tokenizer_fingerprint(tokenizer.loaded())
    if fingerprint:
        try:
            _write_atomic(memo, lambda out: out.write(fingerprint.encode("ascii")))
        except OSError as exc:
            warnings.warn(f"cannot remember the tokenizer's fingerprint in {memo} ({exc})",
                          stacklevel=3)
    return fingerprint


def _write_atomic(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """``write`` the file through a temporary one beside it: a concurrent reader sees the old
    file or the new, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_KEY).digest()


def _join_keys(keys: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), _KEY)


def _split_keys(keys: np.ndarray) -> list[bytes]:
    raw = keys.tobytes()
    return [raw[i:i + _KEY] for i in range(0, len(raw), _KEY)]


class TokenCache:
    """Prompt ids and reply lengths of one tokenizer, read from and written back to
    ``directory``. ``get_*`` return None for a text not seen before; ``put_*`` add entries;
    ``save`` writes the file when something was added."""

    def __init__(self, directory: str | os.PathLike, fingerprint: str):
        self.path = Path(directory) / "token-counts" / f"{fingerprint}.npz"
        self.fingerprint = fingerprint
        self.prompts: dict[bytes, tuple[int, ...]] = {}
        self.replies: dict[bytes, int] = {}
        self.added = 0
        self._load()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, directory: str | os.PathLike | None
                      ) -> TokenCache | None:
        """The cache of ``tokenizer`` in ``directory``; None when off or not cacheable. A
        ``LazyTokenizer`` with a source is not loaded when its fingerprint was seen before."""
        if directory is None:
            return None
        if isinstance(tokenizer, LazyTokenizer) and tokenizer.source:
            fingerprint = _remembered_fingerprint(tokenizer, Path(directory))
        else:
            fingerprint = tokenizer_fingerprint(tokenizer)
        return cls(directory, fingerprint) if fingerprint else None

    def _load(self) -> None:
        if not self.path.is_file():
            return
        try:
            with np.load(self.path, allow_pickle=False) as f:
                if str(f["fingerprint"]) != self.fingerprint or int(f["format"]) != _FORMAT:
                    raise ValueError("written for another tokenizer or format")
                pkeys, offsets, ids = f["prompt_keys"], f["prompt_offsets"], f["prompt_ids"]
                rkeys, lens = f["reply_keys"], f["reply_lens"]
                if (pkeys.dtype != np.uint8 or rkeys.dtype != np.uint8
                        or pkeys.shape[1:] != (_KEY,) or rkeys.shape[1:] != (_KEY,)
                        or len(offsets) != len(pkeys) + 1 or len(rkeys) != len(lens)
                        or (len(offsets) and (offsets[0] != 0 or offsets[-1] != len(ids)))
                        or np.any(np.diff(offsets) < 0)):
                    raise ValueError("inconsistent arrays")
                flat = ids.tolist()
                bounds = offsets.tolist()
                prompts = {k: tuple(flat[bounds[i]:bounds[i + 1]])
                           for i, k in enumerate(_split_keys(pkeys))}
                replies = dict(zip(_split_keys(rkeys), lens.tolist()))
        except Exception as exc:  # noqa: BLE001 - any unreadable file is rebuilt, never fatal
            warnings.warn(f"ignoring unreadable token cache {self.path} ({exc}); it will be "
                          f"rewritten", stacklevel=3)
            self.added = 1          # rewrite it even if nothing new is counted
            return
        self.prompts, self.replies = prompts, replies

    def get_prompt(self, text: str) -> tuple[int, ...] | None:
        return self.prompts.get(text_key(text))

    def get_reply(self, text: str) -> int | None:
        return self.replies.get(text_key(text))

    def put_prompt(self, text: str, ids: tuple[int, ...]) -> None:
        self.prompts[text_key(text)] = tuple(ids)
        self.added += 1

    def put_reply(self, text: str, length: int) -> None:
        self.replies[text_key(text)] = int(length)
        self.added += 1

    def save(self) -> None:
        """Write the entries (atomically: a concurrent reader sees the old file or the new)."""
        if not self.added:
            return
        pkeys = list(self.prompts)
        lengths = [len(self.prompts[k]) for k in pkeys]
        offsets = np.zeros(len(pkeys) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = [t for k in pkeys for t in self.prompts[k]]
        ids = np.asarray(flat, dtype=np.int64)
        if len(ids) and 0 <= ids.min() and ids.max() < 2 ** 31:
            ids = ids.astype(np.int32)
        rkeys = list(self.replies)
        lens = np.array([self.replies[k] for k in rkeys], dtype=np.int64)
        try:
            _write_atomic(self.path, lambda out: np.savez(
                out, format=np.int64(_FORMAT), fingerprint=np.str_(self.fingerprint),
                prompt_keys=_join_keys(pkeys), prompt_offsets=offsets, prompt_ids=ids,
                reply_keys=_join_keys(rkeys), reply_lens=lens))
        except OSError as exc:      # a read-only or full disk costs the next run time, no more
            warnings.warn(f"could not write the token cache {self.path}: {exc}", stacklevel=2)
            return
        self.added = 0
