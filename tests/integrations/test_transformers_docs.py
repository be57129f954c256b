"""docs/transformers.md: every Python block runs as written (blocks marked ``# sketch`` are
not run), and the example prints what the page says it does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.25")  # cache= (see the module)
pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "transformers.md"


def test_the_python_blocks_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    runnable = [b for b in blocks if not b.startswith("# sketch")]
    assert runnable
    for code in runnable:
        exec(compile(code, str(DOC), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    hit, computed, _ = lines[0].split()
    assert (hit, computed) == ("96", "8")  # "loads 96 tokens, computes 8"
    assert len(lines[1].strip("[]").split(",")) == 5
    assert lines[2] == str(96 + 96)  # the second prefill's and generate's hits
