"""Helpers of the graph pass: capture back-ends, node recording, symbolic dims, params,
module aggregation and backward FLOPs. `inspector.capture` and `inspector.passes.graph`
are the entry points; these modules each hold one idea."""
