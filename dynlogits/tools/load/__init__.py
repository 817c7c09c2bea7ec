"""``python -m dynlogits.tools.load``: sustained load on an OpenAI-compatible deployment, checked response by response.

Drives a deployment with the ``openai`` client (``--concurrency``, ``--requests``, a mix of spec
kinds, streaming and not) and checks every answer: forced texts exact (else cross-talk), biased and
banned requests their predictable text, every request answered exactly once (else lost /
duplicated). Prints latency percentiles and tokens/s; ``--json FILE`` writes ``report.Summary``.
Modules: ``plan``, ``driver``, ``report``, ``deployment`` (``--launch``, worker statistics)."""
