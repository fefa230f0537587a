"""Draw MHGPO's three group rollout strategies (IS, FoF, RR) from the sampler's own plans: docs/trainers/mhgpo_sampling.png.

    .venv/bin/python docs/trainers/mhgpo_sampling.py

Each panel is :meth:`trl_multiagent.rollout.pipeline.PipelineSampler.plan` for the search pipeline (Rewriter ->
retriever -> Reranker -> Answerer) with G = 3: one circle per agent output, coloured by its group id (grey: generated
but not trained on), a square per retriever call, lines from inputs to consumers.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from trl_multiagent.environments.search_qa import SearchQAEnv  # noqa: E402
from trl_multiagent.rollout.pipeline import PipelineSampler  # noqa: E402

G = 3
LABELS = {"rewriter": "Rewriter", "retriever": "retriever", "reranker": "Reranker", "answerer": "Answerer"}


def group_label(group):
    kind, key, agent = group
    return f"q{key} {agent}" if kind == "question" else f"fork@{key} {agent} (all such questions)"


def draw(ax, nodes, title, order):
    colours = {}
    palette = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7]  # no grey: grey = not kept
    rows_of = {}
    y_top = 0.0
    for inst in sorted({n.instance for n in nodes}):
        rows_of[inst] = y_top
        y_top -= G + 0.8
    pos = {}
    for n in nodes:
        x = order.index(n.name)
        y = rows_of[n.instance] - (n.copy if n.forked else (G - 1) / 2)
        pos[n.id] = (x, y)
    for n in nodes:
        for i in n.inputs.values():
            (x0, y0), (x1, y1) = pos[i], pos[n.id]
            ax.plot([x0, x1], [y0, y1], color="0.6", lw=0.8, zorder=1)
    for n in nodes:
        x, y = pos[n.id]
        if not n.is_agent:
            ax.scatter([x], [y], marker="s", s=110, facecolor="white", edgecolor="0.3", zorder=2)
            continue
        if n.kept:
            colours.setdefault(n.group, palette[len(colours) % len(palette)])
            face = colours[n.group]
        else:
            face = "0.85"
        ax.scatter([x], [y], s=170, facecolor=face, edgecolor="0.2", zorder=3)
    for inst, y in rows_of.items():
        q = next(n for n in nodes if n.instance == inst)
        ax.text(-0.55, y - (G - 1) / 2, f"q{q.question}\nfork: {q.fork}", ha="right", va="center", fontsize=7)
    ax.set_xticks(range(len(order)), [LABELS[o] for o in order], fontsize=8)
    ax.set_yticks([])
    ax.set_xlim(-1.6, len(order) - 0.5)
    ax.set_title(title, fontsize=9)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    handles = [Line2D([], [], marker="o", ls="", markerfacecolor=c, markeredgecolor="0.2", markersize=7,
                      label=group_label(g)) for g, c in colours.items()]
    if any(n.is_agent and not n.kept for n in nodes):
        handles.append(Line2D([], [], marker="o", ls="", markerfacecolor="0.85", markeredgecolor="0.2",
                              markersize=7, label="generated, not trained on"))
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
              title="group id", title_fontsize=7)


def main(path: Path) -> None:
    graph = SearchQAEnv.__new__(SearchQAEnv).graph()  # the graph only: no retriever is built
    order = list(graph.order)
    panels = [
        ("IS: fork G at each agent in turn; keep only that agent's\nhomogeneous group (one question)",
         PipelineSampler(G, "independent").plan(graph, 1)[0]),
        ("FoF: fork G at the entry agent; one output per branch after it:\nhomogeneous group at the Rewriter, "
         "heterogeneous downstream", PipelineSampler(G, "fork_on_first").plan(graph, 2)[0]),
        ("RR: fork agent drawn per question (p = 0.7 / 0.1 / 0.2); agents before\nthe fork run once and are grouped "
         "across the questions with the same fork",
         PipelineSampler(G, "round_robin").plan(graph, 3, forks=["rewriter", "reranker", "reranker"])[0]),
    ]
    heights = [max(n.instance for n in nodes) + 1 for _, nodes in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, 1.6 * sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, nodes) in zip(axes, panels):
        draw(ax, nodes, title, order)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


if __name__ == "__main__":
    main(Path(__file__).with_suffix(".png"))
