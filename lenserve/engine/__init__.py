"""The in-process engine: scheduler + executor driven one iteration at a time."""
