"""HTTP plumbing around every route: middleware (security headers, compute limit, body and URL
limits, gzip, access log), the exception handlers that turn errors into FastAPI's error shape, and
JSON writing of NumPy arrays.

May import: `app.settings`, `app.service.errors` (the exception types it maps to statuses) and
`core.InputError`. Knows nothing of models, views or pages.
"""
