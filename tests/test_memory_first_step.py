"""benchmarks/memory_first_step.py's analysis, on a hand-made event list: what the first step keeps, by phase, and
torch's live bytes peak per phase occurrence."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from memory_first_step import analyse  # noqa: E402

MIB = 1 << 20


def test_the_first_steps_kept_tensors_and_the_live_peaks_by_phase():
    events = [  # (ns, address, bytes, phase)
        (10, 1, 4 * MIB, "time/generation"),     # kept: a copy made in the first rollout
        (11, 2, 2 * MIB, "time/generation"),     # freed in the rollout
        (12, 2, -2 * MIB, "time/generation"),
        (20, 3, 8 * MIB, "time/forward"),        # an activation, freed in the backward
        (30, 4, 1 * MIB, "time/backward"),       # kept: made in the backward
        (31, 3, -8 * MIB, "time/backward"),
        (32, 5, 1 * MIB, "other"),               # a gradient, freed by zero_grad after the step
        (40, 6, 2 * MIB, "time/optimizer"),      # kept: an optimizer moment
        (45, 5, -1 * MIB, "other"),
        (60, 7, 3 * MIB, "time/generation"),     # the second step: not the first step's
        (61, 7, -3 * MIB, "time/generation"),
        (70, 8, 1 * MIB, "time/optimizer"),
    ]
    optimizer = [(39, 41), (69, 71)]
    report = analyse(events, optimizer)
    kept = report["kept_from_first_step"]
    assert set(kept) == {"time/generation", "time/backward", "time/optimizer"}
    assert kept["time/generation"] == {"tensors": 1, "mib": 4.0, "sizes_bytes": [[4 * MIB, 1]]}
    assert kept["time/backward"]["mib"] == 1.0 and kept["time/optimizer"]["mib"] == 2.0
    # live MiB: 4, 6, 4 | 12 | 13, 5 | (6) | 8 | (7) | 10, 7 | 8
    assert report["phase_peaks"] == [
        {"phase": "time/generation", "peak_live_mib": 6.0}, {"phase": "time/forward", "peak_live_mib": 12.0},
        {"phase": "time/backward", "peak_live_mib": 13.0}, {"phase": "time/optimizer", "peak_live_mib": 8.0},
        {"phase": "time/generation", "peak_live_mib": 10.0}, {"phase": "time/optimizer", "peak_live_mib": 8.0}]


def test_a_profile_without_two_optimizer_steps_is_an_error():
    with pytest.raises(RuntimeError, match="two optimizer steps"):
        analyse([(1, 1, MIB, "time/forward")], [(2, 3)])
