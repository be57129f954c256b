"""The import contract in pyproject.toml (one-way layers, side layers, no cycles) holds.

CI runs ``lint-imports`` too; this keeps the check in the plain test run, against this tree's
``src`` whatever kvoffload is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the [dev] extra")

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command as m; m()",
            "--no-cache",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout
