"""``python -m dynlogits.tools.load``: sustained load on an OpenAI-compatible deployment, checked response by response.

Drives a deployment over HTTP with the ``openai`` client (``--concurrency`` clients, ``--requests``
requests, a mix of spec kinds, streaming and not) and checks every answer: a forced text must come
back exactly (else *cross-talk*), a biased or banned request must produce its predictable text,
and every request must be answered exactly once (else *lost* / *duplicated*). Prints p50/p95/p99
latency and tokens/s; ``--json FILE`` writes the summary (:class:`dynlogits.tools.load.report.Summary`).

Modules: ``plan`` (what each request asks and expects), ``driver`` (sending and classifying),
``report`` (the summary), ``deployment`` (``--launch`` and the worker statistics).
"""
