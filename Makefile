.PHONY: setup demo test test-fast test-slow lint

setup:
	scripts/setup-env.sh

# Main job: the embedded model on a real vLLM engine, forced to answer "Hello world!".
demo: setup
	scripts/demo.sh

# The whole test suite (CI runs exactly this).
test:
	scripts/test.sh

# The inner loop: the tests that start no engine, no deployment and no whole subprocess run
# (markers ``engine`` and ``heavy``); ``make test`` runs those too.
test-fast:
	scripts/test.sh -m "not engine and not heavy and not slow"

# The slow tests the default run deselects: the 10,000-case fuzz runs and the timing-sensitive
# hang-up test (run them before a change to a reader of client data or to the streaming path).
test-slow:
	scripts/test.sh -m slow

# ruff and mypy over specs/, dynlogits/ and adapters/ (scripts/test.sh runs it before the tests).
lint:
	scripts/lint.sh
