"""The README and docs/ tell the truth: every measured number in them is in a committed JSON
under benchmarks/results/, and every code example runs as written (shell commands at a tiny
size).

Numbers: a block between ``<!-- numbers: FILE.json ... -->`` and ``<!-- /numbers -->`` may only
hold measured numbers (decimals, percentages, ratios such as ``5.7x``, thousands-separated
integers) that some value of the named JSON files gives at the shown precision (or, for a
percentage, 100 times some value).

Examples: every ```python block runs (in a temporary folder); a block preceded by
``<!-- file: NAME -->`` is written to NAME first instead (a module the shell examples import).
Every ``fedjax-sel`` command of a ```bash block parses; ``run``, ``sweep``, ``demo`` and
``list`` commands also run, at a tiny size (two rounds, at most 200 clients, one local
epoch), unless the command elides arguments with ``...``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"<!-- numbers: ([^>]*?) -->(.*?)<!-- /numbers -->", re.S)
_NUMBER = re.compile(r"(?<![\w.^/])[-+\u2212]?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(%|x\b)?")
_CODE = re.compile(r"(?:<!-- file: (\S+) -->\s*)?```(python|bash)\n(.*?)```", re.S)


def _json_values(obj, out: list[float]) -> list[float]:
    if isinstance(obj, dict):
        for v in obj.values():
            _json_values(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _json_values(v, out)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.append(float(obj))
    return out


def _backed(token: str, decimals: int, percent: bool, values: list[float]) -> bool:
    target = float(token)
    for v in values:
        for scaled in (v, 100 * v) if percent else (v,):
            if (
                abs(scaled) != float("inf")
                and f"{abs(scaled):.{decimals}f}" == f"{abs(target):.{decimals}f}"
            ):
                return True
    return False


def _number_blocks():
    for doc in DOCS:
        for files, body in _BLOCK.findall(doc.read_text()):
            yield doc, files.split(), body


def test_documents_have_backed_number_blocks():
    blocks = list(_number_blocks())
    assert len(blocks) >= 8, "the README's measured tables sit in <!-- numbers: ... --> blocks"


def _verdicts_table():
    spec = importlib.util.spec_from_file_location(
        "verdicts_table", ROOT / "benchmarks" / "verdicts_table.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_verdicts_page_and_readme_summary_are_the_committed_verdicts():
    # docs/verdicts.md and the README's summary are generated from the committed verdicts.json
    # and run_info.json files: a rerun reproduction must be followed by regenerating them
    gen = _verdicts_table()
    assert (ROOT / "docs" / "verdicts.md").read_text() == gen.page(), (
        "docs/verdicts.md is stale: run `python benchmarks/verdicts_table.py --write`"
    )
    assert gen.summary_table() in (ROOT / "README.md").read_text(), (
        "the README's verdict summary is stale: paste `python benchmarks/verdicts_table.py "
        "--summary`"
    )


def test_a_claim_rerun_with_more_seeds_counts_once(tmp_path, monkeypatch):
    """A table rerun into another folder with more seeds decides its claims: the summary counts
    each claim once (the most seeds), the page keeps both rows and marks the other one."""
    gen = _verdicts_table()

    def row(claim, seeds, verdict, baseline="B"):
        return {"claim": claim, "profile": "paper", "size": "cpu", "setting": "mnist",
                "method": "M", "baseline": baseline, "seeds": seeds, "paper_diff": 1.0,
                "diff_mean": 0.5, "diff_ci_low": 0.1, "diff_ci_high": 0.9, "verdict": verdict,
                "note": ""}  # fmt: skip

    first = [row("T4", 10, "inconclusive"), row("T2", 10, "not_reproduced")]
    rerun = [row("T4", 20, "reproduced")]
    for folder, rows in (("paper-cpu", first), ("paper-cpu-t4", rerun)):
        (tmp_path / "filfl" / folder).mkdir(parents=True)
        (tmp_path / "filfl" / folder / "verdicts.json").write_text(json.dumps(rows))
    monkeypatch.setattr(gen, "RESULTS", tmp_path)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    _, lines, counts = gen.rows()
    assert counts == {("filfl", "paper", "cpu", "reproduced"): 1,
                      ("filfl", "paper", "cpu", "not_reproduced"): 1}  # fmt: skip
    assert len(lines) == 3
    assert "inconclusive (superseded by `filfl/paper-cpu-t4`, more seeds)" in lines[0]
    assert lines[1].endswith("| not reproduced |") and lines[2].endswith("| reproduced |")
    assert "| filfl | paper, cpu | 2 | 1 | 0 | 1 |" in gen.summary_table()


@pytest.mark.parametrize(
    "doc, files, body",
    list(_number_blocks()),
    ids=lambda x: x.name if isinstance(x, Path) else None,
)
def test_every_measured_number_comes_from_a_committed_json(doc, files, body):
    values: list[float] = []
    for f in files:
        path = ROOT / f
        assert path.is_file(), f"{doc.name} cites {f}, which is not committed"
        _json_values(json.loads(path.read_text()), values)
    # code spans, links, image paths and the confidence level ("95% CI") are not measurements
    text = re.sub(r"`[^`]*`|\]\([^)]*\)|\b95% (?=CI|confidence|interval)", " ", body)
    unbacked = []
    for m in _NUMBER.finditer(text):
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        measured = frac is not None or unit is not None or "," in whole
        if not measured:
            continue
        token = whole.replace(",", "") + (frac or "")
        decimals = len(frac) - 1 if frac else 0
        if not _backed(token, decimals, unit == "%", values):
            unbacked.append(m.group(0))
    assert not unbacked, f"{doc.name}: numbers not in {files}: {unbacked[:20]}"


# ----------------------------------------------------------------------------- examples
def _examples():
    for doc in DOCS:
        for filename, lang, code in _CODE.findall(doc.read_text()):
            yield doc, filename or None, lang, code


def _commands(code: str) -> list[list[str]]:
    """The ``fedjax-sel`` commands of a shell block (continuation lines joined)."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip()
        if line.startswith("#") or "fedjax-sel" not in line:
            continue
        words = shlex.split(line)
        start = next(i for i, w in enumerate(words) if w.endswith("fedjax-sel"))
        out.append(words[start + 1 :])
    return out


def _tiny(argv: list[str]) -> list[str] | None:
    """The command at a tiny size, or ``None`` when it only has to parse."""
    if "..." in argv:
        return None
    i = 0
    while i < len(argv) and argv[i].startswith("--"):  # global options come first
        i += 2
    command = argv[i] if i < len(argv) else None
    argv = list(argv)
    if command == "run":
        if "--distributed" in argv:
            return None
        for flag, cap in (("--clients", 200), ("--per-round", 20), ("--local-epochs", 1)):
            if flag in argv and int(argv[argv.index(flag) + 1]) > cap:
                argv[argv.index(flag) + 1] = str(cap)
        return argv + ["--rounds", "2", "--eval-every", "1", "--no-progress"]
    if command == "sweep":
        return argv + [
            "--set",
            "rounds=2",
            "--set",
            "eval_every=1",
            "--seeds",
            "2",
            "--no-progress",
        ]
    if command == "demo":
        return argv + ["--rounds", "2", "--no-progress"]
    if command == "list":
        return argv
    return None


@pytest.mark.slow
def test_every_example_runs_as_written(tmp_path, monkeypatch, capsys):
    from fedjax_sel.cli import build_parser, main
    from fedjax_sel.strategies import STRATEGIES

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(
        "FEDJAX_SEL_DATA_DIR",
        os.environ.get("FEDJAX_SEL_DATA_DIR", str(ROOT.parent / "shared" / "data")),
    )
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    before = set(STRATEGIES)
    ran = parsed = 0
    try:
        for doc, filename, lang, code in _examples():
            if filename:
                (tmp_path / filename).write_text(code)
                continue
            if lang == "python":
                exec(compile(code, f"{doc.name}:python", "exec"), {"__name__": "__example__"})
                ran += 1
                continue
            for argv in _commands(code):
                try:
                    build_parser().parse_args([w for w in argv if w != "..."])
                except SystemExit as e:
                    pytest.fail(f"{doc.name}: `fedjax-sel {' '.join(argv)}` does not parse ({e})")
                parsed += 1
                tiny = _tiny(argv)
                if tiny is not None:
                    rc = main(tiny)
                    assert rc == 0, f"{doc.name}: `fedjax-sel {' '.join(tiny)}` exited {rc}"
                    ran += 1
    finally:
        for name in set(STRATEGIES) - before:
            STRATEGIES.unregister(name)
    capsys.readouterr()
    assert ran >= 8 and parsed >= 10, (ran, parsed)
