"""Engine flags shared by ``generate``, ``bench`` and the scheduler service (defined beside
the scheduler, which parses them too)."""
from services.scheduler.engine_args import add_engine_arguments, engine_options

__all__ = ["add_engine_arguments", "engine_options"]
