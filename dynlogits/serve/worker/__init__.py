"""``python -m dynlogits.serve.worker``: one engine behind a small internal HTTP API.

Kept import-light: the frontend imports :mod:`dynlogits.serve.protocol` (pydantic
only) and must never pull torch or an engine through this package.
"""
