"""Test helper: a third-party plug-in distribution really installed (a dist-info with
``entry_points.txt``), so ``importlib.metadata`` in a process that has it on ``PYTHONPATH``
sees its kinds the way it would see a pip-installed package's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def install_plugin(src: Path, site: Path, package: str, pyproject: str, modules: Mapping[str, str], *,
                   python: str = sys.executable) -> Path:
    """Write ``package`` (``modules``: file name -> source) and its ``pyproject`` under ``src``,
    pip-install it (no index, no deps) into ``site`` and return ``site``."""
    (src / "pyproject.toml").write_text(pyproject)
    (src / package).mkdir()
    (src / package / "__init__.py").write_text("")
    for name, text in modules.items():
        (src / package / name).write_text(text)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(src)], check=True, cwd=src, timeout=300, capture_output=True)
    if not list(site.glob(f"{package}-*.dist-info/entry_points.txt")):
        raise AssertionError(f"{package} installed no entry_points.txt into {site}")
    return site
