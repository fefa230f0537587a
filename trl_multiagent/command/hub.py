"""``python -m trl_multiagent push --team <dir> --repo_id <user>/<name>``: a saved team, sent to the Hugging Face Hub.

    python -m trl_multiagent push --team outputs/demo --repo_id me/math-team

TRL's ``trainer.push_to_hub()`` sends the trained model with its card; a team is a folder of LoRA adapters
(``adapters/<policy>/``, each a plain PEFT adapter, and ``adapters/team.json``) with its model card
(``README.md``, :mod:`trl_multiagent.evaluation.model_card`) and its run's results. This command uploads exactly those
(:data:`PUSHED`: the card, the adapters, ``summary.json``, ``report.md``, the reward curve, ``metrics.jsonl`` and the
per-task evaluation), in one commit, with ``huggingface_hub``'s ``HfApi().upload_folder``, into a model repository it
creates when missing (``--private`` for a private one). Checkpoints (optimizer states), the status file and pickled
training arguments stay home; a ``checkpoint-N`` folder given as ``--team`` sends its own card and adapters.

Offline (``HF_HUB_OFFLINE=1``), or when the Hub cannot be reached or refuses the login, the push is refused with ONE
line, exit code 2, before any upload starts: the repository is created (or found) first, and only then is anything
sent. An upload that starts and fails is one line too, exit code 1 (its one commit was not made). The login is
huggingface_hub's (``hf auth login``, or ``HF_TOKEN``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from trl_multiagent.errors import TRACEBACK_ENV, RecipeError, fail_command, one_line

logger = logging.getLogger(__name__)

#: What a push sends of a team folder (``huggingface_hub`` allow patterns, relative to the folder).
PUSHED = ["README.md", "adapters/*", "summary.json", "report.md", "reward_curve.png", "metrics.jsonl",
          "eval_per_task.jsonl", "eval_texts_*.jsonl"]
#: Never sent, even where PUSHED would match: folders and files a save was writing when it was cut short.
NOT_PUSHED = ["*.tmp-*", "*.tmp-*/*", "*.old-*", "*.old-*/*"]


class PushRefused(ValueError):
    """A push that cannot start (offline, no network, no login, not a saved team): nothing was uploaded."""


class PushFailed(RuntimeError):
    """The upload started and failed (exit code 1): its commit was not made, the repository is as it was."""


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _unreachable(exc: BaseException) -> bool:
    """``exc`` (or an exception it was raised from) says the Hub could not be reached: offline mode, a connection
    that failed or timed out."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    kinds: tuple[type[BaseException], ...] = (OfflineModeIsEnabled, ConnectionError, TimeoutError)
    try:
        import httpx

        kinds += (httpx.TransportError,)
    except ImportError:
        pass
    seen = exc
    while seen is not None:
        if isinstance(seen, kinds) or type(seen).__name__ in ("ConnectionError", "ConnectTimeout", "ConnectError"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def pushed_files(folder: str | Path) -> list[str]:
    """The files of ``folder`` that a push sends (relative paths, sorted): :data:`PUSHED` less :data:`NOT_PUSHED`."""
    from huggingface_hub.utils import filter_repo_objects

    root = Path(folder)
    files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    return sorted(filter_repo_objects(files, allow_patterns=PUSHED, ignore_patterns=NOT_PUSHED))


def push_to_hub(team: str | Path, repo_id: str, private: bool | None = None, commit_message: str | None = None,
                token: str | None = None):
    """Send the team saved in ``team`` (a run's output_dir or a ``checkpoint-N`` folder) to the model repository
    ``repo_id``, with its model card (written first where the folder has none); returns ``huggingface_hub``'s
    ``CommitInfo``. Raises :class:`PushRefused` (one line, nothing uploaded) when the Hub is offline, unreachable or
    refuses the login, or the folder holds no saved team."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    from trl_multiagent.command.saved_team import find_saved_team
    from trl_multiagent.evaluation.model_card import CARD_FILE, card_text, write_model_cards

    try:
        folder, summary_path = find_saved_team(team)
    except RecipeError as exc:
        raise PushRefused(str(exc)) from None
    if "/" not in repo_id.strip("/") or repo_id.count("/") != 1:
        raise PushRefused(f"--repo_id {repo_id!r}: give the repository as <user or organisation>/<name>")
    if _offline():
        raise PushRefused(f"the Hub is offline here (HF_HUB_OFFLINE is set): nothing was uploaded; unset "
                          f"HF_HUB_OFFLINE (and log in: `hf auth login`, or set HF_TOKEN) to push {folder} to "
                          f"{repo_id}")
    if not (folder / CARD_FILE).is_file():  # a folder saved before cards were written: its card now
        run_dir = summary_path.parent if summary_path is not None else folder
        if not write_model_cards(run_dir) or not (folder / CARD_FILE).is_file():
            from trl_multiagent.runtime.atomic_files import write_text_atomically

            write_text_atomically(folder / CARD_FILE, card_text(folder, {}))
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    except Exception as exc:  # noqa: BLE001 - sorted below into the one line a user can act on
        if _unreachable(exc):
            raise PushRefused(f"cannot reach the Hub ({type(exc).__name__}: {one_line(exc)}): nothing was uploaded; "
                              "check the network (or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 to work offline and push "
                              "later") from None
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, LocalTokenNotFoundError) or (isinstance(exc, HfHubHTTPError) and status in (401, 403)):
            why = f"HTTP {status}" if status else "no token: not logged in"
            raise PushRefused(f"the Hub refused to create or open {repo_id} ({why}): nothing was uploaded; "
                              "log in with `hf auth login` (or set HF_TOKEN) with a token that may write to it") \
                from None
        raise
    files = pushed_files(folder)
    logger.info("Pushing %d files of %s to %s: %s", len(files), folder, url, ", ".join(files[:8]) +
                (", ..." if len(files) > 8 else ""))
    try:
        info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                                 allow_patterns=PUSHED, ignore_patterns=NOT_PUSHED,
                                 commit_message=commit_message or f"Upload the team of {folder.name} (trl-multiagent)")
    except Exception as exc:  # noqa: BLE001 - one line; the upload is one commit, so nothing half-made is left
        raise PushFailed(f"the upload of {folder} to {repo_id} failed ({type(exc).__name__}: {one_line(exc)}); the "
                         "upload is one commit, so the repository is as it was: push again") from exc
    logger.info("Pushed %s to %s", folder, getattr(info, "commit_url", None) or url)
    return info


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise PushRefused(f"command line: {message}")


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Send a saved team (its model card, adapters and results) to a model "
                                            "repository of the Hugging Face Hub, created when missing. The login is "
                                            "huggingface_hub's: `hf auth login`, or HF_TOKEN.")
    parser.add_argument("--team", required=True, metavar="DIR",
                        help="the output_dir of a training run (adapters/, summary.json), or a checkpoint-N folder")
    parser.add_argument("--repo_id", required=True, metavar="USER/NAME", help="the model repository on the Hub")
    parser.add_argument("--private", action="store_true", help="create the repository private (when it is new)")
    parser.add_argument("--commit_message", default=None, help="the commit's message")
    return parser


def main(argv=None, prog: str = "python -m trl_multiagent push") -> int:
    """The command (see the module docstring); returns the exit code: 0; 2 with one line when refused before any
    upload; 1 with one line when the upload failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = parser.parse_args(argv)
        push_to_hub(args.team, args.repo_id, private=args.private or None, commit_message=args.commit_message)
    except PushRefused as exc:
        return fail_command(prog, exc)
    except PushFailed as exc:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    return 0
