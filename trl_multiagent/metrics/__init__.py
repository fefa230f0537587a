"""Metrics as `evaluate` modules that load from this package (no hub): ``load_metric("coding_at_k")``."""

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
