"""The code base passes ruff (the project's lint config in pyproject.toml), as part of the test command."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent


def test_ruff_is_clean():
    if shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                       capture_output=True).returncode != 0:
        pytest.skip("ruff is not installed (it is in the `test` extra)")
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_no_merge_conflict_markers_are_left_in_text_files():
    # ruff catches markers in Python files; documentation, examples and configs have no such check.
    markers = ("<<<<<<< ", ">>>>>>> ")
    bad = []
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if (not path.is_file() or path.suffix not in (".md", ".yaml", ".yml", ".toml", ".csv", ".ipynb", ".py")
                or any(p.startswith(".") or p in ("build", "dist") or p.endswith(".egg-info") for p in parts)):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.startswith(markers):
                bad.append(f"{path.relative_to(ROOT)}:{number}")
    assert not bad, "merge conflict markers: " + ", ".join(bad)
