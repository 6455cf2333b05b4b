"""Hostile: loops forever."""

while True:
    pass
