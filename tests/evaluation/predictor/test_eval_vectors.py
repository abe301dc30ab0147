import numpy as np
import pytest

from evaluation.predictor.eval_vectors import VectorReuse
from services.predictor.config import EmbedderConfig

PROMPTS = ["Name three rivers of Europe", "Write a long essay on the history of Rome",
           "Name three rivers of Europe", "Translate 'good morning' into French"]


def test_bulk_vectors_are_kept_for_a_later_run_of_the_same_encoder(tmp_path):
    # fp32: on a CPU with native bf16 the default precision is bf16, and a batch of other
    # prompts (the wrapper embeds each distinct prompt once) moves a vector by up to 1e-3.
    config = EmbedderConfig(max_seq_length=16, precision="fp32")
    reuse = VectorReuse(str(tmp_path))
    first = reuse.embedder(config, 4096)
    fresh = first.encode(PROMPTS)
    np.testing.assert_allclose(fresh, first._base.encode(PROMPTS), atol=1e-5)
    reuse.save()
    assert len(list(tmp_path.glob("*.npz"))) == 1

    later = VectorReuse(str(tmp_path)).embedder(config, 4096)
    later._base.encode = None  # a later run must not need the encoder for known prompts
    np.testing.assert_array_equal(later.encode(PROMPTS[::-1]), fresh[::-1])


def test_served_paths_and_other_encoder_windows_still_embed(tmp_path):
    reuse = VectorReuse(str(tmp_path))
    short = reuse.embedder(EmbedderConfig(max_seq_length=16), 4096)
    short.encode(PROMPTS)
    calls = []
    real = short._base.encode
    short._base.encode = lambda prompts, cache=False: calls.append(cache) or real(prompts,
                                                                                 cache=cache)
    short.encode(PROMPTS[:1], cache=True)  # predict / observe: timed, so never remembered
    assert calls == [True]
    longer = reuse.embedder(EmbedderConfig(max_seq_length=32), 4096)
    assert longer._memo is not short._memo and not longer._memo


def test_a_file_given_as_the_directory_is_refused(tmp_path):
    path = tmp_path / "vectors.npz"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        VectorReuse(str(path))
