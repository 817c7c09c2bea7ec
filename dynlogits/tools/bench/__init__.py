"""``python -m dynlogits.tools.bench``: what the apply path costs, side by side with its alternatives.

Suites (one module each): ``micro`` (one decode step of the vLLM adapter against a per-row loop
of the same processors, the ai-dynamo 1.6.1 reference and a memset floor), ``engine`` (a real
vLLM CPU engine's throughput with and without processors), ``wire`` (a payload's encode, decode
and validation, msgspec path against pydantic path). ``report`` prints the tables and the
targets; ``docs`` regenerates ``docs/performance.md`` and its plot. Every figure is measured in
the run that prints it; nothing here is a timed test. ``python -m dynlogits.testing.cuda.check``
(``cuda_check``) runs the apply path on a real GPU: syncs, landed copies and cost.
"""
