"""The README and docs/ tell the truth: every measured number in them is in a committed JSON
under benchmarks/results/, and every code example runs as written (shell commands at a tiny
size).

Numbers: a block between ``<!-- numbers: FILE.json ... -->`` and ``<!-- /numbers -->`` may only
hold numbers (decimals, percentages, ratios such as ``5.7x``, and every integer, counts and
seeds included) that some value of the named JSON files gives at the shown precision (or, for a
percentage, 100 times some value). A setting that no cited file records (a horizon ``T = 500``,
a paper's figure number) sits in a code span or outside the block; the verdict counts of the
README's summary are in ``benchmarks/results/reproduce/summary.json``, which
``tools/verdicts_table.py --write`` writes from the committed verdicts.

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


def _numbers(body: str):
    """The measured numbers of a block: (as written, value, decimals, is a percentage); code
    spans, links, image paths and the confidence level ("95% CI") are not measurements."""
    text = re.sub(r"`[^`]*`|\]\([^)]*\)|\b95% (?=CI|confidence|interval)", " ", body)
    for m in _NUMBER.finditer(text):
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        yield (
            m.group(0),
            whole.replace(",", "") + (frac or ""),
            len(frac) - 1 if frac else 0,
            (unit == "%"),
        )


def _number_blocks():
    for doc in DOCS:
        for files, body in _BLOCK.findall(doc.read_text()):
            yield doc, files.split(), body


def test_documents_have_backed_number_blocks():
    blocks = list(_number_blocks())
    assert len(blocks) >= 8, "the README's measured tables sit in <!-- numbers: ... --> blocks"


def _verdicts_table():
    spec = importlib.util.spec_from_file_location(
        "verdicts_table", ROOT / "tools" / "verdicts_table.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_verdicts_page_and_readme_summary_are_the_committed_verdicts():
    # docs/verdicts.md and the README's summary are generated from the committed verdicts.json
    # and run_info.json files: a rerun reproduction must be followed by regenerating them
    gen = _verdicts_table()
    assert (ROOT / "docs" / "verdicts.md").read_text() == gen.page(), (
        "docs/verdicts.md is stale: run `python tools/verdicts_table.py --write`"
    )
    assert gen.summary_table() in (ROOT / "README.md").read_text(), (
        "the README's verdict summary is stale: paste `python tools/verdicts_table.py --summary`"
    )
    # the counts the README's summary and the page's runs table cite
    assert gen.summary_path().read_text() == gen.summary_text(), (
        f"{gen.summary_path().name} is stale: run `python tools/verdicts_table.py --write`"
    )


def test_readme_verdict_summary_cites_the_summary_counts():
    gen = _verdicts_table()
    cited = str(gen.summary_path().relative_to(ROOT))
    blocks = [
        body for doc, files, body in _number_blocks() if doc.name == "README.md" and cited in files
    ]
    assert any(gen.summary_table() in body for body in blocks), (
        f"the README's verdict summary sits in a numbers block citing {cited}"
    )
    # and the JSON holds the table's counts, row for row
    rows = []
    for f in json.loads(gen.summary_path().read_text())["families"]:
        cells = [f"{f['raw'][v]} ({f['holm'][v]})" for v in gen.VERDICT if v != "not_evidence"]
        rows.append(
            f"| {f['paper']} | {f['profile']}, {f['size']} | {f['claims']} | "
            f"{' | '.join(cells)} | {f['raw']['not_evidence']} |"
        )
    assert rows == gen.summary_table().splitlines()[2:]


def test_a_claim_rerun_with_more_seeds_counts_once(tmp_path, monkeypatch):
    """A table rerun into another folder with more seeds decides its claims: the summary counts
    each claim once (the most seeds), unadjusted and Holm-adjusted over the paper's family, the
    page keeps both rows and marks the other one; a not-evidence row is kept out of the claims,
    and a folder marked ``not_counted`` (a sensitivity run) out of the rows, with a note."""
    gen = _verdicts_table()

    def row(claim, seeds, verdict, p_zero, p_paper, diff=0.5, baseline="B", premise=None):
        r = {"claim": claim, "profile": "paper", "size": "cpu", "setting": "mnist",
             "method": "M", "baseline": baseline, "seeds": seeds, "paper_diff": 1.0,
             "diff_mean": diff, "diff_ci_low": 0.1, "diff_ci_high": 0.9, "verdict": verdict,
             "p_zero": p_zero, "p_paper": p_paper, "note": ""}  # fmt: skip
        if premise:
            r["premise"] = premise
        return r

    first = [
        row("T4", 10, "inconclusive", 0.2, 0.2),
        row("T2", 10, "not_reproduced", 0.5, 0.001, diff=0.1),
        row("T5", 10, "not_evidence", 0.5, 0.5, premise="the model stays at chance"),
    ]
    rerun = [row("T4", 20, "reproduced", 0.03, 0.4)]
    # a sensitivity run with still more seeds, marked as not testing the claims: left out
    sensitivity = [row("T4", 30, "not_reproduced", 0.5, 0.001)]
    for folder, rows in (("paper-cpu", first), ("paper-cpu-t4", rerun), ("lr", sensitivity)):
        (tmp_path / "filfl" / folder).mkdir(parents=True)
        (tmp_path / "filfl" / folder / "verdicts.json").write_text(json.dumps(rows))
    info = {"not_counted": "a sensitivity run at a learning rate not chosen"}
    (tmp_path / "filfl" / "lr" / "run_info.json").write_text(json.dumps(info))
    monkeypatch.setattr(gen, "RESULTS", tmp_path)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    _, lines, counts = gen.rows()
    key = ("filfl", "paper", "cpu")
    # Holm over the family's two claims: T4's p 0.03 becomes 0.06 (inconclusive), T2's test
    # against the claim 0.001 becomes 0.002 (still not reproduced)
    assert {k[3:]: v for k, v in counts.items() if k[:3] == key} == {
        ("raw", "reproduced"): 1, ("raw", "not_reproduced"): 1, ("raw", "not_evidence"): 1,
        ("holm", "inconclusive"): 1, ("holm", "not_reproduced"): 1, ("holm", "not_evidence"): 1,
    }  # fmt: skip
    assert len(lines) == 4
    assert "inconclusive (superseded by `filfl/paper-cpu-t4`, more seeds) | - |" in lines[0]
    assert lines[1].endswith("| not reproduced | not reproduced |")
    assert "not evidence (a premise fails: the notes below) | - |" in lines[2]
    assert lines[3].endswith("| reproduced | inconclusive |")
    assert "| filfl | paper, cpu | 2 | 1 (0) | 0 (0) | 0 (0) | 0 (1) | 1 (1) | 1 |" in (
        gen.summary_table()
    )
    assert any("not evidence: the model stays at chance" in n for n in gen.notes())
    assert "- `filfl/lr` is not counted: a sensitivity run at a learning rate not chosen" in (
        gen.notes()
    )


def test_every_committed_verdict_follows_from_its_own_interval():
    """Each committed row's verdict is the rule applied to its paired interval and the paper's
    difference (or ``not_evidence`` with the failed premise named), and its two p-values are
    the t-tests that interval implies. Where the folder has ``per_seed.json`` (runs since it
    exists), every row and ``cells.json`` are recomputed from the per-seed values."""
    from fedjax_sel.experiment.per_seed import summarize_per_seed
    from fedjax_sel.experiment.verdicts import claim_of_row, claim_row, p_values_from_ci, verdict

    gen = _verdicts_table()
    checked = 0
    for _, path in gen.all_verdict_files():  # those not counted too
        rows = json.loads(path.read_text())
        per_seed = path.parent / "per_seed.json"
        if per_seed.is_file():
            cells = json.loads(per_seed.read_text())["cells"]
            committed = json.loads((path.parent / "cells.json").read_text())
            assert summarize_per_seed(cells) == committed, path.parent.name
            for r in rows:  # JSON keeps floats exactly: the same code gives the same bits
                head = {k: r[k] for k in ("paper", "claim", "profile", "size", "setting")}
                again = claim_row(cells, claim_of_row(r), r["arms"], head)
                again.pop("note"), r.pop("note")  # the claim's note is not in the row alone
                assert again == r, f"{path.parent.name}: {r['claim']}"
        for r in rows:
            where = f"{path.parent.name}: {r['claim']}"
            if r["verdict"] == "not_evidence":
                assert r.get("premise"), where
            else:
                want = verdict(r["diff_ci_low"], r["diff_ci_high"], r["paper_diff"])
                assert r["verdict"] == want, where
            p0, pd = p_values_from_ci(r["diff_mean"], r["diff_ci_low"], r["diff_ci_high"],
                                      r["seeds"], r["paper_diff"])  # fmt: skip
            assert (r["p_zero"], r["p_paper"]) == pytest.approx((p0, pd), rel=1e-6, abs=1e-12)
            checked += 1
    assert checked >= 100


def test_every_per_seed_statistic_of_a_results_file_is_recomputed():
    """Where a reproduction folder has ``per_seed.json``, each statistic of its
    ``results.json`` that names its source (``from_per_seed``: a premise, a cell of a table, a
    paired mechanism row, a cell where the paper's own method loses, a mean of diagnostics
    each seed reduced from its curves) is what the committed per-seed values give, bit for
    bit; and the verdict rows it repeats are ``verdicts.json``'s."""
    from fedjax_sel.experiment.per_seed import not_recomputed, per_seed_stats_in

    reproduce = ROOT / "benchmarks" / "results" / "reproduce"
    checked = 0
    for per_seed in sorted(reproduce.glob("*/*/per_seed.json")):
        folder = per_seed.parent
        cells = json.loads(per_seed.read_text())["cells"]
        results = json.loads((folder / "results.json").read_text())
        if "verdicts" in results:
            assert results["verdicts"] == json.loads((folder / "verdicts.json").read_text())
        assert not not_recomputed(results, cells), folder
        checked += len(per_seed_stats_in(results))
    assert checked >= 60, checked


def _paired_comparisons_with_per_seed():
    reproduce = ROOT / "benchmarks" / "results" / "reproduce"
    for path in sorted(reproduce.glob("*/*/paired_vs_*/**/comparison.json")):
        folder = path.relative_to(reproduce).parts[:2]
        per_seed = reproduce.joinpath(*folder, "per_seed.json")
        if per_seed.is_file():
            yield pytest.param(path, per_seed, id=path.relative_to(reproduce).as_posix())


@pytest.mark.parametrize("path, per_seed", list(_paired_comparisons_with_per_seed()))
def test_paired_comparisons_are_recomputed_from_the_per_seed_files(path, per_seed):
    """A reproduction's ``paired_vs_*/comparison.json`` (``fedjax-sel compare`` over its run
    folders) is what ``compare`` gives on the committed per-seed values alone: every mean,
    interval, paired difference, bootstrap interval, p-value and win rate, bit for bit."""
    from fedjax_sel.experiment.compare import Run, compare
    from fedjax_sel.experiment.outdir import folder_name

    committed = json.loads(path.read_text())
    cells = json.loads(per_seed.read_text())["cells"]
    runs = []
    for setting, label in dict.fromkeys((r["setting"], r["strategy"]) for r in committed):
        key = f"{folder_name(setting)}/{folder_name(label)}"
        assert key in cells, f"{path}: no per-seed cell {key}"
        for seed, values in cells[key]["seeds"].items():
            records = [  # accuracy@R is read from the evaluation records
                {"round": int(m.split("@")[1]), "test_accuracy": v}
                for m, v in values.items()
                if m.startswith("accuracy@")
            ]
            runs.append(Run(Path(key), label, setting, int(seed), values, records))
    again = compare(
        runs=runs,
        baseline=committed[0]["baseline"],
        metrics=list(dict.fromkeys(r["metric"] for r in committed)),
        percent=any(r["unit"] == "percent" for r in committed),
        echo=None,
    )
    if committed and "diverged" not in committed[0]:  # written before rows counted them
        assert all(r.pop("diverged") == 0 for r in again)
    assert again == committed


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
    unbacked = [shown for shown, token, decimals, percent in _numbers(body)
                if not _backed(token, decimals, percent, values)]  # fmt: skip
    assert not unbacked, f"{doc.name}: numbers not in {files}: {unbacked[:20]}"


# results.json keys that hold a reproduction's inputs (its settings, the paper's numbers, what
# did not run, properties of the generated data: CA-Fed's target weights and fitted optima),
# not measurements
_RESULT_INPUTS = {
    "absent", "alpha_synthetic", "fitted_optima", "kappas", "labels", "main_setting", "methods",
    "note", "paper", "parts", "plots",
    "premise", "premise_holds", "profile", "scale", "seeds", "settings", "size", "t1_theta_scale",
    "table1_methods", "table1_seeds", "table3_rows", "tasks",
}  # fmt: skip
_RATE_INPUTS = {
    "client_grid", "server_grid", "fixed_server_lr", "tune_rounds", "tune_seeds", "given",
}  # fmt: skip
# Reproduction folders whose docs still quote numbers that their committed per-seed files do not
# give back, and why. Each must still have such a number (a folder that no longer does leaves
# this list); a number of any other folder that is not recomputed fails.
_NOT_YET_RECOMPUTED: dict[str, str] = {}


def _pop_paper_numbers(obj) -> list:
    """Removes the paper's own numbers (``paper_diff``, ``paper_value``) nested in ``obj`` (a
    row beside our statistic) and returns them: inputs, not measurements."""
    found = []
    if isinstance(obj, dict):
        found += [obj.pop(k) for k in ("paper_diff", "paper_value") if k in obj]
        for v in obj.values():
            found += _pop_paper_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            found += _pop_paper_numbers(v)
    return found


def _recomputed_and_other_values(f: str) -> tuple[list[float], list[float], str | None]:
    """A cited file's values split into those the tests recompute from committed per-seed
    files (or that are inputs or facts of the run) and the others, with its reproduction
    folder (``None`` outside ``benchmarks/results/reproduce/``)."""
    from fedjax_sel.experiment.per_seed import per_seed_stats_in

    path = ROOT / f
    data = json.loads(path.read_text())
    reproduce = ROOT / "benchmarks" / "results" / "reproduce"
    if reproduce not in path.parents or path.parent == reproduce:
        return _json_values(data, []), [], None  # measurements of our own, and summary.json
    parts = path.relative_to(reproduce).parts
    folder = "/".join(parts[:2])
    has_per_seed = (reproduce / folder / "per_seed.json").is_file()
    if path.name == "run_info.json":
        return _json_values(data, []), [], folder
    if path.name == "results.json":
        good = {k: v for k, v in data.items() if k in _RESULT_INPUTS}
        rest = {k: v for k, v in data.items() if k not in _RESULT_INPUTS}
        good["paper's numbers"] = _pop_paper_numbers(rest)
        # CA-Fed's learning rates: the grids and the rates a run was given are its inputs
        rates = rest.get("learning_rates", {})
        good["rates given"] = {k: v for k, v in rates.items() if k in _RATE_INPUTS}
        if has_per_seed:
            good["verdicts"] = rest.pop("verdicts", [])
            good["stats"] = per_seed_stats_in(rest)
        return _json_values(good, []), _json_values(rest, []), folder
    recomputed = path.name in ("cells.json", "verdicts.json", "per_seed.json") or (
        len(parts) > 3 and parts[2].startswith("paired_vs_")
    )
    if has_per_seed and recomputed:
        return _json_values(data, []), [], folder
    return [], _json_values(data, []), folder


def test_numbers_quoted_from_a_reproduction_are_recomputed_from_its_per_seed_files():
    """Every number a docs block quotes from a reproduction folder is one the tests recompute
    from its committed ``per_seed.json`` (a verdict row, a cell, a paired comparison, a
    statistic naming its source), an input of the run, or a fact of the run
    (``run_info.json``), except in the folders listed in ``_NOT_YET_RECOMPUTED``."""
    pending: dict[str, int] = {}
    wrong = []
    for doc, files, body in _number_blocks():
        split = {f: _recomputed_and_other_values(f) for f in files}
        for shown, token, decimals, percent in _numbers(body):
            if any(_backed(token, decimals, percent, good) for good, _, _ in split.values()):
                continue
            folders = {folder for good, other, folder in split.values()
                       if _backed(token, decimals, percent, other)}  # fmt: skip
            for folder in folders & _NOT_YET_RECOMPUTED.keys():
                pending[folder] = pending.get(folder, 0) + 1
            if folders - _NOT_YET_RECOMPUTED.keys():
                wrong.append(f"{doc.name}: {shown} from {sorted(folders)}")
    assert not wrong, "not recomputed from per-seed files:\n" + "\n".join(wrong[:30])
    stale = sorted(_NOT_YET_RECOMPUTED.keys() - pending.keys())
    assert not stale, f"every quoted number of {stale} is recomputed now: remove them"


_INTERVAL = re.compile(r"([-+\u2212]?\d+\.(\d+)) \[([-+\u2212]?\d+\.\d+), ([-+\u2212]?\d+\.\d+)\]")
_VERDICT_WORD = re.compile(
    r"\**(not reproduced|not evidence|smaller effect|larger effect|reproduced|inconclusive)\b"
)


def _verdict_cells():
    """Every table cell of a numbers block that cites a ``verdicts.json`` and names a verdict,
    with the paired interval of the nearest cell before it: (doc, line, interval, word, rows)."""
    for doc, files, body in _number_blocks():
        rows = [r for f in files if f.endswith("verdicts.json")
                for r in json.loads((ROOT / f).read_text())]  # fmt: skip
        if not rows:
            continue
        for line in body.splitlines():
            if not line.startswith("|"):
                continue
            interval = None
            for cell in line.strip("|").split("|"):
                words = _VERDICT_WORD.match(cell.strip())
                if words and interval is not None:
                    yield doc, line, interval, words.group(1).replace(" ", "_"), rows
                    interval = None
                found = _INTERVAL.findall(cell)
                if found:
                    interval = found[-1]


def _same_interval(interval, row) -> bool:
    mean, frac, low, high = interval
    if row.get("diff_mean") is None or row.get("diff_ci_low") is None:
        return False
    shown = [float(x.replace("\u2212", "-")) for x in (mean, low, high)]
    got = [row["diff_mean"], row["diff_ci_low"], row["diff_ci_high"]]
    digits = len(frac)
    return all(f"{a:.{digits}f}" == f"{b:.{digits}f}" for a, b in zip(shown, got, strict=True))


def test_every_verdict_word_in_a_docs_table_is_the_committed_verdict():
    """A hand-written table row that prints a paired interval and a verdict says the verdict
    that the cited ``verdicts.json`` holds for that interval (a row whose interval no cited
    verdict row has is an error too: the table cites the wrong file)."""
    checked, wrong = 0, []
    for doc, line, interval, word, rows in _verdict_cells():
        matches = [r for r in rows if _same_interval(interval, r)]
        if not matches:
            wrong.append(f"{doc.name}: no cited verdict row has {interval[0]} [{interval[2]}, "
                         f"{interval[3]}]: {line[:120]}")  # fmt: skip
        elif word not in {r["verdict"] for r in matches}:
            have = sorted({r["verdict"] for r in matches})
            wrong.append(f"{doc.name}: says {word}, the committed verdict is {have}: {line[:120]}")
        checked += 1
    assert not wrong, "\n".join(wrong)
    assert checked >= 40, checked


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
        file = ROOT / argv[i + 1]
        tuned = file.exists() and "[sweep.tune]" in file.read_text()  # 2 tune + 2 held out
        return argv + [
            "--set",
            "rounds=2",
            "--set",
            "eval_every=1",
            "--seeds",
            "4" if tuned else "2",
            "--no-progress",
        ]
    if command == "demo":
        return argv + ["--rounds", "2", "--no-progress"]
    if command == "list":
        return argv
    return None


@pytest.mark.slow
def test_every_example_runs_as_written(tmp_path, monkeypatch, capsys):
    from fedjax_sel.cli.main import build_parser, main
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
