"""The simulated world of text-Minecraft: positions, the pixel font and block families, box shapes, and the world
scores of CoLLM Appendix F.3 (see :mod:`trl_multiagent.environments.minecraft` for the formulas)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Pos = tuple[int, int, int]
AIR = "air"

#: A 3x5 pixel font (rows top to bottom).
FONT: dict[str, tuple[str, ...]] = {
    "A": (".#.", "#.#", "###", "#.#", "#.#"), "B": ("##.", "#.#", "##.", "#.#", "##."),
    "C": (".##", "#..", "#..", "#..", ".##"), "D": ("##.", "#.#", "#.#", "#.#", "##."),
    "E": ("###", "#..", "##.", "#..", "###"), "F": ("###", "#..", "##.", "#..", "#.."),
    "G": (".##", "#..", "#.#", "#.#", ".##"), "H": ("#.#", "#.#", "###", "#.#", "#.#"),
    "I": ("###", ".#.", ".#.", ".#.", "###"), "J": ("..#", "..#", "..#", "#.#", ".#."),
    "K": ("#.#", "#.#", "##.", "#.#", "#.#"), "L": ("#..", "#..", "#..", "#..", "###"),
    "M": ("#.#", "###", "#.#", "#.#", "#.#"), "N": ("##.", "#.#", "#.#", "#.#", "#.#"),
    "O": ("###", "#.#", "#.#", "#.#", "###"), "P": ("##.", "#.#", "##.", "#..", "#.."),
    "Q": (".#.", "#.#", "#.#", "##.", ".##"), "R": ("##.", "#.#", "##.", "#.#", "#.#"),
    "S": (".##", "#..", ".#.", "..#", "##."), "T": ("###", ".#.", ".#.", ".#.", ".#."),
    "U": ("#.#", "#.#", "#.#", "#.#", "###"), "V": ("#.#", "#.#", "#.#", "#.#", ".#."),
    "W": ("#.#", "#.#", "#.#", "###", "#.#"), "X": ("#.#", "#.#", ".#.", "#.#", "#.#"),
    "Y": ("#.#", "#.#", ".#.", ".#.", ".#."), "Z": ("###", "..#", ".#.", "#..", "###"),
}

#: Block families of the paper (wood, stone, concrete, obsidian); a StrBuild player holds one block of two families.
BLOCK_FAMILIES: dict[str, tuple[str, ...]] = {
    "wood": ("oak_planks", "birch_planks", "spruce_planks"),
    "stone": ("stone", "cobblestone", "stone_bricks"),
    "concrete": ("white_concrete", "red_concrete", "blue_concrete"),
    "obsidian": ("obsidian",),
}


def render_string(text: str) -> list[str]:
    """The ``#``/``.`` grid of ``text`` in :data:`FONT`, letters separated by one air column (top row first)."""
    if not text or any(c not in FONT for c in text):
        raise ValueError(f"StrBuild text must be non-empty capital letters A-Z, got {text!r}")
    return [".".join(FONT[c][r] for c in text) for r in range(5)]


def grid_cells(rows: Sequence[str], origin: Sequence[int]) -> set[Pos]:
    """World positions of the ``#`` cells of a top-down grid whose bottom-left cell is at ``origin``."""
    x0, y0, z0 = (int(v) for v in origin)
    height = len(rows)
    return {(x0 + c, y0 + height - 1 - r, z0) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "#"}


def neighbour_pairs(world: Mapping[Pos, str]) -> tuple[int, int]:
    """``(same, total)``: side-sharing pairs of placed blocks with the same block type, and all such pairs."""
    same = total = 0
    for (x, y, z), block in world.items():
        for nxt in ((x + 1, y, z), (x, y + 1, z), (x, y, z + 1)):
            other = world.get(nxt)
            if other is not None:
                total += 1
                same += other == block
    return same, total


def strbuild_metrics(target: set[Pos], world: Mapping[Pos, str]) -> dict[str, float]:
    """Appendix F.3 score of a StrBuild world and the evaluation metrics (see the module docstring)."""
    total = len(target)
    covered = sum(1 for p in target if p in world)
    extra = sum(1 for p in world if p not in target)
    same, pairs = neighbour_pairs(world)
    adjacency = same / pairs if pairs else 0.0
    score = 2.0 * covered / total - 1.5 * extra / total - (same / (2.0 * pairs) if pairs else 0.0)
    return {"score": score, "coverage": covered / total, "iou": covered / (total + extra), "extra": float(extra),
            "adjacency": adjacency, "same_pairs": float(same),
            "complete": float(covered == total and extra == 0 and same == 0)}


def housebuild_metrics(target: Mapping[Pos, str], world: Mapping[Pos, str], damage: float,
                       player_hp: float) -> dict[str, float]:
    """Appendix F.3 score of a HouseBuild world and the evaluation metrics (see the module docstring)."""
    total = len(target)
    covered = sum(1 for p, b in target.items() if world.get(p) == b)
    extra = sum(1 for p in world if p not in target)
    hurt = min(1.0, damage / player_hp)
    score = 2.0 * covered / total - 1.5 * extra / total - 0.2 * hurt
    return {"score": score, "coverage": covered / total, "iou": covered / (total + extra), "extra": float(extra),
            "hp": max(0.0, 1.0 - damage / player_hp), "damage": float(damage),
            "complete": float(covered == total and extra == 0)}


def parse_box(spec: str) -> tuple[Pos, Pos, str]:
    """``"x1 y1 z1 x2 y2 z2 block"`` -> (low corner, high corner, block)."""
    parts = spec.split()
    if len(parts) != 7:
        raise ValueError(f"a box is 'x1 y1 z1 x2 y2 z2 block', got {spec!r}")
    a = tuple(int(v) for v in parts[:3])
    b = tuple(int(v) for v in parts[3:6])
    lo = tuple(min(a[k], b[k]) for k in range(3))
    hi = tuple(max(a[k], b[k]) for k in range(3))
    return lo, hi, parts[6]  # type: ignore[return-value]


def box_cells(lo: Pos, hi: Pos) -> list[Pos]:
    return [(x, y, z) for x in range(lo[0], hi[0] + 1) for y in range(lo[1], hi[1] + 1) for z in range(lo[2], hi[2] + 1)]
