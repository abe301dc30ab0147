"""The asyncio front (``services.scheduler.async_engine``), re-exported for users."""
from services.scheduler.async_engine import AsyncEngine

__all__ = ["AsyncEngine"]
