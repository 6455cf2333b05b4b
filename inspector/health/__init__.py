"""Helpers of the value-based passes (gradients, numerics, modes): running the forward
with per-node observers, keeping the model's state intact, thresholds, statistics."""
