"""Writes docs/benchmark.md and the README's benchmark summary from the committed results of
the selection benchmark (benchmarks/results/selection/cpu/leaderboard.json).

    python benchmarks/selection/report.py [--check]

The leaderboard itself is rebuilt from the per-seed records first (``fedjax-sel suite FILE
--out DIR --report-only`` does that alone); ``--check`` writes nothing and exits 1 when a
generated file differs from what is committed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE_FILE = "benchmarks/selection/cpu.toml"
RESULTS = "benchmarks/results/selection/cpu"


def generated() -> dict[Path, str]:
    """Each generated file and its text, from the committed per-seed records."""
    from fedjax_sel.benchmark import leaderboard, page, report
    from fedjax_sel.benchmark.suite import load_suite

    suite = load_suite(ROOT / SUITE_FILE)
    doc = leaderboard.build(suite, ROOT / RESULTS)
    doc["runs"] = report.invocations(ROOT / RESULTS)
    spent = ROOT / RESULTS / "suite_time.json"  # benchmarks/suite_time.py: where the time went
    doc["suite_time"] = json.loads(spent.read_text()) if spent.exists() else None
    readme = (ROOT / "README.md").read_text()
    return {
        ROOT / "docs" / "benchmark.md": page.docs_page(doc, suite, SUITE_FILE, RESULTS),
        ROOT / "README.md": page.replace_readme_block(readme, page.readme_block(doc)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    a = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not a.check:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if a.check and stale:
        print("out of date: " + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
