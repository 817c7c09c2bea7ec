"""Spec-layer tests see only built-in kinds unless they register their own.

Kinds registered at import time by other test modules (``register_kind`` in a module body)
would otherwise join the unions and change, e.g., the "expected one of" list of the golden
``unknown_kind`` vector.
"""

import pytest

from dynlogits.specs import kinds


@pytest.fixture(autouse=True)
def only_builtin_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kinds, "_registered", {})
