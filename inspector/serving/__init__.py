"""Serving memory: what the model's own cache holds per token, the prefill and decode peaks,
and how many sequences fit an accelerator. Everything is measured by running the model
with its cache on fake tensors (`run`), never taken from a table of formulas: sliding
windows, grouped K/V heads, cross-attention and SSM states come out as the model builds
them. `plan` turns the measurements into the concurrency figures.
"""
