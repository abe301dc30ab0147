"""A random-weight model with a byte-level BPE tokenizer (trained here, in a second), for the
sampling tests: the presets' WordPiece tokenizer decodes with spaces between pieces, so text a
grammar accepts token by token would not read back as the same text."""
from __future__ import annotations

from functools import lru_cache

CORPUS = ['{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true, "v": null}',
          "[1, 2.5, -3e2, {\"a\": {\"b\": []}}]", "Hello world, hello JSON.",
          "The quick brown fox jumps over the lazy dog 0123456789"] * 20


@lru_cache(maxsize=1)
def byte_bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def json_executor(model: str = "opt-tiny", **kwargs):
    """An in-process executor of a preset whose tokenizer is the byte-level one, EOS its
    ``<eos>`` (id 0)."""
    import dataclasses

    from services.executor.models.loader import load_model
    from services.executor.runner import InProcessExecutor

    tok = byte_bpe_tokenizer()
    loaded = dataclasses.replace(load_model(model), tokenizer=tok,
                                 eos_token_id=tok.eos_token_id,
                                 eos_token_ids=(tok.eos_token_id,))
    return InProcessExecutor(loaded, **kwargs)
