"""Backends ``lenserve bench`` can compare, named ``lenserve:<policy>``, ``hf-static``,
``hf-cb`` and ``openai:<url>``."""
from __future__ import annotations

from dataclasses import dataclass

from lenserve.bench.backends.base import Backend, BackendOptions

BACKEND_FORMS = ("lenserve:<policy>", "hf-static", "hf-cb", "openai:<url>")


@dataclass(frozen=True)
class BackendSpec:
    kind: str  # "lenserve" | "hf-static" | "hf-cb" | "openai"
    arg: str | None
    text: str


def parse_backend_spec(text: str) -> BackendSpec:
    """Check one ``--backends`` item; raises ValueError naming the valid forms."""
    text = text.strip()
    kind, sep, arg = text.partition(":")
    if text in ("hf-static", "hf-cb"):
        return BackendSpec(text, None, text)
    if kind in ("lenserve", "openai") and sep and arg:
        return BackendSpec(kind, arg, text)
    raise ValueError(f"unknown backend {text!r}; use one of {', '.join(BACKEND_FORMS)}")


def parse_backends(text: str) -> list[BackendSpec]:
    specs = [parse_backend_spec(item) for item in text.split(",") if item.strip()]
    if not specs:
        raise ValueError("--backends names no backend")
    names = [s.text for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--backends lists a backend twice: {text}")
    return specs


def create_backend(spec: BackendSpec, options: BackendOptions) -> Backend:
    """Build (not start) the backend; heavy imports happen only for the kinds asked for."""
    if spec.kind == "lenserve":
        from lenserve.bench.backends.lenserve_engine import LenserveBackend
        return LenserveBackend(spec.text, spec.arg, options)
    if spec.kind == "hf-static":
        from lenserve.bench.backends.hf_static import HFStaticBackend
        return HFStaticBackend(spec.text, options)
    if spec.kind == "hf-cb":
        from lenserve.bench.backends.hf_cb import HFContinuousBackend
        return HFContinuousBackend(spec.text, options)
    from lenserve.bench.backends.openai_compat import OpenAIBackend
    return OpenAIBackend(spec.text, spec.arg, options)


__all__ = ["BACKEND_FORMS", "Backend", "BackendOptions", "BackendSpec", "create_backend",
           "parse_backend_spec", "parse_backends"]
