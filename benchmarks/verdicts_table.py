"""The README's verdict table: every claim of every reproduction run, from the committed
``benchmarks/results/reproduce/<paper>/<profile>-<size>/verdicts.json`` files.

    python benchmarks/verdicts_table.py            # prints the Markdown block
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "reproduce"
PAPERS = ("hetero_select", "filfl", "ca_fed", "fedcvr_bolt", "sp_cacw")
VERDICT = {
    "reproduced": "reproduced",
    "not_reproduced": "not reproduced",
    "inconclusive": "inconclusive",
}


def _signed(x: float) -> str:
    return f"{x:+.2f}"


def rows() -> tuple[list[str], list[str]]:
    files, lines = [], []
    for paper in PAPERS:
        for path in sorted((RESULTS / paper).glob("*/verdicts.json")):
            files.append(str(path.relative_to(ROOT)))
            for v in json.loads(path.read_text()):
                paper_diff = "-" if v.get("paper_diff") is None else _signed(v["paper_diff"])
                ours = (
                    f"{_signed(v['diff_mean'])} [{_signed(v['diff_ci_low'])}, "
                    f"{_signed(v['diff_ci_high'])}]"
                )
                lines.append(
                    f"| {paper} | {v['claim']}: {v['method']} vs {v['baseline']} | "
                    f"{v['profile']}, {v['size']} | {v['seeds']} | "
                    f"{paper_diff} | {ours} | {VERDICT[v['verdict']]} |"
                )
    return files, lines


def main() -> None:
    files, lines = rows()
    print(f"<!-- numbers: {' '.join(files)} -->")
    print()
    print(
        "| paper | claim: method vs baseline | profile, size | seeds | paper's difference | "
        "ours [95% CI] | verdict |"
    )
    print("|---|---|---|---:|---:|---|---|")
    print("\n".join(lines))
    print()
    print("<!-- /numbers -->")


if __name__ == "__main__":
    main()
