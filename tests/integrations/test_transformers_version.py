"""The integration refuses, in one line, a transformers release that rejects ``cache=``."""

from __future__ import annotations

import importlib

import pytest

transformers = pytest.importorskip("transformers", minversion="5.25")


@pytest.mark.parametrize("version", ["5.20.2", "4.57.1", "6.0.0.dev0"])
def test_an_untested_release_is_refused_at_import(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    import kvoffload.integrations.transformers as module

    monkeypatch.setattr(transformers, "__version__", version)
    with pytest.raises(ImportError, match=rf"needs transformers>=5.25,<6, found {version}"):
        importlib.reload(module)
    monkeypatch.undo()
    importlib.reload(module)  # the tested release imports again
    assert module.TESTED_TRANSFORMERS == ((5, 25), (6, 0))
