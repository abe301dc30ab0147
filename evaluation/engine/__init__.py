"""Studies of the engine's step: what building outputs and detokenizing cost
(``detokenize_cost``)."""
