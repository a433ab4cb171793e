"""The registry of reproductions: the studies are found outside the package (the entry point),
a missing plugin is named, and select_parts reads argument, environment variable, default."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import fedjax_sel
from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.reproductions import select_parts
from fedjax_sel.registry import Registry

KNOWN = ("a", "b", "c")
PAPERS = ["ca-fed", "comparators", "fedcvr-bolt", "filfl", "hetero-select", "sp-cacw"]


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


def test_the_library_never_imports_the_studies():
    """The studies sit outside the package: no module of fedjax_sel imports them by name."""
    root = Path(fedjax_sel.__file__).parent
    importers = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n == "studies" or n.startswith("studies.") for n in names):
                importers.append(path.relative_to(root).as_posix())
    assert importers == []
    assert not (root / "reproduce").exists()


def test_the_installed_studies_are_found_from_any_folder(tmp_path):
    """From a folder that holds no ``studies/`` (the installed entry point finds it), the
    registry lists the five papers and ``fedjax-sel reproduce NAME --help`` parses."""
    code = (
        "from fedjax_sel.experiment.reproductions import REPRODUCTIONS\n"
        "import sys\n"
        "assert 'studies' not in sys.modules\n"  # nothing imported it before the registry
        "print(sorted(REPRODUCTIONS))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(PAPERS)
    r = subprocess.run(
        [sys.executable, "-m", "fedjax_sel", "reproduce", "filfl", "--size", "cpu", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "--only-seeds" in r.stdout, r.stderr


def _plugins(monkeypatch, *values: str) -> None:
    """``importlib.metadata.entry_points`` answering group ``test.group`` with ``values``."""
    points = [importlib.metadata.EntryPoint(f"p{i}", v, "test.group") for i, v in enumerate(values)]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda *, group: [p for p in points if p.group == group]
    )


def test_an_entry_point_is_imported_when_the_registry_is_first_read(monkeypatch, tmp_path):
    (tmp_path / "probe_registry.py").write_text(
        "from fedjax_sel.registry import Registry\n"
        "REG = Registry('study', entry_points='test.group')\n"
    )
    (tmp_path / "probe_study.py").write_text(
        "from probe_registry import REG\n"
        "REG.register('probe', description='a probe')(lambda: 'ran')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("probe_registry", "probe_study"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    _plugins(monkeypatch, "probe_study")
    import probe_registry

    assert "probe_study" not in sys.modules  # lazily: not before the registry is read
    assert list(probe_registry.REG) == ["probe"] and probe_registry.REG.build("probe") == "ran"


def test_a_missing_plugin_is_named_and_a_broken_one_raises_its_own_error(monkeypatch, tmp_path):
    _plugins(monkeypatch, "no_such_study_package_xyz")
    with pytest.raises(ConfigError, match="'no_such_study_package_xyz'.*cannot be imported"):
        len(Registry("study", entry_points="test.group"))
    # a plugin that is there but imports something missing: its own error, with its traceback
    (tmp_path / "broken_study_probe.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_study_probe", raising=False)
    _plugins(monkeypatch, "broken_study_probe")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        len(Registry("study", entry_points="test.group"))
