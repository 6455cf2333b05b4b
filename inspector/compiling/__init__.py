"""torch.compile readiness: Dynamo runs on the sample (inspector/passes/dynamo.py)."""
