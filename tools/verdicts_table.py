"""The verdict tables: every claim of every reproduction run, from the committed
``benchmarks/results/reproduce/<paper>/<profile>-<size>/verdicts.json`` files.

    python tools/verdicts_table.py            # every claim (the table of docs/verdicts.md)
    python tools/verdicts_table.py --write    # rewrites docs/verdicts.md and summary.json
    python tools/verdicts_table.py --summary  # counts per paper and profile (README)
    python tools/verdicts_table.py --runs     # each run's wall time and machine

A claim measured in several folders of one paper, profile and size (a table rerun with more
seeds) is counted once in the summary, by the folder with the most seeds; the table lists every
row and marks the others superseded.

``benchmarks/results/reproduce/summary.json`` holds what the README's summary and the page count
(claims and verdicts per paper, profile and size; each folder's paired seeds and recorded runs;
ours over the paper's difference where a verdict is about the size), so the documents' number
check finds those counts in a committed JSON.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from fedjax_sel.experiment.verdicts import holm_verdicts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "reproduce"
PAPERS = ("hetero_select", "filfl", "ca_fed", "fedcvr_bolt", "sp_cacw", "comparators")
VERDICT = {
    "reproduced": "reproduced",
    "smaller_effect": "smaller effect",
    "larger_effect": "larger effect",
    "inconclusive": "inconclusive",
    "not_reproduced": "not reproduced",
    "not_evidence": "not evidence",
}


def _signed(x: float) -> str:
    return f"{x:+.2f}"


# a setting in a claim's label ("t = 500", "N=24", "kappa2 = 0.1"): the run's or the paper's
# parameter, not a measurement, so in a code span (the docs' number check skips those)
_SETTING = re.compile(r"\b[A-Za-z]\w* ?= ?-?\d+(?:\.\d+)?\b")


def _label(text: str) -> str:
    return _SETTING.sub(lambda m: f"`{m.group(0)}`", text)


def notes() -> list[str]:
    """The runs' notes on their claims (premises not met, sizes), one line per distinct note."""
    seen: dict[str, list[str]] = {}
    for paper, _, v in _entries():
        where = f"{paper} {v['profile']}-{v['size']}: {v['claim']}"
        for note in (v.get("note"), v.get("premise") and f"not evidence: {v['premise']}"):
            if note:
                seen.setdefault(note, [])
                if where not in seen[note]:
                    seen[note].append(where)
    lines = [f"- {'; '.join(w)}: {note}" for note, w in seen.items()]
    for paper, path in all_verdict_files():
        if reason := not_counted(path.parent):
            lines.append(f"- `{paper}/{path.parent.name}` is not counted: {reason}")
    return lines


def _claim(v: dict) -> str:
    """The claim's name, with its setting where the name does not say it."""
    claim = v["claim"]
    if v.get("setting") and v["setting"].lower() not in claim.lower():
        claim = f"{claim} ({v['setting']})"
    return claim


def claim_key(paper: str, v: dict) -> tuple:
    """What makes two rows the same claim: the paper, profile, size, setting, claim and pair."""
    return (paper, v["profile"], v["size"], v.get("setting"), v["claim"], v["method"],
            v["baseline"])  # fmt: skip


def not_counted(folder: Path) -> str | None:
    """Why a folder's verdict rows do not test the paper's claims (``run_info.json``'s
    ``not_counted``, e.g. a sensitivity run at a learning rate the reproduction did not
    choose), or ``None``: such rows are recomputed like any others but neither counted nor
    listed."""
    info = folder / "run_info.json"
    return json.loads(info.read_text()).get("not_counted") if info.is_file() else None


def all_verdict_files() -> list[tuple[str, Path]]:
    """``(paper, path)`` of every committed ``verdicts.json``, papers in :data:`PAPERS` order."""
    return [(p, path) for p in PAPERS for path in sorted((RESULTS / p).glob("*/verdicts.json"))]


def verdict_files() -> list[tuple[str, Path]]:
    """:func:`all_verdict_files` but those :func:`not_counted`: the ones that test the paper's
    claims."""
    return [(p, path) for p, path in all_verdict_files() if not not_counted(path.parent)]


def _entries() -> list[tuple[str, str, dict]]:
    """``(paper, folder, row)`` for every row of every committed ``verdicts.json``."""
    return [
        (paper, path.parent.name, v)
        for paper, path in verdict_files()
        for v in json.loads(path.read_text())
    ]


def deciding_folders(entries: list[tuple[str, str, dict]]) -> dict[tuple, str]:
    """Per claim, the folder whose row decides it: a claim measured again in another folder
    (e.g. one table rerun with more seeds) counts once, with its most seeds (on a tie, the
    folder sorted last)."""
    best: dict[tuple, tuple[int, str]] = {}
    for paper, folder, v in entries:
        key = claim_key(paper, v)
        best[key] = max(best.get(key, (-1, "")), (int(v["seeds"]), folder))
    return {key: folder for key, (_, folder) in best.items()}


def family_verdicts(entries: list[tuple[str, str, dict]]) -> dict[int, str]:
    """Holm-adjusted verdicts, by index into ``entries``, of the deciding rows: one family per
    paper, profile and size (its claims counted once; ``not evidence`` rows outside it)."""
    deciding = deciding_folders(entries)
    families: dict[tuple, list[int]] = {}
    for i, (paper, folder, v) in enumerate(entries):
        if deciding[claim_key(paper, v)] == folder:
            families.setdefault((paper, v["profile"], v["size"]), []).append(i)
    out = {}
    for members in families.values():
        adjusted = holm_verdicts([entries[i][2] for i in members])
        out.update(zip(members, adjusted, strict=True))
    return out


def rows() -> tuple[list[str], list[str], Counter]:
    """The table's lines (every row of every folder; a row that another folder's run of the
    same claim supersedes says so) and the verdict counts of the deciding rows only, keyed
    ``(paper, profile, size, "raw" or "holm", verdict)``."""
    entries = _entries()
    deciding = deciding_folders(entries)
    holm = family_verdicts(entries)
    files = [str(path.relative_to(ROOT)) for _, path in verdict_files()]
    lines, counts = [], Counter()
    for i, (paper, folder, v) in enumerate(entries):
        verdict = VERDICT[v["verdict"]]
        if v.get("premise"):
            verdict += " (a premise fails: the notes below)"
        decider = deciding[claim_key(paper, v)]
        if decider == folder:
            counts[(paper, v["profile"], v["size"], "raw", v["verdict"])] += 1
            counts[(paper, v["profile"], v["size"], "holm", holm[i])] += 1
            family = VERDICT[holm[i]] if v["verdict"] != "not_evidence" else "-"
        else:
            verdict += f" (superseded by `{paper}/{decider}`, more seeds)"
            family = "-"
        unstated = v.get("paper_diff") is None or "no number" in (v.get("note") or "")
        paper_diff = "-" if unstated else _signed(v["paper_diff"])
        claim = _label(_claim(v))
        ours = (
            f"{_signed(v['diff_mean'])} [{_signed(v['diff_ci_low'])}, {_signed(v['diff_ci_high'])}]"
        )
        # labels in code spans: they name runs (`compare --baseline`), and a number
        # in one ("FedProx, 50%") is not a measurement (the docs' number check)
        lines.append(
            f"| {paper} | {claim}: `{v['method']}` vs `{v['baseline']}` | "
            f"{v['profile']}, {v['size']} | {v['seeds']} | "
            f"{paper_diff} | {ours} | {verdict} | {family} |"
        )
    return files, lines, counts


def summary(counts: Counter) -> list[str]:
    """One line per paper, profile and size: the claims (not-evidence rows apart) and, per
    verdict, the unadjusted count with the Holm-adjusted one in brackets."""
    out = []
    for paper, profile, size in sorted(
        {k[:3] for k in counts}, key=lambda k: (PAPERS.index(k[0]), k)
    ):
        raw = [counts[(paper, profile, size, "raw", v)] for v in VERDICT]
        holm = [counts[(paper, profile, size, "holm", v)] for v in VERDICT]
        cells = [f"{r} ({h})" for r, h in zip(raw[:-1], holm[:-1], strict=True)]
        out.append(
            f"| {paper} | {profile}, {size} | {sum(raw[:-1])} | {' | '.join(cells)} | {raw[-1]} |"
        )
    return out


def summary_json() -> dict:
    """``summary.json``: the counts behind the README's summary (per paper, profile and size:
    the claims and, per verdict, the unadjusted and Holm-adjusted counts of the deciding rows)
    and behind the page's runs table (per folder: the claims' paired seeds and the runs
    ``run_info.json`` records), and, for each row whose verdict is about the size (smaller or
    larger effect), our mean difference over the paper's."""
    _, _, counts = rows()
    families = []
    for paper, profile, size in sorted(
        {k[:3] for k in counts}, key=lambda k: (PAPERS.index(k[0]), k)
    ):
        raw = {v: counts[(paper, profile, size, "raw", v)] for v in VERDICT}
        holm = {v: counts[(paper, profile, size, "holm", v)] for v in VERDICT}
        claims = sum(n for v, n in raw.items() if v != "not_evidence")
        families.append({"paper": paper, "profile": profile, "size": size, "claims": claims,
                         "raw": raw, "holm": holm})  # fmt: skip
    folders = {}
    for paper, path in verdict_files():
        verdicts = json.loads(path.read_text())
        info = path.parent / "run_info.json"
        recorded = 0
        if info.exists():
            recorded = 1 + len(json.loads(info.read_text()).get("earlier_runs", []))
        ratios = {
            f"{_claim(v)}: {v['method']} vs {v['baseline']}": round(
                v["diff_mean"] / v["paper_diff"], 2
            )
            for v in verdicts
            if v["verdict"] in ("smaller_effect", "larger_effect") and v.get("paper_diff")
        }
        folders[f"{paper}/{path.parent.name}"] = {
            "seeds": max(v["seeds"] for v in verdicts),
            "runs_recorded": recorded,
            "size_over_paper": ratios,
        }
    return {
        "written_by": "python tools/verdicts_table.py --write",
        "families": families,
        "folders": folders,
    }


def summary_text() -> str:
    return json.dumps(summary_json(), indent=2) + "\n"


def summary_path() -> Path:
    return RESULTS / "summary.json"


def _machine(m: dict) -> str:
    kind = "CPU" if m["backend"] == "cpu" else m["device_kind"]
    # runs before machine_info() recorded the CPU model have only the architecture
    # in a code span: a model name's clock ("@ 2.80GHz") is not a measurement (the number check)
    model = f" (`{m['cpu_model']}`)" if m.get("cpu_model") else ""
    cpu = f"{m['cpu_count']} cores{model}"
    return f"{m['num_devices']} x {kind}, {cpu}, jax `{m['jax_version']}`"


def runs() -> tuple[list[str], list[str]]:
    """One row per committed run that recorded ``run_info.json`` (the wall time of the whole
    reproduction and its machine); runs from before that file existed are listed without."""
    files, lines = [], []
    for paper, verdicts in verdict_files():
        folder = verdicts.parent
        info_path = folder / "run_info.json"
        # the claims' paired seeds (a run's tables can have their own seed counts)
        seeds = max(v["seeds"] for v in json.loads(verdicts.read_text()))
        if not info_path.exists():
            lines.append(f"| {paper} | {folder.name} | {seeds} | - | not recorded | - |")
            continue
        files.append(str(info_path.relative_to(ROOT)))
        last = json.loads(info_path.read_text())
        # every run into the folder, oldest first (run_info.json keeps the earlier ones)
        history = [*last.get("earlier_runs", []), last]
        for i, info in enumerate(history, 1):
            name = folder.name
            if len(history) > 1:
                name += f" ({i} of {len(history)})"
            # the verdicts' seeds belong to the last run; an earlier one's are not recorded
            # (its `--seeds` can differ from a table's own seed count, e.g. table1_seeds)
            # a folder rerun beside other work (to commit its per-seed values) says so
            shared = " (CPU shared)" if info.get("cpu_shared") else ""
            lines.append(
                f"| {paper} | {name} | {seeds if i == len(history) else '-'} | "
                f"{_options(info['options'])} | "
                f"{info['wall_seconds']:.1f} s{shared} | {_machine(info['machine'])} |"
            )
    return files, lines


def _options(options: dict) -> str:
    # code spans: options are arguments, not measurements (the docs' number check)
    text = ", ".join(f"`{k}={v}`" for k, v in options.items() if k != "lrs") or "-"
    return text + (", learning rates given" if "lrs" in options else "")


def runs_table() -> str:
    files, lines = runs()
    files.append(str(summary_path().relative_to(ROOT)))  # the seeds column, runs per folder
    return "\n".join(
        [
            f"<!-- numbers: {' '.join(files)} -->",
            "",
            "| paper | profile-size | seeds | options | wall time | machine |",
            "|---|---|---:|---|---:|---|",
            *lines,
            "",
            "<!-- /numbers -->",
        ]
    )


def page() -> str:
    """docs/verdicts.md as the committed ``verdicts.json`` and ``run_info.json`` files give it."""
    files, lines, _ = rows()
    return DOCS_PAGE.format(table=table(files, lines), notes="\n".join(notes()), runs=runs_table())


def summary_table() -> str:
    """The README's table: claims per paper, profile and size, by verdict (Holm-adjusted in
    brackets)."""
    _, _, counts = rows()
    return "\n".join(
        [
            "| paper | profile, size | claims | reproduced | smaller effect | larger effect | "
            "inconclusive | not reproduced | not evidence |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
            *summary(counts),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--summary", action="store_true", help="counts per paper and profile")
    p.add_argument("--write", action="store_true", help="rewrite docs/verdicts.md")
    p.add_argument("--runs", action="store_true", help="each run's wall time and machine")
    a = p.parse_args()
    if a.runs:
        print(runs_table())
    elif a.write:
        (ROOT / "docs" / "verdicts.md").write_text(page())
        summary_path().write_text(summary_text())
        print(f"wrote docs/verdicts.md and {summary_path().relative_to(ROOT)}")
    elif a.summary:
        print(summary_table())
    else:
        files, lines, _ = rows()
        print(table(files, lines))


def table(files: list[str], lines: list[str]) -> str:
    return "\n".join(
        [
            f"<!-- numbers: {' '.join(files)} -->",
            "",
            "| paper | claim: method vs baseline | profile, size | seeds | paper's difference | "
            "ours [95% CI] | verdict | Holm |",
            "|---|---|---|---:|---:|---|---|---|",
            *lines,
            "",
            "<!-- /numbers -->",
        ]
    )


DOCS_PAGE = """# Verdicts: every claim we tested, as run

Written by `python tools/verdicts_table.py --write` from the committed
`benchmarks/results/reproduce/<paper>/<profile>-<size>/verdicts.json` (each run by
`fedjax-sel reproduce NAME --profile PROFILE --size SIZE`), and with it
`benchmarks/results/reproduce/summary.json`: the counts of the README's summary, each folder's
seeds and runs, and ours over the paper's difference where a verdict is about the size.
Differences are method minus baseline, paired by seed, in the claim's unit (accuracy points, or
percent of the baseline's MSE for FedCVR-Bolt's regressions); the interval is the paired-t 95%
interval over seeds.

- **profile**: `paper` runs the experiment as the paper's text describes it, `code` as the
  public reference code runs it (defaults and behaviour that differ from the text); each
  method's page under `docs/` lists the differences.
- **size**: `cpu` is scaled down to finish on a 2-core CPU (fewer rounds and clients, smaller
  data); `paper` is the paper's size. A verdict at `cpu` size says what holds at that size,
  not what the paper measured at its own.
- **verdict**, on the paired difference's 95% interval and the paper's difference D (a
  D of 0, shown `-` where the text gives no number, claims a direction only):
  - `reproduced`: the interval excludes zero on the side of the paper's effect and contains
    D (for a direction only: excludes zero on the better side);
  - `smaller effect` / `larger effect`: the direction holds (zero excluded on D's side) but the
    interval lies wholly below / above D's size;
  - `inconclusive`: it holds both zero and D (more seeds would settle it);
  - `not reproduced`: it excludes D and does not lie beyond zero on D's side;
  - `not evidence`: a premise the claim rests on fails in the run (the row says which); such
    rows are kept here and left out of the claims counted.

  Only what the paper claims is a claim: its method better than a baseline, or a stated
  ablation effect (a table cell where its own method loses is not scored).
- **Holm**: the verdict with the family-wise error held at 5%. The family is a paper's claims
  in one profile and size (each claim counted once), without the not-evidence rows. Each row
  has the paired t-test's two-sided p-values against zero (`p_zero`) and against D
  (`p_paper`); at 0.05 unadjusted they give the verdict column exactly. Holm's step-down
  adjustment is applied over the family's tests against zero, and apart over its tests
  against D, and the same rule then gives this column. A row another run supersedes has no
  Holm verdict.
- A claim measured again in another folder (a table rerun with more seeds) is decided by the
  run with the most seeds; its other rows say "superseded" and the README's summary counts the
  claim once.

{table}

Notes the runs attach to their claims:

{notes}

## The runs

Each run's options (beside its profile and size), its wall time from start to the written
tables, and the machine (`run_info.json`, written by every `fedjax-sel reproduce` since it
existed; the `cpu` runs from before it were rerun to record theirs). Several runs into one
folder (a resumed run, or one that adds parts or grid points and reuses the finished cells) are
listed in order, each with the time of its own part (`run_info.json` keeps the earlier runs
since `earlier_runs` existed). Parts reused from attempts before that are not counted:
`ca_fed/code-paper` reused its Synthetic tuning (105 cells) from an earlier attempt,
`ca_fed/paper-paper`'s first run 38 of its 70 tuning cells and three of its five methods' runs,
`ca_fed/paper-paper-mnist` the tuning and runs of CA-Fed, Unbiased and AdaFed
([ca_fed.md](ca_fed.md)). The machines differ between sessions (an Intel Xeon, later an AMD
EPYC, then an Intel Xeon again, all 2 cores); runs since `run_info.json` recorded the CPU model
name it in brackets. Compare wall times on one machine only. The seeds column is the claims'
paired seeds of the folder's `verdicts.json`, which belong to its last run; an earlier run's
are not recorded (its `--seeds` need not be a table's own count, e.g. FedCVR-Bolt's
`table1_seeds`), so it shows `-`.

{runs}
"""


if __name__ == "__main__":
    main()
