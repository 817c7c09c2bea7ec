"""One distribution, three folders: import hygiene and what the wheel ships."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # a whole subprocess run or build: make test-fast leaves it out

ROOT = Path(__file__).resolve().parents[1]


def test_importing_the_spec_layer_never_imports_torch():
    code = "import sys, dynlogits, dynlogits.specs, dynlogits.policy.config, dynlogits.policy.roles, dynlogits.sdk, dynlogits.tools.cli; print(sorted(m for m in ('torch', 'vllm', 'sglang', 'tensorrt_llm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for the tests of this module."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, timeout=300, capture_output=True,
    )
    (wheel,) = out.glob("dynlogits-*.whl")
    return wheel


def test_wheel_maps_specs_and_adapters_under_dynlogits(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "dynlogits/__init__.py",
        "dynlogits/specs/__init__.py",
        "dynlogits/specs/payload.schema.json",
        "dynlogits/specs/golden/invalid/negative_token_id.json",
        "dynlogits/adapters/__init__.py",
        "dynlogits/adapters/vllm/__init__.py",
        "dynlogits/processors/__init__.py",
    ):
        assert required in names, required
    assert not any(n.startswith(("specs/", "adapters/", "tests/")) for n in names)


def test_every_python_package_folder_is_listed_for_the_wheel():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    listed -= {"dynlogits.specs.golden.valid", "dynlogits.specs.golden.invalid"}  # data only, no __init__.py
    prefixes = {"dynlogits": "dynlogits", "specs": "dynlogits.specs", "adapters": "dynlogits.adapters"}
    found = set()
    for folder, name in prefixes.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed


def test_installed_wheel_imports_without_the_source_tree(wheel, tmp_path):
    """The wheel, installed on its own, serves specs, golden vectors and the adapter package.

    It is installed into a target folder placed first on PYTHONPATH and run from outside
    the repository, so neither the editable install nor the checkout can answer the imports.
    """
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True, timeout=300, capture_output=True,
    )
    code = (
        "import dynlogits, dynlogits.specs, dynlogits.adapters.vllm as v, dynlogits.serve.worker, dynlogits.serve.frontend;"
        "from dynlogits.specs.schema import golden_vectors, payload_schema;"
        "print(dynlogits.__file__); print(v.__file__); print(len(golden_vectors()) > 0, 'properties' in str(payload_schema()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert out.returncode == 0, out.stderr
    init_file, adapter_file, checks = out.stdout.strip().splitlines()
    assert Path(init_file).is_relative_to(target)
    assert Path(adapter_file).is_relative_to(target / "dynlogits" / "adapters" / "vllm")
    assert checks == "True True"
