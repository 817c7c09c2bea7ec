"""SGLang's real scheduler-side classes on CPU (no engine: it needs a GPU and sgl-kernel).

Every test here imports ``sglang.srt`` through ``dynlogits.adapters.sglang.compat``, the CPU-test
shim (a bare ``sglang`` package module, and a placeholder for the broken torchvision import).
"""

import pytest

pytest.importorskip("dynlogits.adapters.sglang.conformance")  # applies the shim
