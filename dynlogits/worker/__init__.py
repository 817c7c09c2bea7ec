"""``python -m dynlogits.worker``: one engine behind a small internal HTTP API.

Kept import-light: the frontend imports :mod:`dynlogits.worker.protocol` (pydantic
only) and must never pull torch or an engine through this package.
"""
