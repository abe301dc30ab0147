"""Model families (OPT, Llama) over flat ragged batches, presets, and the loader."""
