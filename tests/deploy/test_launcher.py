"""The deploy tests' own helpers (``tests/deploy/launcher.py``), on plain processes: no deployment."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from .launcher import command_line, wait_until


def test_command_line_of_an_exited_unreaped_process_is_empty_not_an_error() -> None:
    """The launch scripts' supervisor runs ``sleep 1`` every second; a test walking the script's
    process tree can meet one that has exited and is a zombie until bash reaps it."""
    child = subprocess.Popen(["true"])
    proc = psutil.Process(child.pid)
    try:
        wait_until(lambda: proc.status() == psutil.STATUS_ZOMBIE, 30, "the child to exit unreaped", interval=0.05)
        with pytest.raises(psutil.ZombieProcess):
            proc.cmdline()  # what every tree walk did before
        assert command_line(proc) == ""
    finally:
        child.wait()
    assert command_line(proc) == ""  # reaped: gone


def test_command_line_of_a_running_process_is_its_arguments() -> None:
    child = subprocess.Popen(["sleep", "30"])
    proc = psutil.Process(child.pid)
    try:  # until the child has exec'd, its command line is its parent's copy (or empty)
        wait_until(lambda: command_line(proc) == "sleep 30", 30, "the child's exec", interval=0.05)
    finally:
        child.kill()
        child.wait()
