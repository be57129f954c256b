"""The import contract in pyproject.toml (one-way layers, side layers, no cycles) holds, and it
really catches an upward import.

CI runs ``lint-imports`` too; this keeps the check in the plain test run, against this tree's
``src`` whatever kvoffload is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the [dev] extra")

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command as m; m()",
            "--no-cache",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_contracts_hold() -> None:
    run = _lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_a_planted_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    layout = tmp_path / "src" / "kvoffload" / "layout.py"
    layout.write_text(layout.read_text() + "\nimport kvoffload.manager  # planted\n")
    run = _lint_imports(tmp_path)
    assert run.returncode != 0
    assert "kvoffload.layout is not allowed to import kvoffload.manager" in run.stdout
