"""lenserve's independently deployable services."""
