"""Code comments say why, never a run's history: no commit ids, rounds, sessions, dated runs or
"this machine" figures in ``src/`` (figures live in docs/benchmarks.md with their commands)."""

from __future__ import annotations

import re

from conftest import REPO_ROOT

HISTORY = re.compile(
    r"``(?=[0-9]*[a-f])[0-9a-f]{7,40}``"  # a commit id in a docstring (not a number)
    r"|\bat (?=[0-9]*[a-f])[0-9a-f]{7,40}\b"
    r"|\b(?:this|the|last|next) round\b|\bround's\b"
    r"|\b(?:last|previous|earlier) session\b"  # ("this session" is SAE's vocabulary)
    r"|\b20\d\d-\d\d-\d\d\b"  # a dated run
    r"|\bbuild machine\b|\bthis project's machine\b",
    flags=re.I,
)


def test_no_run_history_in_the_source() -> None:
    found = []
    for path in sorted((REPO_ROOT / "src").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert not found, "run history belongs in docs/benchmarks.md or git:\n" + "\n".join(found)
