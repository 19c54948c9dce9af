"""HTTP layer of the reference application: blueprints, request/response schemas, shared helpers."""
