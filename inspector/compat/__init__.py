"""Keeping the model libraries users import working where their native parts do not load."""
