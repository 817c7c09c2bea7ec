"""One distribution, three folders: import hygiene and what the wheel ships."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_importing_the_spec_layer_never_imports_torch():
    code = "import sys, dynlogits, dynlogits.specs, dynlogits.config, dynlogits.roles, dynlogits.activation, dynlogits.cli; print(sorted(m for m in ('torch', 'vllm', 'sglang', 'tensorrt_llm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_wheel_maps_specs_and_adapters_under_dynlogits(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, timeout=300, capture_output=True,
    )
    (wheel,) = tmp_path.glob("dynlogits-*.whl")
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
    prefixes = {"dynlogits": "dynlogits", "specs": "dynlogits.specs", "adapters": "dynlogits.adapters"}
    found = set()
    for folder, name in prefixes.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed
