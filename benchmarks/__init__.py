"""One command per published figure: each ``benchmarks/NAME.py`` runs lenserve's own commands,
then writes ``docs/results/NAME.json`` (stamped), ``NAME.png``, ``NAME.md`` (the tables) and its
section of ``docs/results.md``. Run them from a checkout: ``python3 benchmarks/NAME.py``."""
