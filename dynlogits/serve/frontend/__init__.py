"""``python -m dynlogits.serve.frontend``: the OpenAI-compatible HTTP frontend.

Imports no torch and no engine: it validates requests with :mod:`dynlogits.specs`
and routes them to workers over HTTP (:mod:`dynlogits.serve.protocol`).
"""
