"""Paired differences of a ``fedjax-sel compare`` result in percentage points.

    python benchmarks/paired_pp.py DIR/comparison.json   # writes DIR/diff_pp.json

``compare`` reports accuracies as fractions; the papers and our docs quote their differences in
percentage points. This writes each non-baseline row's paired difference and its 95% interval
times 100, so that the docs can cite the numbers they print.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedjax_sel.experiment import read_json, write_json


def diff_pp(rows: list[dict]) -> list[dict]:
    """The paired rows (the baseline's own rows have no difference) with differences x 100."""
    return [
        {
            "setting": r["setting"],
            "strategy": r["strategy"],
            "baseline": r["baseline"],
            "metric": r["metric"],
            "pairs": r["pairs"],
            **{k: 100 * r[k] for k in ("diff", "diff_ci_low", "diff_ci_high")},
        }
        for r in rows
        if r["diff"] is not None
    ]


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("comparison", type=Path, help="a comparison.json written by fedjax-sel compare")
    args = p.parse_args(argv)
    rows = diff_pp(read_json(args.comparison))
    out = write_json(args.comparison.with_name("diff_pp.json"), rows)
    for r in rows:
        print(
            f"{r['setting']}: {r['strategy']} - {r['baseline']} = {r['diff']:+.2f} "
            f"[{r['diff_ci_low']:+.2f}, {r['diff_ci_high']:+.2f}] pp ({r['pairs']} pairs)"
        )
    return out


if __name__ == "__main__":
    main()
