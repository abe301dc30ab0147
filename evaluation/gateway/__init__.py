"""Studies of the OpenAI-compatible gateway: the time it adds (``overhead``), its behaviour
under 10x overload (``overload``), and a full schema-driven fuzz run (``fuzz``)."""
