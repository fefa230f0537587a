"""Whether a ``report_to`` backend that needs an account can log in, checked before any model loads.

``report_to: wandb`` without a wandb login used to start training and then end in a traceback
(``wandb.errors.errors.UsageError: No API key configured``) when transformers' callback called ``wandb.init`` at the
first step, after the models had loaded. :func:`wandb_login_problem` reads the places wandb takes its credentials
and its mode from, as wandb 0.2x / 0.3x does (``wandb/sdk/lib/wbauth``), without importing wandb (a second or more):

* the mode: ``WANDB_MODE`` ``offline`` / ``disabled`` / ``dryrun`` (or ``WANDB_DISABLED``), or ``mode`` in wandb's
  settings files (``wandb offline`` writes it: ``<WANDB_CONFIG_DIR or ~/.config/wandb>/settings`` and the workspace's
  ``<WANDB_DIR or .>/wandb/settings``) log to local files and need no account;
* the credentials: ``WANDB_API_KEY`` or ``WANDB_IDENTITY_TOKEN_FILE``, an entry for the server's host
  (``WANDB_BASE_URL``, by default ``api.wandb.ai``) in the netrc file (``NETRC``, ``~/.netrc``, ``~/_netrc``:
  ``wandb login`` writes it), or ``api_key`` in a settings file.

Without either, the config check (:func:`~trl_multiagent.trainers.base_config.check_tracking_backends`) refuses the
run with one line that names both ways: log in, or log offline.
"""

from __future__ import annotations

import configparser
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

#: WANDB_MODE values that need no account (wandb's own names; ``dryrun`` is the old one of ``offline``).
OFFLINE_MODES = ("offline", "disabled", "dryrun")


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _settings() -> dict[str, str]:
    """The ``[default]`` section of wandb's global settings file, then its workspace settings file over it."""
    config_dir = os.environ.get("WANDB_CONFIG_DIR") or str(Path("~/.config/wandb").expanduser())
    workspace = Path(os.environ.get("WANDB_DIR") or ".")
    found: dict[str, str] = {}
    for path in (Path(config_dir) / "settings", workspace / "wandb" / "settings", workspace / ".wandb" / "settings"):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
            found.update(dict(parser.items("default")))
        except (OSError, configparser.Error):
            continue
    return found


def _netrc_has(host: str) -> bool:
    """The netrc file wandb reads has a password for ``host``."""
    given = os.environ.get("NETRC")
    candidates = [Path(given).expanduser()] if given else [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            return False
        return bool(entry and entry[2])
    return False


def wandb_login_problem() -> str | None:
    """``None`` when a wandb run can start here (logged in, or offline / disabled), else the one line that says why
    not and both ways on (see the module docstring)."""
    mode = (os.environ.get("WANDB_MODE") or "").strip().lower()
    if mode in OFFLINE_MODES or _true(os.environ.get("WANDB_DISABLED")):
        return None
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return None
    settings = _settings()
    if not mode and settings.get("mode", "").strip().lower() in OFFLINE_MODES:
        return None
    base_url = os.environ.get("WANDB_BASE_URL") or settings.get("base_url") or "https://api.wandb.ai"
    host = urlparse(base_url).hostname or "api.wandb.ai"
    if _netrc_has(host) or settings.get("api_key"):
        return None
    netrc_file = os.environ.get("NETRC") or "~/.netrc"
    return (f"report_to names wandb, but wandb is not logged in here (no WANDB_API_KEY, no entry for {host} in "
            f"{netrc_file}){', and WANDB_MODE is ' + repr(mode) if mode else ''}: log in with `wandb login` (or set "
            "WANDB_API_KEY), or set WANDB_MODE=offline to log to local files (`wandb sync` uploads them later); or "
            "set report_to: none")
