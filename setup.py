"""The folders at the repository root (runtime/, kernels/, chat_templates/, benchmarks/) installed as
subpackages of one import root, ``kvreuse``: ``kvreuse.runtime`` is runtime/, and so on, in wheels and
editable installs alike. Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

FOLDERS = ("runtime", "kernels", "chat_templates", "benchmarks")
# benchmarks/results holds the committed figures (JSON, plots): data for the repository, not the wheel
SKIP = ("*__pycache__*", "results", "results.*")

packages = [
    f"kvreuse.{folder}{'.' + sub if sub else ''}"
    for folder in FOLDERS
    for sub in ["", *find_namespace_packages(folder, exclude=SKIP)]
]
setup(packages=packages, package_dir={f"kvreuse.{folder}": folder for folder in FOLDERS})
