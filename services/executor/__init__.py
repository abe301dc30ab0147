"""The executor: model weights, the device KV pool, one batched iteration per call."""
