"""Text-Minecraft building, simulated (no game server): StrBuild and HouseBuild (CoLLM paper Sec. 6.1, App. E.3, F.3).

Two players (``player1``, ``player2``) build together for up to ``H = 4`` turns. Each turn both answer at the same
time with Minecraft commands, one per line; the simulator applies them (player 1's, then player 2's), scores the
world, and a simulated player writes each agent's next prompt: the task again, the current build, what is missing or
in excess, and which of that agent's commands were rejected and why.

**StrBuild**: a string (e.g. ``"HI"``) drawn in a 3x5 pixel font becomes a vertical wall of blocks: a grid of ``#``
(block) and ``.`` (air), top row first, in the plane ``z = z0``. Allowed: ``/setblock x y z block``. Each player holds
two block types (from two different families among wood, stone, concrete and obsidian) with a limited count of each
(``block_limit`` per type, about a quarter of the target plus one), so neither can finish alone. ``air`` removes a
block and is always allowed.

**HouseBuild**: a small house (floor, walls with a door gap, obsidian corner pillars, roof) given as layers of boxes
``(x1, y1, z1, x2, y2, z2, block)`` in ascending ``y``. Allowed: ``/fill x1 y1 z1 x2 y2 z2 block`` (each player owns
two of the house's block types; ``air`` clears) and ``/damage @e[type=spider,limit=1] <amount>`` (at most
``player_atk`` damage per hit, at most ``max_attacks`` hits per player per turn). Spiders appear on a per-task
schedule; after the players act, every living spider bites the team for its attack value.

**Rejected commands** (counted in ``info["rejected"]`` and per reason in ``info["rejected/<reason>"]``, never an
error): ``syntax`` (not a command of the allowed forms), ``command`` (a command outside the allowed set, e.g.
``/give``), ``bbox`` (a coordinate outside the build area), ``block`` (a block the player does not hold),
``inventory`` (none of that block left), ``attack`` (too strong a hit, no spider alive, or over the per-turn limit),
``limit`` (more than ``max_commands`` lines in one answer). Blank lines and markdown fences are skipped.

**Score** of a world state (Appendix F.3), with ``T`` target cells:

* StrBuild: ``2 * covered / T - 1.5 * extra / T - same_pairs / (2 * pairs)``, where ``covered`` counts target
  cells holding a block, ``extra`` blocks on air cells, and ``same_pairs`` / ``pairs`` the side-sharing pairs of
  placed blocks with the same block type / in total (the adjacency term is 0 without pairs).
* HouseBuild: ``2 * covered / T - 1.5 * extra / T - 0.2 * min(1, damage / player_hp)``, where ``covered`` counts
  target cells holding exactly their block and ``damage`` is the spiders' total damage so far.

The best score is 2 (``reward_max``). The paper gives the score terms, not how a turn's reward derives from them;
here **the reward of a turn is the change of the score it caused** (the first turn starts from the empty world at
score 0), so an episode's undiscounted return is the score of the final world whatever turn it ends at, and
finishing early is never worse than finishing late. An episode ends early when the build is complete (StrBuild:
every target cell covered, no extra block, no same-block neighbours; HouseBuild: the house exactly built and no
spider alive).

Metrics (``info``): ``score``, ``iou`` (``covered / (T + extra)``), ``coverage`` (``covered / T``), ``extra``,
``adjacency`` (StrBuild: ``same_pairs / pairs``), ``hp`` (HouseBuild: remaining HP as a fraction), ``accepted``,
``rejected``, ``complete``.

Data: ``make_dataset(num_tasks, seed, split)`` generates tasks procedurally; train and eval tasks come from separate
random streams and a task belongs to a split by a hash of its shape (the string for StrBuild), so no held-out shape
is ever trained on (the machinery of :mod:`trl_multiagent.environments.games.base`).

Modules: :mod:`.world` (positions, font, block families, boxes, the Appendix F.3 scores), :mod:`.commands` (command
lines, accepted forms, rejections), :mod:`.build_env` (turns, rewards and task data shared by both tasks),
:mod:`.strbuild` and :mod:`.housebuild` (the two environments).
"""

from trl_multiagent.environments.minecraft.build_env import AGENTS, REWARD_MAX, BuildEnv
from trl_multiagent.environments.minecraft.commands import (
    REJECT_REASONS,
    CommandReport,
    Rejection,
    classify_unmatched,
    command_lines,
    format_pos,
)
from trl_multiagent.environments.minecraft.housebuild import HouseBuildEnv
from trl_multiagent.environments.minecraft.strbuild import StrBuildEnv
from trl_multiagent.environments.minecraft.world import (
    AIR,
    BLOCK_FAMILIES,
    FONT,
    Pos,
    box_cells,
    grid_cells,
    housebuild_metrics,
    neighbour_pairs,
    parse_box,
    render_string,
    strbuild_metrics,
)

__all__ = [
    "AGENTS", "AIR", "BLOCK_FAMILIES", "FONT", "REJECT_REASONS", "REWARD_MAX", "BuildEnv", "CommandReport",
    "HouseBuildEnv", "Pos", "Rejection", "StrBuildEnv", "box_cells", "classify_unmatched", "command_lines",
    "format_pos", "grid_cells", "housebuild_metrics", "neighbour_pairs", "parse_box", "render_string",
    "strbuild_metrics",
]
