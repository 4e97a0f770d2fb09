"""Install the built wheel into a clean virtual environment and run the README's quickstart from it.

Usage: ``python tools/check_wheel.py DIST`` (``make wheel-check``; DIST holds what ``python -m build`` made).

The venv gets the wheel and the torch that CI pins (requirements-ci.txt), nothing else: numpy comes in as the
wheel's own dependency, so a dependency missing from the metadata fails here. The quickstart runs with
``python -I`` from an empty folder, so it sees the installed package, never this checkout's ``src``. Also
checked: the package data (``py.typed``, the UCI hyperparameter table) is installed, the installed version is
``src/ngvi/_version.py``'s, and no extra's package came along.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# a package of an extra that must not arrive with the core install
EXTRAS_ONLY = ["scipy", "matplotlib", "safetensors", "transformers", "peft", "pyro", "ray"]


def _torch_pin() -> str:
    lines = (REPO / "requirements-ci.txt").read_text().splitlines()
    pins = [line for line in lines if line.startswith("torch")]
    assert len(pins) == 1, f"requirements-ci.txt must pin torch once, found {pins}"
    return pins[0].strip()


def _quickstart() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block, "README.md has no ```python block under ## Quickstart"
    return block.group(1)


PROBE = """
import importlib.metadata, importlib.util, pathlib, sys
import ngvi
root = pathlib.Path(ngvi.__file__).parent
assert "site-packages" in root.parts, f"ngvi imported from {root}, not from the installed wheel"
assert (root / "py.typed").is_file(), "py.typed is not installed"
assert (root / "experiments" / "uci" / "hparams.json").is_file(), "the UCI hyperparameter table is missing"
assert importlib.metadata.version("ngvi") == ngvi.__version__ == EXPECTED, (ngvi.__version__, EXPECTED)
present = [name for name in EXTRAS_ONLY if importlib.util.find_spec(name) is not None]
assert not present, f"an extra's packages were installed with the core: {present}"
print("installed", ngvi.__version__, "from", root)
"""


def main(dist: Path) -> None:
    wheels = sorted(dist.glob("ngvi-*.whl"))
    assert len(wheels) == 1, f"expected one ngvi wheel in {dist}, found {wheels}"
    version_file = (REPO / "src" / "ngvi" / "_version.py").read_text()
    expected = re.search(r'__version__ = "([^"]+)"', version_file).group(1)
    assert wheels[0].name.startswith(f"ngvi-{expected}-"), f"{wheels[0].name} is not version {expected}"
    with tempfile.TemporaryDirectory(prefix="ngvi-wheel-") as tmp:
        env_dir, work = Path(tmp) / "venv", Path(tmp) / "work"
        work.mkdir()
        venv.create(env_dir, with_pip=True)
        python = env_dir / "bin" / "python"
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", _torch_pin(), wheels[0]],
            check=True,
        )
        probe = f"EXPECTED = {expected!r}\nEXTRAS_ONLY = {EXTRAS_ONLY!r}\n{PROBE}"
        subprocess.run([python, "-I", "-c", probe], check=True, cwd=work)
        # the quickstart as a user pastes it: the README's block, nothing added
        subprocess.run([python, "-I", "-c", _quickstart()], check=True, cwd=work)
    print(f"wheel check passed: {wheels[0].name} installs into a clean venv and runs the README's quickstart")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/check_wheel.py DIST")
    main(Path(sys.argv[1]))
