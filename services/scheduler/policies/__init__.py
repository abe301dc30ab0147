"""Scheduling policies, by name."""
from __future__ import annotations

from services.scheduler.config import SchedulerConfig
from services.scheduler.policies.orca import OrcaPolicy, StaticPolicy
from services.scheduler.policies.vllm import VllmPolicy
from services.scheduler.policy import Policy

POLICIES: dict[str, type[Policy]] = {
    VllmPolicy.name: VllmPolicy,
    OrcaPolicy.name: OrcaPolicy,
    StaticPolicy.name: StaticPolicy,
}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator for policies defined elsewhere (ALISE, EconoServe, FluidInfer)."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, config: SchedulerConfig) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(sorted(POLICIES))}") from None
    return cls(config)
