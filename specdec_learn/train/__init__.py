"""Training learned drafters on the target's own text (see data.py, then one file per method)."""
