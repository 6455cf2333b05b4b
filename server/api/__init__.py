"""API v1 (`/api/v1`): routers, response schemas, upload checks and the error shape."""
