"""The packed encoder gives sentence-transformers' vectors, in input order, or stands aside."""
import numpy as np
import pytest

from services.predictor import packed_encoder
from services.predictor.config import EmbedderConfig
from services.predictor.embedder import Embedder
from services.predictor.packed_encoder import PackedBert

PROMPTS = [
    "Write a haiku about autumn.",
    "",
    "   ",
    "Explain, step by step and with examples, how a hash map resolves collisions, then "
    "compare open addressing with chaining for a workload of many deletions. " * 3,
    "¿Qué hora es? 今何時ですか",
    "hi",
    "Summarize the following text: the quick brown fox jumps over the lazy dog " * 8,
]


def _reference(st_model, texts):
    return st_model.encode(texts, batch_size=4, convert_to_tensor=True,
                           show_progress_bar=False, normalize_embeddings=True).float().numpy()


@pytest.fixture(scope="module")
def fp32():
    packed = Embedder(EmbedderConfig(max_seq_length=32, precision="fp32"))
    padded = Embedder(EmbedderConfig(max_seq_length=32, precision="fp32", packed=False))
    return packed, padded


def test_packed_vectors_are_the_padded_ones_in_input_order(fp32, monkeypatch):
    packed, padded = fp32
    assert packed._packed is not None and padded._packed is None
    # Several passes of sorted prompts: the order must come back as given.
    monkeypatch.setattr(packed_encoder, "PASS_TOKENS", 40)
    got, want = packed._encode(PROMPTS), padded._encode(PROMPTS)
    assert got.shape == (len(PROMPTS), packed.dim)
    np.testing.assert_allclose(got, want, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    flipped = packed._encode(PROMPTS[::-1])
    np.testing.assert_allclose(flipped[::-1], got, atol=2e-6)
    assert packed._packed.encode([]).shape == (0, packed.dim)


def test_packed_vectors_with_tails_match_the_padded_ones():
    config = dict(max_seq_length=32, precision="fp32", tail_chars=40)
    packed = Embedder(EmbedderConfig(**config))
    padded = Embedder(EmbedderConfig(**config, packed=False))
    np.testing.assert_allclose(packed._encode(PROMPTS), padded._encode(PROMPTS), atol=2e-6)
    # The two paths do not share remembered vectors.
    assert packed.cache is not padded.cache


def test_a_shallower_longer_window_encoder_is_packed_exactly(fp32):
    # What finetune.py writes by default: the first 4 layers, a 64-token window.
    import copy

    st = copy.deepcopy(fp32[0].model)
    st[0].auto_model.encoder.layer = st[0].auto_model.encoder.layer[:4]
    st.max_seq_length = 64
    runner = PackedBert.wrap(st)
    assert runner is not None
    np.testing.assert_allclose(runner.encode(PROMPTS).numpy(), _reference(st, PROMPTS),
                               atol=2e-6)


def test_other_layouts_keep_sentence_transformers_passes(fp32):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling

    base = fp32[0].model
    cls = SentenceTransformer(modules=[base[0], Pooling(384, pooling_mode="cls"), Normalize()],
                              device="cpu")
    assert PackedBert.wrap(cls) is None
    assert PackedBert.wrap(SentenceTransformer(modules=[base[0], base[1]], device="cpu")) is None
    assert PackedBert.wrap(object()) is None


def test_the_fine_tune_trains_packed_with_the_padded_gradients_and_dropout():
    import torch

    from services.predictor.proxy import ProxyConfig, ProxyRegressor

    model = ProxyRegressor(ProxyConfig(max_seq_length=16, num_layers=2))
    assert model.packed
    torch.nn.init.normal_(model.head.weight, std=0.1)
    params = [model.encoder.encoder.layer[0].attention.self.query.weight,
              model.encoder.embeddings.word_embeddings.weight, model.head.weight]

    def grads(packed):
        model.packed = packed
        loss = model(PROMPTS).square().sum()
        return loss, torch.autograd.grad(loss, params)

    model.eval()                                    # no dropout: the two paths agree
    (loss, got), (want_loss, want) = grads(True), grads(False)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    model.train()                                   # dropout on, packed as in `fit`
    model.packed = True
    torch.manual_seed(0)
    first = model(PROMPTS)
    assert not torch.allclose(first, model(PROMPTS))
