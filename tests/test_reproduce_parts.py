"""select_parts: argument, then environment variable, then default; unknown parts named."""

from __future__ import annotations

import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.reproduce import select_parts

KNOWN = ("a", "b", "c")


def test_argument_environment_default(monkeypatch):
    monkeypatch.delenv("FEDJAX_SEL_TEST_PARTS", raising=False)
    assert select_parts("x", None, "FEDJAX_SEL_TEST_PARTS", ("a",), KNOWN) == ("a",)
    monkeypatch.setenv("FEDJAX_SEL_TEST_PARTS", " b, c ,")
    assert select_parts("x", None, "FEDJAX_SEL_TEST_PARTS", ("a",), KNOWN) == ("b", "c")
    assert select_parts("x", "c", "FEDJAX_SEL_TEST_PARTS", ("a",), KNOWN) == ("c",)
    assert select_parts("x", ("a", "b"), "FEDJAX_SEL_TEST_PARTS", (), KNOWN) == ("a", "b")


def test_unknown_parts_are_named():
    with pytest.raises(ConfigError, match=r"unknown demo reproduction part\(s\) \['z'\]"):
        select_parts("demo", "a,z", "FEDJAX_SEL_TEST_PARTS", (), KNOWN)
