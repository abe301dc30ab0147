"""How closely ``lenserve simulate`` follows ``lenserve bench`` on one machine (``fidelity``,
and ``fidelity.sh`` to profile, run and compare in one go)."""
