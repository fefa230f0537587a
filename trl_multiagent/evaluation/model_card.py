"""The model card of a saved team: ``README.md`` in a run's ``output_dir`` and in each of its ``checkpoint-N`` folders.

A TRL trainer's ``save_model`` leaves a folder with a model card that says what the model is and how it was made, and
that the Hub shows on the model's page. A team is several LoRA adapters (one per policy, ``adapters/<policy>/``) over
frozen bases, so its card is the team's: the agents and their bases, the algorithm and its paper, the recipe as
given, the trainer config's fields that differ from their defaults, the held-out results with their intervals (the
team before and after training, the best baseline, the gain over it) where the run evaluated, the library versions,
and the commands that evaluate it, continue training it, push it to the Hub, load an adapter with PEFT and serve the
adapters with vLLM.

The card is a rendering of files the run already wrote (``summary.json``, ``adapters/team.json``, each adapter's
``adapter_config.json``), so it always agrees with them: :func:`write_model_cards` is called whenever a run's
``summary.json`` is written, by the trainer at the end of training
(:func:`~trl_multiagent.trainers.outputs.write_summary`) and again by the runner once the held-out results are in
(:func:`~trl_multiagent.evaluation.report.write_run_outputs`). Each card is written whole or not at all
(:mod:`trl_multiagent.runtime.atomic_files`). ``summary.json``'s ``trainer_config`` (:func:`config_differences`) is written
for the card by the trainer.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trl_multiagent.errors import DiskFullError, one_line
from trl_multiagent.runtime.atomic_files import write_text_atomically

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"
TEAM_FILE = "adapters/team.json"
#: The library versions a card lists (``summary.json``'s ``machine.versions`` of the run that made the team).
CARD_PACKAGES = ("trl-multiagent", "trl", "transformers", "peft", "torch")
#: Config fields a card leaves out of the trainer config: where the run wrote, and secrets.
_NOT_SHOWN = ("output_dir", "logging_dir", "run_name", "hub_token", "push_to_hub_token", "hub_model_id")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def config_differences(args) -> dict[str, Any]:
    """The fields of the trainer config ``args`` whose values differ from the defaults of its class (output paths and
    tokens left out), as JSON values: the card's "trainer config", recorded in ``summary.json`` as
    ``trainer_config``. The defaults are those of a config built with nothing but ``output_dir`` (so that values
    its checks derive, e.g. ``report_to: none`` -> ``[]``, compare as equal); where one cannot be built, the
    fields' declared defaults."""
    values = args.to_dict()
    try:
        defaults = _default_config(args).to_dict()
    except Exception:  # noqa: BLE001 - a config class that refuses its own defaults: the declared ones instead
        import dataclasses

        defaults = {}
        for f in dataclasses.fields(args):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = f.default_factory()
    changed = {}
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict):  # keys the run's setup took out are no change
            default = {k: v for k, v in default.items() if k in value}
        if key in _NOT_SHOWN or key.endswith("_token") or (key in defaults and default == value):
            continue
        changed[key] = json.loads(json.dumps(value, default=str))
    return changed


def _default_config(args):
    """A config of ``args``'s class with every field at its default but ``output_dir``. Building a config sets up the
    devices, which resets accelerate's shared state (transformers' ``TrainingArguments._setup_devices``) under the
    trainer that is running: this one borrows the devices of ``args`` instead and touches no shared state."""
    cls = type(args)
    shadow = type(cls.__name__, (cls,), {"_setup_devices": property(lambda self: args.device),
                                         "distributed_state": getattr(args, "distributed_state", None),
                                         "_n_gpu": getattr(args, "_n_gpu", 0)})
    return shadow(output_dir=args.output_dir)


def write_model_cards(output_dir: str | Path) -> list[Path]:
    """``README.md`` in ``output_dir`` and in every ``checkpoint-N`` folder of it that holds a saved team
    (``adapters/team.json``), from the run's ``summary.json``; returns the cards written. A folder without a saved
    team (the evaluate command's results, a run with ``max_steps: 0``) gets none. A full disk is one
    :class:`~trl_multiagent.errors.DiskFullError`; any other problem with a card is a warning, never the end of a
    run whose team is saved."""
    folder = Path(output_dir)
    summary_path = folder / "summary.json"
    if not (folder / TEAM_FILE).is_file() or not summary_path.is_file():
        return []
    written = []
    try:
        summary = json.loads(summary_path.read_text())
        folders = [(folder, None)] + sorted(
            ((p, int(p.name.split("-", 1)[1])) for p in folder.glob("checkpoint-*")
             if p.name.split("-", 1)[1].isdigit() and (p / TEAM_FILE).is_file()), key=lambda item: item[1])
        for target, step in folders:
            text = card_text(target, summary, checkpoint_step=step, run_dir=folder)
            written.append(write_text_atomically(target / CARD_FILE, text, what=f"the model card of {target}"))
    except DiskFullError:
        raise
    except Exception as exc:  # noqa: BLE001 - the team and its results are saved; the card is their description
        logger.warning("the model card of %s could not be written (%s: %s); the saved team is complete without it",
                       folder, type(exc).__name__, one_line(exc))
    return written


# ------------------------------------------------------------------------------------------------------- the card
def card_text(folder: Path, summary: Mapping[str, Any], checkpoint_step: int | None = None,
              run_dir: Path | None = None) -> str:
    """The card of the saved team in ``folder`` (the run's ``output_dir``, or its ``checkpoint-<checkpoint_step>``)
    from the run's ``summary`` and the folder's adapters."""
    team = json.loads((folder / TEAM_FILE).read_text())
    adapters = {}
    for agent in team.get("agents", []):
        policy = agent.get("policy") or agent.get("name")
        path = folder / "adapters" / policy / "adapter_config.json"
        if policy not in adapters and path.is_file():
            adapters[policy] = json.loads(path.read_text())
    card = summary.get("card") or {}  # what the trainer recorded for its card: paper, tags, config class
    algorithm = summary.get("algorithm") or summary.get("trainer") or "a multi-agent trainer"
    paper = dict(card.get("paper") or {})
    bases = list(dict.fromkeys(b.get("model") for b in team.get("bases", {}).values() if b.get("model")))
    base_paths = list(dict.fromkeys(c.get("base_model_name_or_path") for c in adapters.values()
                                    if c.get("base_model_name_or_path")))
    agents = [a.get("name") for a in team.get("agents", [])]
    name = folder.name if checkpoint_step is None else f"{(run_dir or folder.parent).name}/{folder.name}"
    lines = _front_matter(bases, base_paths, card.get("tags"))
    recipe = summary.get("recipe") or {}
    env = f" on the environment `{recipe['environment']}`" if recipe.get("environment") else ""
    lines += [f"# {name}", "",
              f"A team of {len(agents)} LLM agents ({', '.join(agents)}) trained with {algorithm}{env} by "
              "trl-multiagent (multi-agent trainers over [TRL](https://github.com/huggingface/trl)). Each policy is a "
              f"LoRA adapter of its base model{'s' if len(bases) > 1 else ''} ({', '.join(f'`{b}`' for b in bases)}),"
              " in `adapters/<policy>/`; `adapters/team.json` records the team's layout.", ""]
    if checkpoint_step is not None:
        lines += [f"This is the checkpoint of step {checkpoint_step} of the run (the run ended at step "
                  f"{summary.get('global_step', '-')}; its final team and held-out results are in the folder above, "
                  "`../README.md`). Besides the adapters it holds the optimizer, schedule and random state to resume "
                  "from.", ""]
    lines += _team_table(team, adapters)
    lines += _training(summary, algorithm, paper, recipe, card.get("config_class"), checkpoint_step)
    lines += _results(summary.get("evaluation") if checkpoint_step is None else None, checkpoint_step)
    lines += _versions(summary)
    lines += _usage(folder, summary, adapters, base_paths, bases, checkpoint_step, bool(recipe))
    if paper.get("citation"):
        lines += ["## Citation", "", "```bibtex", paper["citation"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _front_matter(bases: list[str], base_paths: list[str], tags) -> list[str]:
    """The Hub's metadata: ``base_model`` (where it is a Hub id, not a local path), ``library_name: peft``, tags."""
    hub = [b for b in dict.fromkeys([*bases, *base_paths]) if _HUB_ID.match(b) and not Path(b).exists()]
    lines = ["---"]
    if hub:
        lines += ["base_model:", *(f"- {b}" for b in hub)]
    lines += ["library_name: peft", "pipeline_tag: text-generation", "tags:"]
    lines += [f"- {t}" for t in dict.fromkeys([*(tags or ["trl", "trl-multiagent"]), "lora", "multi-agent"])]
    return lines + ["---", ""]


def _team_table(team: Mapping[str, Any], adapters: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = ["## The team", "", "| agent | policy (adapter folder) | base model | LoRA rank / alpha |", "|---|---|---|---|"]
    for agent in team.get("agents", []):
        policy = agent.get("policy") or agent.get("name")
        config = adapters.get(policy, {})
        lora = f"{config.get('r', '-')} / {config.get('lora_alpha', '-')}" if config else "-"
        lines.append(f"| {agent.get('name')} | `adapters/{policy}` | `{agent.get('model')}` | {lora} |")
    critics = [c.get("name") for c in team.get("critics", []) if c.get("name")]
    if critics:
        lines += ["", f"The critics ({', '.join(f'`adapters/{c}`' for c in critics)}: a value head each, and an "
                      "adapter unless it shares its agent's) were trained with the policies; playing needs none of "
                      "them."]
    return lines + [""]


def _training(summary, algorithm: str, paper: Mapping[str, Any], recipe: Mapping[str, Any], config_name: str | None,
              checkpoint_step: int | None) -> list[str]:
    title = paper.get("title")
    link = f"[{title}](https://arxiv.org/abs/{paper['id']})" if title and paper.get("id") else (f"*{title}*" if title
                                                                                                else "-")
    key = (summary.get("card") or {}).get("trainer_name") or recipe.get("trainer")  # the trainer's `trainer:` name
    trainer = f"`{key}`, {summary.get('trainer')}" if key else f"`{summary.get('trainer', '-')}`"
    steps = summary.get("global_step", "-")
    lines = ["## Training", "", f"- Algorithm: {algorithm} (trainer {trainer}); paper: {link}",
             f"- Steps: {steps}" if checkpoint_step is None else f"- Steps: {checkpoint_step} (of the run's {steps})"]
    first, last = summary.get("mean_reward_first_quarter"), summary.get("mean_reward_last_quarter")
    if isinstance(first, (int, float)) and isinstance(last, (int, float)):
        lines.append(f"- Training reward (mean of the first and of the last quarter of the steps): {first:.4g} -> "
                     f"{last:.4g}")
    if summary.get("command"):
        lines.append(f"- Command: `{summary['command']}`")
    lines.append("")
    if recipe:
        import yaml

        lines += ["### Recipe (as given: the recipe file and the command line)", "", "```yaml",
                  yaml.safe_dump(dict(recipe), sort_keys=False, allow_unicode=True).rstrip(), "```", ""]
    else:
        lines += ["No recipe was recorded (a team trained from Python): the trainer config below is its whole "
                  "configuration beside the team above.", ""]
    changed = summary.get("trainer_config")
    config_name = config_name or "its config class"
    if changed is None:
        changed, what = summary.get("config") or {}, "The trainer config's main fields"
    else:
        what = f"The trainer config's fields that differ from the defaults of {config_name}"
    lines += ["### Trainer config", "", f"{what}:", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | `{json.dumps(v)}` |" for k, v in changed.items()] or ["| (none) | |"]
    return lines + [""]


def _results(ev: Mapping[str, Any] | None, checkpoint_step: int | None) -> list[str]:
    """The held-out results: the team before and after training, the best baseline, the gain over it, with their
    95% intervals."""
    from trl_multiagent.evaluation.labels import _cell, method_label

    lines = ["## Held-out results", ""]
    if checkpoint_step is not None:
        return lines + ["This checkpoint was not evaluated on its own: evaluate it with the command below.", ""]
    if not ev:
        return lines + ["This run did not evaluate the team on held-out tasks: evaluate it with the command below.",
                        ""]
    metric, best = ev.get("metric"), ev.get("best_baseline")
    decoding = ", ".join(f"{k} {v}" for k, v in (ev.get("decoding") or {}).items())
    lines += [f"`{metric}` on {ev.get('held_out_tasks')} held-out tasks ({ev.get('evaluator')} evaluation; decoding: "
              f"{decoding}): the mean over tasks, and in brackets its 95% bootstrap interval over tasks; gains are "
              "paired by task.", "",
              "| method | before training | after training | gain |", "|---|---|---|---|"]
    methods = ev.get("methods") or {}
    for method in dict.fromkeys(["team", *([best] if best else [])]):
        entry = methods.get(method)
        if entry:
            label = method_label(method) + (" (the best baseline)" if method == best else "")
            lines.append(f"| {label} | {_cell(entry.get('before'))} | {_cell(entry.get('after'))} | "
                         f"{_cell(entry.get('gain'), True)} |")
    vs = (methods.get("team") or {}).get("gain_vs_best_baseline")
    if vs:
        lines += ["", f"The trained team against the best baseline ({method_label(vs['baseline'])}, before training): "
                      f"{_cell(vs, True)}."]
    return lines + ["", "Every method and metric: `report.md`; every task: `eval_per_task.jsonl`.", ""]


def _versions(summary: Mapping[str, Any]) -> list[str]:
    versions = (summary.get("machine") or {}).get("versions")
    if not versions:
        from trl_multiagent.runtime.provenance import versions as current

        versions = current()
    lines = ["## Library versions", "", "| " + " | ".join(CARD_PACKAGES) + " |", "|" + "---|" * len(CARD_PACKAGES)]
    return lines + ["| " + " | ".join(str(versions.get(p, "-")) for p in CARD_PACKAGES) + " |", ""]


def _vllm_rank(adapters: Mapping[str, Mapping[str, Any]]) -> int:
    from trl_multiagent.generation.vllm import VLLM_LORA_RANKS

    need = max((int(c.get("r", 16)) for c in adapters.values()), default=16)
    return next((r for r in VLLM_LORA_RANKS if r >= need), need)


def _usage(folder: Path, summary, adapters, base_paths: list[str], bases: list[str],
           checkpoint_step: int | None, has_recipe: bool) -> list[str]:
    """The commands and code that use the team: evaluate, continue training, push; play from Python; PEFT; vLLM.
    A team whose run recorded no recipe (trained from Python) is evaluated and played with the recipe given."""
    team_dir = str(folder)
    command = str(summary.get("command") or "")
    config = re.search(r"--config[ =](\S+)", command)
    recipe = config.group(1) if config else "RECIPE.yaml"
    run_dir = str(folder.parent) if checkpoint_step is not None else team_dir
    resume = (f"--output_dir {run_dir} --resume_from_checkpoint {team_dir}" if checkpoint_step is not None else
              f"--output_dir {run_dir} --resume_from_checkpoint true")
    policies = list(adapters) or ["<policy>"]
    base = base_paths[0] if base_paths else (bases[0] if bases else "<base model>")
    modules = " ".join(f"{p}={team_dir}/adapters/{p}" for p in policies)
    lines = ["## Use it", "",
             f"Paths are those of the run (`{team_dir}`); for a copy downloaded from the Hub, use the folder it was "
             "downloaded to.", "", "```bash",
             "# evaluate it on held-out tasks of your own (the recipe's decoding settings; writes <team>/eval-<name>/)",
             f"python -m trl_multiagent evaluate --team {team_dir} --eval_dataset_split my_tasks.jsonl"
             f"{'' if has_recipe else f' --config {recipe}'}",
             "# continue training it: a new run from its adapters (new optimizer, global step 0) ...",
             f"python -m trl_multiagent train --config {recipe} --init_adapters {team_dir} "
             f"--output_dir {run_dir}-more",
             "# ... or the same run, exactly where its last checkpoint stopped, to a larger max_steps",
             f"python -m trl_multiagent train --config {recipe} {resume} --max_steps <more steps>",
             "# send it to the Hub (this card, the adapters, summary.json and report.md)",
             f"python -m trl_multiagent push --team {team_dir} --repo_id <user>/<name>",
             "```", "",
             "From Python, the team plays a task (the environment's columns; no gold answer needed):", "", "```python",
             "from trl_multiagent import Team", "",
             f"team = Team.from_pretrained({json.dumps(team_dir)}"
             f"{'' if has_recipe else f', config={json.dumps(recipe)}'})  # the adapters; the recipe's environment, "
             "turns and decoding",
             "play = team.play(task)  # play.answer, play.turns (each agent's messages per turn)", "```", "",
             "Each adapter folder is a plain PEFT adapter:", "", "```python",
             "from peft import PeftModel", "from transformers import AutoModelForCausalLM", "",
             f"base = AutoModelForCausalLM.from_pretrained({json.dumps(base)})",
             f"model = PeftModel.from_pretrained(base, {json.dumps(f'{team_dir}/adapters/{policies[0]}')})", "```",
             "",
             "Served with vLLM, each policy is a LoRA module that a request names as its model (the team's exchange "
             "itself, turn by turn, is what `Team.play` and the evaluate command play):", "", "```bash",
             f"vllm serve {base} --enable-lora --max-lora-rank {_vllm_rank(adapters)} --lora-modules {modules}",
             "```", ""]
    return lines
