"""The CPU tier of the KV cache: a bounded host block pool, asynchronous swaps, optional INT8."""
