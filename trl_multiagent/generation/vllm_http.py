"""The HTTP side of ``vllm_mode: server``: one vLLM OpenAI-compatible server (:class:`_Server`: calls, one-line errors),
the checks of the server fields, what a server's answers mean (its ``--max-loras``, its model, a completion's token
ids and log-probs) and the ``/v1/completions`` fields of a request. The backend that uses them is
:mod:`trl_multiagent.generation.vllm_server`. Standard library only: the training process needs no vLLM.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

#: What vLLM's OpenAI server accepts as a logit bias (it clamps to [-100, 100]); stands for ``-inf``
#: (``suppress_tokens``), which JSON cannot carry: e^-100 of a token's probability is never sampled.
MIN_LOGIT_BIAS = -100.0


class VLLMServerError(RuntimeError):
    """A vLLM server that does not answer, or refuses what the backend asks of it (one line)."""


class _Unreachable(Exception):
    """No HTTP answer at all (connection refused or reset, timeout)."""


def _one_line(text: Any, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------- the servers
def server_urls(config) -> list[str]:
    """The base URL of each server from TRL's fields: ``vllm_server_base_url`` (comma-separated for a server per
    base) or ``http://<vllm_server_host>:<vllm_server_port>``; without a trailing ``/`` or ``/v1``."""
    if config.vllm_server_base_url:
        urls = [u.strip() for u in str(config.vllm_server_base_url).split(",") if u.strip()]
    else:
        urls = [f"http://{config.vllm_server_host}:{config.vllm_server_port}"]
    out = []
    for url in urls:
        url = url.rstrip("/")
        out.append(url[:-3] if url.endswith("/v1") else url)
    return out


def check_server_config(config) -> None:
    """The ``vllm_mode: server`` fields, checked when the config is built (before any model loads)."""
    if config.vllm_server_base_url:
        for url in server_urls(config):
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"vllm_server_base_url must be http://host:port (comma-separated for a server per "
                                 f"base), got {config.vllm_server_base_url!r}")
    elif not 0 < int(config.vllm_server_port) < 65536:
        raise ValueError(f"vllm_server_port must be a port number, got {config.vllm_server_port!r}")
    if not config.vllm_server_timeout or config.vllm_server_timeout <= 0:
        raise ValueError(f"vllm_server_timeout must be positive seconds, got {config.vllm_server_timeout!r}")


class _Server:
    """One vLLM server: JSON over HTTP (the standard library; no proxy: the server is on the cluster's network)."""

    _opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __init__(self, url: str, request_timeout: float | None):
        self.url = url
        self.address = re.sub(r"^https?://", "", url)
        self.request_timeout = request_timeout
        self.max_loras: int | None = None
        self.models: list[dict] = []

    def call(self, method: str, path: str, payload: dict | None = None,
             timeout: float | None = None) -> tuple[int, str]:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with self._opener.open(request, timeout=timeout or self.request_timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out (URLError is one)
            reason = getattr(error, "reason", None) or error
            raise _Unreachable(_one_line(f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException)
                                         else reason, 160)) from error

    def json(self, method: str, path: str, payload: dict | None = None, timeout: float | None = None):
        status, text = self.call(method, path, payload, timeout)
        if status != 200:
            raise VLLMServerError(f"the vLLM server at {self.address} answered {method} {path} with {status}: "
                                  f"{_error_message(text)}")
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise VLLMServerError(f"the vLLM server at {self.address} answered {method} {path} with no JSON: "
                                  f"{_one_line(text, 160)}") from error


def _error_message(text: str) -> str:
    """The message of an error body: vLLM's ``{"error": {"message": ...}}`` (or the older flat form), FastAPI's
    ``{"detail": ...}``, or the text itself."""
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return _one_line(text or "(empty)")
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return _one_line(error["message"])
        if body.get("message"):
            return _one_line(body["message"])
        if body.get("detail"):
            return _one_line(body["detail"])
    return _one_line(text)


def _is_vllm_error(text: str) -> bool:
    """Whether an error body is one of vLLM's handlers (not the web framework's 'no such route')."""
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return isinstance(body, dict) and (isinstance(body.get("error"), dict) or body.get("object") == "error")


def _max_loras_from_metrics(text: str) -> int | None:
    """``--max-loras`` as vLLM's Prometheus metrics give it (the ``max_lora`` label of ``vllm:lora_requests_info``)."""
    found = [int(m) for m in re.findall(r'vllm:lora_requests_info\{[^}]*max_lora="(\d+)"', text)]
    return max(found) if found else None


def _same_model(trainer_names: Sequence[str], served: Sequence[str]) -> bool:
    """Whether a served model (its id and root) is the trainer's base (its name and resolved path): the same string,
    the same folder, or the same last path component (a hub id and a local copy of it, case aside)."""
    def clean(name):
        return str(name).rstrip("/")

    trainer = [clean(n) for n in trainer_names if n]
    for s in (clean(n) for n in served if n):
        for t in trainer:
            if s == t or s.split("/")[-1].lower() == t.split("/")[-1].lower():
                return True
            if os.path.exists(s) and os.path.exists(t) and os.path.realpath(s) == os.path.realpath(t):
                return True
    return False


def completion_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``/v1/completions`` fields of vLLM ``SamplingParams`` keyword arguments
    (:func:`~trl_multiagent.generation.vllm.sampling_kwargs`), with token ids back
    (``return_token_ids``, and ``return_tokens_as_token_ids`` for servers older than it)."""
    fields = {k: v for k, v in kwargs.items() if k != "logit_bias"}
    if kwargs.get("logit_bias"):
        fields["logit_bias"] = {str(t): max(MIN_LOGIT_BIAS, float(b)) for t, b in kwargs["logit_bias"].items()}
    fields["return_token_ids"] = True
    fields["return_tokens_as_token_ids"] = True
    return fields


def _choice_tokens(choice: dict, server: _Server) -> tuple[list[int], list[float]]:
    """The completion token ids of one choice (``token_ids``, or its log-probs' ``token_id:<id>`` tokens) and the
    engine's log-prob of each."""
    logprobs = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        tokens = logprobs.get("tokens")
        if tokens is None or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise VLLMServerError(f"the vLLM server at {server.address} returned no token ids (neither token_ids nor "
                                  "token_id:<id> log-prob tokens): use a vLLM release whose /v1/completions has "
                                  "return_token_ids or return_tokens_as_token_ids")
        ids = [int(t.split(":", 1)[1]) for t in tokens]
    logps = [float(x) if x is not None else math.nan for x in (logprobs.get("token_logprobs") or [])]
    return [int(t) for t in ids], logps
