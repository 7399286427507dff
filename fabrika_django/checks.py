"""System checks ``fabrika.E0xx`` / ``fabrika.W0xx``."""
