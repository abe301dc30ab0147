"""Demonstrations of the gRPC service split under faults (``fault_demo``)."""
