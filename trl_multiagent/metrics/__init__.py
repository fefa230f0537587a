"""Metrics: pure functions that score rollouts and evaluations, the lowest of the metrics / credit / evaluation
packages (it imports neither of the other two).

| module | what |
|---|---|
| ``qa`` | exact match, accuracy by containment, token F1 (MHGPO Table 1) |
| ``similarity`` | MHGPO Figure 9: the intra-group similarity of a group's outputs |
| ``debate`` | MAPoRL's majority vote with its tie rule, peer majorities, correctness transitions (Sec. 4.1, 4.3) |
| ``at_k`` | the @k metrics of MAGRPO App. B (pass@k, acc@k, coop@k) |
| ``stats`` | means over tasks, percentile bootstrap intervals, the paired bootstrap of a gain |
| ``classification`` | a verifier's accuracy at a threshold, ROC AUC and their bootstrap over questions |

The folders are `evaluate` modules that load from this package (no hub): ``load_metric("coding_at_k")``.

May import: :mod:`trl_multiagent.errors` only. ``answers`` is the one answer parser (the last ``\\boxed{}``, the last
number, a program's printed line, an NLI label; Math-Verify comparison).
"""

from pathlib import Path

METRICS_DIR = Path(__file__).parent


def load_metric(name: str):
    """``evaluate.load`` of one of the modules in this folder, by name."""
    import evaluate

    path = METRICS_DIR / name
    if not (path / f"{name}.py").is_file():
        available = sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"No metric {name!r} in {METRICS_DIR}; available: {available}")
    return evaluate.load(str(path))
