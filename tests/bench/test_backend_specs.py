"""Parsing --backends and OpenAI URLs: typos fail before anything loads."""
from __future__ import annotations

import pytest

from lenserve.bench.backends import BackendOptions, parse_backend_spec, parse_backends
from lenserve.bench.backends.openai_compat import completions_url


def test_known_forms():
    specs = parse_backends("lenserve:alise, hf-static,hf-cb,openai:http://127.0.0.1:8000/v1")
    assert [(s.kind, s.arg) for s in specs] == [
        ("lenserve", "alise"), ("hf-static", None), ("hf-cb", None),
        ("openai", "http://127.0.0.1:8000/v1")]


@pytest.mark.parametrize("text", ["vllm", "lenserve", "lenserve:", "openai:", "hf-static:x", "tgi:url"])
def test_unknown_backends_are_named(text):
    with pytest.raises(ValueError, match="unknown backend.*lenserve:<policy>"):
        parse_backend_spec(text)


def test_empty_or_duplicate_lists_are_refused():
    with pytest.raises(ValueError, match="names no backend"):
        parse_backends(" , ")
    with pytest.raises(ValueError, match="twice"):
        parse_backends("hf-cb,hf-cb")


@pytest.mark.parametrize("base", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/completions"])
def test_completions_url(base):
    assert completions_url(base) == "http://h:1/v1/completions"


def test_bad_url_is_refused():
    with pytest.raises(ValueError, match="http"):
        completions_url("localhost-8000")


def test_options_check_their_sizes():
    with pytest.raises(ValueError, match="hf-batch-size must be >= 1"):
        BackendOptions(hf_batch_size=0)
