"""The CI client: `inspector submit` uploads a model to a server, waits, checks gates.

Torch-free (httpx and pydantic only), so a CI job installs it without torch.
`submit` (the command), `client` (the HTTP calls), `upload_source` (what is sent),
`gates` (budgets, increases, findings), `citags` (commit/branch tags from CI variables).
"""
