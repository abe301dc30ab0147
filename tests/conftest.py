"""Suite-wide set-up: offline model hubs, no token-count cache in the home directory,
Triton's interpreter without a GPU, the gpu marker."""
from __future__ import annotations

import os

# Before anything imports triton or transformers: @triton.jit reads TRITON_INTERPRET when the
# decorator runs, and nothing may be fetched from a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Commands run by the tests keep no token counts in the user's cache (the cache's own tests
# give it a directory).
os.environ.setdefault("LENSERVE_CACHE_DIR", "off")

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
