"""Attention backends over the paged KV cache, behind one interface."""
