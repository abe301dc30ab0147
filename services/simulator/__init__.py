"""The simulator's parts: iteration features, cost models (fitted to a measured profile, or
an analytical roofline), the cost-model executor and a virtual clock. The serving core and
the policies are the real ones (``services/scheduler``); only the executor differs."""
