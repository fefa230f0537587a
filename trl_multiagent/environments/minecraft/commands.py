"""Players' answers as Minecraft command lines: reading the lines of a response, the command forms the simulator
accepts, and what became of each line (accepted, or rejected with a reason)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from trl_multiagent.environments.minecraft.world import Pos

REJECT_REASONS = ("syntax", "command", "bbox", "block", "inventory", "attack", "limit")

_COMMAND_WORD = re.compile(r"^/?([a-z_]+)\b")
_INT = r"(-?\d+)"
_BLOCK = r"(?:minecraft:)?([a-z_]+)"
SETBLOCK = re.compile(rf"^/?setblock\s+{_INT}\s+{_INT}\s+{_INT}\s+{_BLOCK}\s*$")
FILL = re.compile(rf"^/?fill\s+{_INT}\s+{_INT}\s+{_INT}\s+{_INT}\s+{_INT}\s+{_INT}\s+{_BLOCK}\s*$")
DAMAGE = re.compile(r"^/?damage\s+@e\[type=(?:minecraft:)?spider,\s*limit=1\]\s+(\d+)"
                    r"(?:\s+(?:minecraft:)?player_attack)?\s*$")
#: Minecraft command words that count as a command even without the leading ``/``; those outside an environment's
#: allowed set are rejected as ``command``, as is any other ``/word`` line; any other line is ``syntax`` (so prose
#: such as "place the blocks" is a syntax error, not an attempted command).
_KNOWN_COMMANDS = {"setblock", "fill", "damage", "kill", "give", "summon", "tp", "teleport", "clone", "gamemode",
                   "effect", "execute"}


@dataclass
class Rejection:
    line: str
    reason: str
    detail: str


@dataclass
class CommandReport:
    """What became of one player's answer in one turn."""

    accepted: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    hits: int = 0  # HouseBuild: accepted /damage commands

    def summary(self, limit: int = 4) -> str:
        if not self.rejected:
            return f"All {self.accepted} of your commands were carried out." if self.accepted else \
                "You sent no command."
        shown = "; ".join(f"'{r.line[:60]}' ({r.detail})" for r in self.rejected[:limit])
        more = f" and {len(self.rejected) - limit} more" if len(self.rejected) > limit else ""
        return f"{self.accepted} of your commands were carried out, {len(self.rejected)} rejected: {shown}{more}."


_LIST_MARKER = re.compile(r"^(?:[-*\u2022>]+|\d+[.)])\s*")


def command_lines(response: str) -> list[str]:
    """The candidate command lines of a response, lower-cased, without blank lines or markdown fences.

    A list marker or quotes around a line are dropped, and a line with text before its first ``/`` keeps the text
    from that ``/`` on (``"Place: /setblock 1 2 3 stone."`` -> ``"/setblock 1 2 3 stone"``); what remains is then
    either an allowed command or rejected.
    """
    lines = []
    for raw in (response if isinstance(response, str) else "").splitlines():
        line = raw.strip().lower()
        if not line or line.startswith("```"):
            continue
        line = _LIST_MARKER.sub("", line).strip("`'\" ")
        slash = line.find("/")
        if slash > 0:
            line = line[slash:]
        line = line.rstrip("`'\".,; ")
        if line:
            lines.append(line)
    return lines


def classify_unmatched(line: str, allowed: set[str]) -> Rejection:
    """Why a line matched no allowed command form: a command outside the set, or not a well-formed command."""
    m = _COMMAND_WORD.match(line)
    word = m.group(1) if m else ""
    if word and word not in allowed and (line.startswith("/") or word in _KNOWN_COMMANDS):
        return Rejection(line, "command", f"/{word} is not allowed")
    return Rejection(line, "syntax", "not a valid command")


def format_pos(p: Pos) -> str:
    return f"({p[0]} {p[1]} {p[2]})"


def list_positions(positions: Sequence[Pos], limit: int = 10) -> str:
    shown = ", ".join(format_pos(p) for p in positions[:limit])
    return shown + (f" and {len(positions) - limit} more" if len(positions) > limit else "")
