"""``fedjax-sel reproduce comparators``: one headline of each of the seven comparator papers
(docs/comparators.md), each a paired comparison of the method against the baseline its paper
names, in the paper's setting scaled to a 2-core CPU, with verdicts.

Parts (``--option parts=clustered-ocs-fedcor-delta-fedcbs-pyramidfl-fedcs``, the default):

* ``clustered``: Clustered Sampling, both forms (Fraboni et al., ICML 2021), against uniform
  sampling on a non-iid, unbalanced partition (K = 100, m = 10): "better training
  convergence", read as the mean test accuracy over the evaluations.
* ``ocs``: OCS and AOCS (Chen, Horvath, Richtarik, TMLR 2022), m = 3 expected senders of a
  cohort of n_c = 32, against uniform sampling of m: "superior to uniform", on stable accuracy.
* ``fedcor``: FedCor (Tang et al., CVPR 2022), K = 100, m = 5, Dirichlet 0.2, against Rand and
  Pow-d (d = 10): faster convergence, read as the rounds to a target accuracy.
* ``delta``: DELTA (Wang et al., NeurIPS 2023), 10 of 200 clients, Dirichlet 0.1, against FedAvg
  (uniform): Table 2's mean of the 5 best test accuracies (+1.75 points on FEMNIST).
* ``fedcbs``: Fed-CBS (Zhang et al., ICML 2023) in the same setting against random selection:
  the rounds to a target accuracy.
* ``pyramidfl``: PyramidFL (Li et al., MobiCom 2022) against Oort in a devices scenario
  (log-normal devices, diurnal availability, over-commitment 1.3): the simulated seconds to a
  target accuracy (its 2.71x-13.66x speedup). Selection only: its intra-client plan does not
  run here.
* ``fedcs``: FedCS (Nishio and Yonetani, ICC 2019) against random selection under the same
  round deadline (FedLim): the simulated seconds to a target accuracy.

No CIFAR-10, FMNIST, FEMNIST or FedScale data are offline here: MNIST (a stratified 20% of its
training images, from ``--data-dir`` or ``$FEDJAX_SEL_DATA_DIR``) stands in, and each claim's
note says for what, and what else the CPU size changes. A time-to-accuracy claim reads the ln of
the baseline's rounds (or seconds) over the method's, censored at the run's end where the
target is not reached; it rests on the baseline reaching the target in at least half of its
seeds, and is ``not_evidence`` otherwise.

Sizes: ``cpu`` (the default, about 20 minutes on a 2-core CPU) and ``tiny`` (the embedded
digits, a few rounds: seconds a part, for tests; from Python, ``size="tiny"``). Profile:
``paper`` only: where a paper was not read, each strategy already follows its reference code
(docs/comparators/*.md), so a ``code`` profile would rerun the same configurations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.execution import Execution
from fedjax_sel.experiment.outputs import write_atomic, write_json
from fedjax_sel.experiment.reproductions import output_dir, register_reproduction
from fedjax_sel.experiment.study import Study, markdown_table, verdicts_and_absent
from fedjax_sel.experiment.verdicts import Claim
from studies.comparators_setup import (
    PARTS,
    READERS,
    SCALES,
    SIZES,
    Scale,
    arms,
    claims,
    data_path_for,
    make_config,
)

PREMISE_SHARE = 0.5  # a time-to-accuracy claim needs its baseline at the target in half the seeds


def check_arguments(profile: str, size: str, seeds: int, parts: tuple[str, ...]) -> None:
    """A :class:`ConfigError` naming a bad profile, size, seed count or part."""
    if profile != "paper":
        raise ConfigError(
            f"comparators: profile must be 'paper', got {profile!r}: each strategy already "
            "follows its reference code where the paper was not read (docs/comparators.md)"
        )
    if size not in SIZES:
        raise ConfigError(
            f"comparators: size must be one of {SIZES}, got {size!r} (the papers' own sizes "
            "need their data sets and a GPU: docs/comparators.md, 'Verdicts')"
        )
    if not (isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1):
        raise ConfigError(f"comparators: seeds must be a positive integer, got {seeds!r}")
    bad = sorted(set(parts) - set(PARTS))
    if bad or not parts:
        raise ConfigError(
            f"comparators: unknown or no part(s) {bad or list(parts)}; known: {PARTS}"
        )


def premise(study: Study, claim: Claim) -> tuple[str, dict[str, Any] | None]:
    """For a time-to-accuracy claim (metric ``ln_speed@A`` or ``ln_time_speed@A``): what
    fails (``""``: nothing), and the baseline's reach rate as a statistic recomputed from
    ``per_seed.json`` (``None`` for other claims). It fails when the baseline reaches A in
    fewer than :data:`PREMISE_SHARE` of its seeds (its rounds to A are mostly censored), or
    when a method run that missed A ended before the baseline's time to it (reached or
    censored: the method's censored value, a lower bound, would count as faster)."""
    name, _, target = claim.metric.partition("@")
    if name not in ("ln_speed", "ln_time_speed"):
        return "", None
    reach = f"reached@{target}"
    rate = study.per_seed_stat(claim.setting, claim.baseline, reach, 1.0)
    fails = []
    share = rate["mean"]
    if share is None or share < PREMISE_SHARE:
        have = "none" if share is None else f"{share:.0%}"
        fails.append(
            f"{claim.baseline} reached {float(target):.0%} test accuracy in {have} of its seeds "
            f"(fewer than {PREMISE_SHARE:.0%})"
        )
    hit = study.values(claim.setting, claim.label, reach)
    ours = study.values(claim.setting, claim.label, claim.metric)
    base = study.values(claim.setting, claim.baseline, claim.metric)
    early = [s for s in ours if s in base and not hit.get(s) and ours[s] > base[s]]
    if early:
        fails.append(
            f"{claim.label} missed the target and stopped before {claim.baseline}'s time to it "
            f"(reached or censored) in {len(early)} seed(s)"
        )
    return "; ".join(fails), rate


def part_table(study: Study, part: str, labels: list[str], target: float | None) -> str:
    """Per arm: stable and final accuracy, the mean over evaluations, the 5 best, and (with a
    target) the rounds and simulated seconds to it and how many seeds reached it."""
    rows = []
    for label in labels:
        row = [
            label,
            study.cell_text(part, label, "stable_accuracy"),
            study.cell_text(part, label, "final_accuracy"),
            study.cell_text(part, label, "curve_mean"),
            study.cell_text(part, label, "best_mean@5"),
        ]
        if target is not None:
            hit = study.values(part, label, f"reached@{target:g}")
            row += [
                study.cell_text(part, label, f"rounds_to@{target:g}", 1.0, 1),
                f"{int(sum(hit.values()))}/{len(hit)}",
            ]
            secs = study.values(part, label, "sim_time_s")
            row.append(f"{np.mean(list(secs.values())):.0f}" if secs else "-")
        rows.append(row)
    header = ["arm", "stable acc. %", "final acc. %", "mean over evals %", "5 best %"]
    if target is not None:
        header += [f"rounds to {target:.0%} (censored)", "reached", "simulated s (run)"]
    return markdown_table(header, rows)


@register_reproduction(
    "comparators",
    "The seven comparators' headlines (Clustered Sampling, OCS/AOCS, FedCor, DELTA, Fed-CBS, "
    "PyramidFL, FedCS), each against its paper's baseline in its setting scaled to a CPU",
)
def run(
    *,
    seeds: int = 10,
    out,
    size: str = "cpu",
    profile: str = "paper",
    data_dir=None,
    execution: Execution | None = None,
    parts: tuple[str, ...] = PARTS,
) -> dict:
    """Runs ``parts`` at ``size`` (``seeds`` paired seeds) and writes ``results.json``,
    ``tables.md``, ``per_seed.json``, ``cells.json`` and ``verdicts.json`` under ``out``."""
    parts = tuple(parts)
    check_arguments(profile, size, seeds, parts)
    out = output_dir(out)
    scale: Scale = SCALES[size]
    study = Study(
        "comparators",
        profile=profile,
        size=size,
        seeds=seeds,
        out=out,
        readers=READERS,
        execution=execution,
    )
    labels: dict[str, list[str]] = {}
    for part in parts:
        task = scale.tasks[part]
        path = data_path_for(task, scale, out, data_dir)
        labels[part] = []
        for arm in arms(part, scale):
            study.add(part, arm.label, make_config(task, arm, path))
            labels[part].append(arm.label)
    study.run()

    md = [
        f"# The comparators' headlines (profile {profile}, size {size}, {seeds} paired seeds)",
        "",
        "Cells: ours, mean [95% CI] over seeds; accuracies in %; rounds to the target are "
        "censored at the evaluation after the last where it is not reached.",
    ]

    def section(title: str, body: str) -> None:
        md.extend(["", f"## {title}", "", body])
        print(f"\n{title}\n{body}")

    results: dict[str, Any] = {
        "profile": profile,
        "size": size,
        "seeds": seeds,
        "parts": list(parts),
        "tasks": {p: dataclasses.asdict(scale.tasks[p]) for p in parts},
        "labels": labels,
        "premises": {},
    }
    all_claims: list[Claim] = []
    for part in parts:
        task = scale.tasks[part]
        section(
            f"{part}: {task.dataset}, K = {task.num_clients}, {task.per_round} slots, "
            f"{task.rounds} rounds, {task.partition}",
            part_table(study, part, labels[part], task.target),
        )
        for claim in claims(part, scale):
            failed, rate = premise(study, claim)
            if rate is not None:
                results["premises"][f"{part}/{claim.label} vs {claim.baseline}"] = rate
            all_claims.append(dataclasses.replace(claim, premise=failed))
    rows = verdicts_and_absent(study, all_claims, section, md, {})
    results["verdicts"] = rows
    write_atomic(out / "tables.md", "\n".join(md) + "\n")
    write_json(out / "results.json", results)
    print(f"\nwritten: {out}/results.json, tables.md, verdicts.json")
    return results
