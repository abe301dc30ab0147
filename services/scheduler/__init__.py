"""The scheduler: request state, queues, the policy and device KV block accounting.

The core is pure: it never reads a clock, opens a socket or starts a thread; callers pass
``now`` in. The in-process engine, the gRPC scheduler service and the simulator all drive
the same ``Scheduler`` and the same policy objects."""
