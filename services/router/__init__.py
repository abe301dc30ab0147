"""The router: places each request on one of N scheduler replicas (``core``, ``policies``)
behind the scheduler's own gRPC contract (``servicer``), so the gateway and the SDK talk to it
as to one scheduler."""
