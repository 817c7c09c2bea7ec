"""``python -m dynlogits.tools.bench``: what the apply path costs, side by side with its alternatives.

Suites: ``micro`` (one decode step of the vLLM adapter against a per-row loop, the ai-dynamo 1.6.1
reference and a memset floor), ``engine`` (a real vLLM CPU engine's throughput with and without
processors), ``wire`` (a payload's encode and decode, msgspec against pydantic). ``report`` prints
tables and targets; ``docs`` regenerates ``docs/performance.md`` (whose text describes the method).
Figures come from the run that prints them; nothing here is a timed test."""
