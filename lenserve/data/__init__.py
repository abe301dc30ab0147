"""Workload data shipped with lenserve (see README.md for origins and licences)."""
