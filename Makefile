.PHONY: setup demo test

setup:
	scripts/setup-env.sh

# Main job: the embedded model on a real vLLM engine, forced to answer "Hello world!".
demo: setup
	scripts/demo.sh

# The whole test suite (CI runs exactly this).
test:
	scripts/test.sh
