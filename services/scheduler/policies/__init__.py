"""Scheduling policies, by name."""
from __future__ import annotations

from services.scheduler.config import SchedulerConfig
from services.scheduler.policies.alise import AliseBoundPolicy, AlisePolicy, OraclePolicy
from services.scheduler.policies.alise_fluid import AliseFluidPolicy
from services.scheduler.policies.econoserve import EconoServePolicy
from services.scheduler.policies.fastserve import FastServePolicy
from services.scheduler.policies.fluidinfer import FluidInferPolicy
from services.scheduler.policies.ltr import LtrPolicy
from services.scheduler.policies.multires import MultiResPolicy
from services.scheduler.policies.orca import OrcaPolicy, StaticPolicy
from services.scheduler.policies.sarathi import SarathiPolicy
from services.scheduler.policies.ssjf import SsjfPolicy
from services.scheduler.policies.vllm import VllmPolicy
from services.scheduler.policies.vllm_v0 import VllmV0Policy
from services.scheduler.policy import Policy, PolicyConfig, parse_policy_config

POLICIES: dict[str, type[Policy]] = {
    VllmPolicy.name: VllmPolicy,
    VllmV0Policy.name: VllmV0Policy,
    OrcaPolicy.name: OrcaPolicy,
    StaticPolicy.name: StaticPolicy,
    SarathiPolicy.name: SarathiPolicy,
    FastServePolicy.name: FastServePolicy,
    SsjfPolicy.name: SsjfPolicy,
    LtrPolicy.name: LtrPolicy,
    AlisePolicy.name: AlisePolicy,
    OraclePolicy.name: OraclePolicy,
    EconoServePolicy.name: EconoServePolicy,
    MultiResPolicy.name: MultiResPolicy,
    FluidInferPolicy.name: FluidInferPolicy,
    AliseFluidPolicy.name: AliseFluidPolicy,
    AliseBoundPolicy.name: AliseBoundPolicy,
}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator for policies defined elsewhere (ALISE, EconoServe, FluidInfer)."""
    POLICIES[cls.name] = cls
    return cls


def policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(sorted(POLICIES))}") from None


def make_policy(name: str, config: SchedulerConfig,
                options: dict[str, str] | list[str] | PolicyConfig | None = None) -> Policy:
    """Build a policy by name; ``options`` are ``key=value`` strings (``--policy-config``), a
    dict, or the policy's config object. Unknown names and keys raise ValueError."""
    cls = policy_class(name)
    if not isinstance(options, PolicyConfig):
        try:
            options = parse_policy_config(cls.config_class, options)
        except ValueError as exc:
            raise ValueError(f"policy {name!r}: {exc}") from None
    return cls(config, options)


def wants_kv_int8(name: str, options: dict[str, str] | list[str] | None, kv_int8: bool) -> bool:
    """The engine's one INT8 switch: ``--kv-int8``, or the policy's ``kv_int8`` option (ALISE
    and its relatives), which name the same setting. Unknown names and keys raise ValueError
    as ``make_policy`` does."""
    if kv_int8:
        return True
    cls = policy_class(name)
    try:
        parsed = parse_policy_config(cls.config_class, options)
    except ValueError as exc:
        raise ValueError(f"policy {name!r}: {exc}") from None
    return bool(getattr(parsed, "kv_int8", False))
