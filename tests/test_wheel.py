"""The built wheel installs one import root, ``kvreuse``, and works from outside the repository.

The wheel is built from this checkout (setuptools from the test venv, no build isolation) and installed
without dependencies into a fresh venv; the test venv's site-packages is added after it as a plain path,
so the dependencies come from there but this checkout's editable install (a ``.pth`` hook) does not. Run
from a temporary directory: ``runtime`` is no module, ``kvreuse.runtime`` is the wheel's, ``kernels`` is
Hugging Face's package, and ``kvreuse generate`` answers on the embedded model."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (whl,) = dist.glob("kvreuse-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    py = env / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    (site / "test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env


def test_the_wheel_has_one_top_level_package(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"kvreuse"}, tops
    for folder in ("runtime", "kernels", "chat_templates", "benchmarks"):
        assert any(n.startswith(f"kvreuse/{folder}/") for n in names), folder
    assert not any(n.startswith("kvreuse/benchmarks/results/") for n in names)
    # bundled data: C sources, templates, workloads, the live page
    for suffix in (".c", ".h", ".jinja", "workloads/data/", "ui/static/"):
        assert any(suffix in n for n in names), suffix
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "kvreuse = kvreuse.runtime.cli.main:main" in text
    assert "bench = kvreuse.benchmarks.cli:main" in text


def _run(venv: Path, tmp_path: Path, *argv: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(Path.home())})  # fmt: skip


def test_imports_from_the_installed_wheel(venv: Path, tmp_path: Path):
    py = str(venv / "bin" / "python")
    r = _run(venv, tmp_path, py, "-c", "import runtime")
    assert r.returncode != 0 and "No module named 'runtime'" in r.stderr
    r = _run(
        venv, tmp_path, py, "-c", "import kvreuse.runtime as r, kvreuse.kernels.backends; print(r.__file__)"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(venv)), r.stdout
    r = _run(
        venv, tmp_path, py, "-c", "import kernels; print(kernels.__file__, hasattr(kernels, 'get_kernel'))"
    )
    assert r.returncode == 0 and r.stdout.split()[1] == "True", r.stdout + r.stderr  # Hugging Face's


@pytest.mark.slow
def test_generate_from_another_directory(venv: Path, tmp_path: Path):
    r = _run(venv, tmp_path, str(venv / "bin" / "kvreuse"), "generate", "--prompt", "The capital of France is",
             "--max-tokens", "4", "--temperature", "0", timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip(), r.stderr[-2000:]
