"""Token counts kept between runs: the same requests as tokenizing, never a stale entry, and an
unreadable file rebuilt rather than fatal."""
from __future__ import annotations

import numpy as np
import pytest

from lenserve.workloads import Sample, SampleConfig, sample_requests
from lenserve.workloads import sampling
from lenserve.workloads.token_cache import (
    LazyTokenizer,
    TokenCache,
    default_cache_dir,
    tokenizer_fingerprint,
)


@pytest.fixture(scope="module")
def tok():
    from services.executor.models.loader import preset_tokenizer
    return preset_tokenizer()


def samples(n: int, salt: str = "") -> list[Sample]:
    return [Sample(prompt=f"Question {i}{salt}: " + "why is the sky blue " * (1 + i % 6),
                   reference="Because of Rayleigh scattering, mostly. " * (1 + i % 9))
            for i in range(n)]


def picked(chosen):
    return [(r.request_id, r.prompt_token_ids, r.output_len, s.prompt) for r, s in chosen]


def no_tokenizing(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("tokenized although every text was cached")
    monkeypatch.setattr(sampling, "_encode_batch", refuse)


def test_cached_counts_are_the_tokenizers(tok, tmp_path, monkeypatch):
    data, cfg = samples(60), SampleConfig(num_prompts=200, seed=3, repeat=True)
    fresh = picked(sample_requests(data, cfg, tok))
    cold = picked(sample_requests(data, cfg, tok, cache=TokenCache.for_tokenizer(tok, tmp_path)))
    assert cold == fresh
    no_tokenizing(monkeypatch)
    warm = picked(sample_requests(data, cfg, tok, cache=TokenCache.for_tokenizer(tok, tmp_path)))
    assert warm == fresh


def test_a_changed_dataset_does_not_reuse_stale_counts(tok, tmp_path):
    cfg = SampleConfig(num_prompts=20, seed=1)
    sample_requests(samples(40), cfg, tok, cache=TokenCache.for_tokenizer(tok, tmp_path))
    edited = samples(40)
    edited[5] = Sample(prompt=edited[5].prompt + " and at sunset?",
                       reference=edited[5].reference * 3)
    edited[9] = Sample(prompt=edited[9].prompt, reference="Short.")
    cached = sample_requests(edited, cfg, tok, cache=TokenCache.for_tokenizer(tok, tmp_path))
    assert picked(cached) == picked(sample_requests(edited, cfg, tok))


def test_another_tokenizer_has_its_own_counts(tok, tmp_path):
    from transformers import AutoTokenizer
    stock = AutoTokenizer.from_pretrained(tok.name_or_path)     # [CLS] ... [SEP]: other ids
    assert tokenizer_fingerprint(stock) != tokenizer_fingerprint(tok)
    data, cfg = samples(30), SampleConfig(num_prompts=10)
    sample_requests(data, cfg, tok, cache=TokenCache.for_tokenizer(tok, tmp_path))
    other = sample_requests(data, cfg, stock, cache=TokenCache.for_tokenizer(stock, tmp_path))
    assert picked(other) == picked(sample_requests(data, cfg, stock))
    assert picked(other) != picked(sample_requests(data, cfg, tok))
    assert len(list((tmp_path / "token-counts").iterdir())) == 2


@pytest.mark.parametrize("content", [b"not a zip file at all", b"PK\x03\x04truncated", b""])
def test_an_unreadable_file_is_rebuilt(tok, tmp_path, monkeypatch, content):
    data, cfg = samples(30), SampleConfig(num_prompts=10)
    path = TokenCache.for_tokenizer(tok, tmp_path).path
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.warns(UserWarning, match="ignoring unreadable token cache"):
        cache = TokenCache.for_tokenizer(tok, tmp_path)
    fresh = picked(sample_requests(data, cfg, tok))
    assert picked(sample_requests(data, cfg, tok, cache=cache)) == fresh
    no_tokenizing(monkeypatch)                                   # rewritten, and read back
    again = sample_requests(data, cfg, tok, cache=TokenCache.for_tokenizer(tok, tmp_path))
    assert picked(again) == fresh


def test_inconsistent_arrays_are_ignored(tok, tmp_path):
    data, cfg = samples(30), SampleConfig(num_prompts=10)
    cache = TokenCache.for_tokenizer(tok, tmp_path)
    sample_requests(data, cfg, tok, cache=cache)
    with np.load(cache.path) as f:
        arrays = dict(f)
    arrays["prompt_offsets"] = arrays["prompt_offsets"][:-1]     # one offset short
    with open(cache.path, "wb") as out:
        np.savez(out, **arrays)
    with pytest.warns(UserWarning, match="inconsistent"):
        again = TokenCache.for_tokenizer(tok, tmp_path)
    assert again.prompts == {} and again.replies == {}
    assert picked(sample_requests(data, cfg, tok, cache=again)) == picked(
        sample_requests(data, cfg, tok))


def test_cache_can_be_turned_off(monkeypatch, tmp_path, tok):
    monkeypatch.setenv("LENSERVE_CACHE_DIR", "off")
    assert default_cache_dir() is None
    assert TokenCache.for_tokenizer(tok, None) is None
    monkeypatch.setenv("LENSERVE_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("LENSERVE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "lenserve"


def test_tokenizers_without_a_definition_are_not_cached(tmp_path):
    from tests.workloads.test_sampling import WordTokenizer
    assert TokenCache.for_tokenizer(WordTokenizer(), tmp_path) is None


def test_a_lazy_tokenizer_is_loaded_only_for_what_the_cache_lacks(tok, tmp_path):
    loads = []

    def lazy(source="src"):
        return LazyTokenizer(lambda: loads.append(1) or tok, source)

    data, cfg = samples(30), SampleConfig(num_prompts=20, seed=0)
    expected = picked(sample_requests(data, cfg, tok))
    first = lazy()
    cache = TokenCache.for_tokenizer(first, tmp_path)      # fingerprint not known yet: loads
    assert loads == [1] and cache.fingerprint == tokenizer_fingerprint(tok)
    assert picked(sample_requests(data, cfg, first, cache=cache)) == expected
    cache.save()
    again = lazy()
    warm = picked(sample_requests(data, cfg, again, cache=TokenCache.for_tokenizer(again, tmp_path)))
    assert warm == expected and loads == [1]               # all counted: never loaded
    more = lazy()
    sample_requests(samples(30, salt="new"), cfg, more, cache=TokenCache.for_tokenizer(more, tmp_path))
    assert loads == [1, 1]                                  # new texts: loaded to count them
    # A damaged memo is not trusted: the tokenizer is loaded and the memo rewritten.
    (memo,) = (tmp_path / "tokenizer-fingerprints").iterdir()
    memo.write_text("not a fingerprint")
    assert TokenCache.for_tokenizer(lazy(), tmp_path).fingerprint == tokenizer_fingerprint(tok)
    assert loads == [1, 1, 1] and memo.read_text() == tokenizer_fingerprint(tok)
    # Another source has its own memo.
    TokenCache.for_tokenizer(lazy("other"), tmp_path)
    assert loads == [1, 1, 1, 1]
