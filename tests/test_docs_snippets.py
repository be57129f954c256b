"""Every ```python block in README.md and docs/*.md runs as written.

Each block runs alone, in a fresh module namespace, with the working directory in a temporary
directory and the policy registry restored afterwards. A block whose first line is
``# sketch`` is an outline, not a program, and is left out; shell and text blocks are never
run. A block that imports a package this environment lacks (vLLM, say) is skipped and says
which; one that reads ``KVOFFLOAD_REDIS_URL`` is skipped when no Redis server is configured.
Tracebacks point at the document's own line numbers.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from kvoffload.policies import CachePolicyFactory

SKETCH = "# sketch"
_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)


def _documents() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def _blocks() -> list[tuple[Path, int, str]]:
    """(document, line of the block's first code line, code) for every python block."""
    found = []
    for path in _documents():
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(1)) + 1
            found.append((path, line, match.group(1)))
    return found


def _runnable() -> list[object]:
    return [
        pytest.param(path, line, code, id=f"{path.relative_to(REPO_ROOT)}:{line}")
        for path, line, code in _blocks()
        if not code.startswith(SKETCH)
    ]


def _missing_packages(code: str) -> list[str]:
    """Top-level packages the block imports that are not installed here."""
    tops: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return sorted(name for name in tops if importlib.util.find_spec(name) is None)


def test_the_documents_have_python_blocks_and_sketches_are_marked() -> None:
    blocks = _blocks()
    assert len(blocks) >= 10  # the pattern finds them (a broken pattern would run nothing)
    assert all(b[2].strip() for b in blocks)


@pytest.mark.parametrize(("path", "line", "code"), _runnable())
def test_python_block_runs(
    path: Path, line: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = _missing_packages(code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed here)")
    if "KVOFFLOAD_REDIS_URL" in code and not os.environ.get("KVOFFLOAD_REDIS_URL"):
        pytest.skip("needs a Redis server: set KVOFFLOAD_REDIS_URL (.ci/redis_servers.sh)")
    monkeypatch.chdir(tmp_path)
    name = f"docs_snippet_{path.stem.replace('-', '_')}_{line}"
    module = types.ModuleType(name)  # importable by name, so a block can register its classes
    sys.modules[name] = module
    source = "\n" * (line - 1) + code  # line numbers as in the document
    try:
        with CachePolicyFactory.registry_snapshot():
            exec(compile(source, str(path), "exec"), module.__dict__)
    finally:
        del sys.modules[name]
