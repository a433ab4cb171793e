"""The notebooks' install cell: the same in every notebook, the right pip requirement for each
kind of source, and a real install from a git URL into a fresh virtual environment (what
Colab does), after which the installed package runs the demo."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _install_cell(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    return "".join(code[0]["source"])


def test_every_notebook_starts_with_the_same_install_cell():
    cells = {p.stem: _install_cell(p) for p in NOTEBOOKS}
    assert len(cells) == 6
    first = cells["quickstart"]
    assert "pip" in first and "FEDJAX_SEL_SOURCE" in first
    assert all(c == first for c in cells.values()), [n for n, c in cells.items() if c != first]


def _requirement(monkeypatch, tmp_path, source: str | None, cwd: Path) -> list[str]:
    """The pip command the cell runs for ``source``, with the package taken as missing."""
    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv))
    if source is None:
        monkeypatch.delenv("FEDJAX_SEL_SOURCE", raising=False)
    else:
        monkeypatch.setenv("FEDJAX_SEL_SOURCE", source)
    monkeypatch.chdir(cwd)
    exec(compile(_install_cell(NOTEBOOKS[0]), "install cell", "exec"), {})
    monkeypatch.undo()
    assert len(calls) == 1 and calls[0][:4] == [sys.executable, "-m", "pip", "install"]
    return calls[0][-1]


def test_install_cell_turns_each_source_into_a_requirement_pip_accepts(monkeypatch, tmp_path):
    url = "git+https://github.com/example/fedjax_sel@main"
    # a URL is a PEP 508 direct reference (pip would try to clone "URL[extras]" otherwise)
    assert _requirement(monkeypatch, tmp_path, url, tmp_path) == f"fedjax-sel @ {url}"
    wheel = "https://example.org/fedjax_sel-0.1.0-py3-none-any.whl"
    assert _requirement(monkeypatch, tmp_path, wheel, tmp_path) == f"fedjax-sel @ {wheel}"
    # a local wheel or folder: its absolute path (the cell's folder is the notebook's)
    (tmp_path / "w.whl").write_text("")
    assert _requirement(monkeypatch, tmp_path, "w.whl", tmp_path) == str(tmp_path / "w.whl")
    # no source: the checkout the notebook sits in
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").mkdir()
    got = _requirement(monkeypatch, tmp_path, None, tmp_path / "notebooks")
    assert got == str(tmp_path)


def test_install_cell_outside_a_checkout_says_what_to_set(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.delenv("FEDJAX_SEL_SOURCE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="set FEDJAX_SEL_SOURCE to a git URL"):
        exec(compile(_install_cell(NOTEBOOKS[0]), "install cell", "exec"), {})


def _snapshot_repository(dest: Path) -> Path:
    """A git repository holding the working tree as it is (tracked and untracked files that git
    does not ignore), the way a user's fork on a git host would hold it."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the project")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    git = ["git", "-c", "user.email=test@example.org", "-c", "user.name=test"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "snapshot"], cwd=dest, check=True)
    return dest


@pytest.mark.slow
def test_install_cell_installs_from_a_git_url_into_a_fresh_environment(tmp_path):
    repo = _snapshot_repository(tmp_path / "repo")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # file://localhost/...: the host part keeps older pips' URL check happy, as github.com does
    env["FEDJAX_SEL_SOURCE"] = f"git+file://localhost{repo}"
    work = tmp_path / "colab"
    work.mkdir()
    cell = _install_cell(NOTEBOOKS[0])
    done = subprocess.run([str(python), "-c", cell], cwd=work, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    where = subprocess.run(
        [str(python), "-c", "import fedjax_sel; print(fedjax_sel.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(venv), where  # installed, not the checkout on a path
    # the installed package (its embedded data included) runs the paired demo
    demo = subprocess.run(
        [str(venv / "bin" / "fedjax-sel"), "demo", "--rounds", "2", "--seeds", "2",
         "--no-progress", "--out", str(work / "demo")],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "| power_of_choice | 2 |" in demo.stdout
    assert (work / "demo" / "comparison.png").is_file()
    # a second run of the cell finds the package and installs nothing
    again = subprocess.run([str(python), "-c", cell + "\nprint('ok')"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0 and again.stdout.strip() == "ok"
