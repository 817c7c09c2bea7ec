"""``dynlogits conformance --help`` names every adapter this project ships, from the kit's one list
(``dynlogits.testing.SHIPPED``), and that list names every adapter package with a conformance driver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dynlogits.testing import SHIPPED

ROOT = Path(__file__).resolve().parents[2]


def test_the_kit_ships_a_driver_for_every_adapter_package() -> None:
    packages = sorted(p.parent.name for p in (ROOT / "adapters").glob("*/conformance.py"))
    assert packages == sorted(SHIPPED) == ["sglang", "transformers", "trtllm", "vllm"]
    for name, factory in SHIPPED.items():
        assert factory == f"dynlogits.adapters.{name}.conformance:drivers"


def test_the_help_lists_every_shipped_adapter() -> None:
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    help_text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert f"a shipped adapter ({', '.join(SHIPPED)})" in help_text


def test_the_command_and_the_list_load_no_torch() -> None:
    code = ("import sys, dynlogits.tools.cli\n"
            "from dynlogits.testing import SHIPPED\n"
            "assert 'torch' not in sys.modules, 'torch loaded'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
