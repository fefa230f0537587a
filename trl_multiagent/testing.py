"""Helpers to test an environment with the library's samplers, without a model.

:class:`ScriptedPool` stands where a team's :class:`~trl_multiagent.team.pool.AgentPool` stands and answers every prompt
from a plain function, ``script(agent, prompt, k) -> text`` (``k``: which of the samples asked for at once), so that
a test can drive :class:`~trl_multiagent.rollout.JointTreeSampler` (MAGRPO), :class:`~trl_multiagent.rollout.
AgentTurnSampler` (AT-GRPO) or an evaluator through an environment with hand-written responses, in milliseconds::

    from transformers import GenerationConfig

    from trl_multiagent.rollout import JointTreeSampler
    from trl_multiagent.testing import ScriptedPool

    pool = ScriptedPool(["first", "second"], lambda agent, prompt, k: "7")
    experience = JointTreeSampler(num_samples=2, num_turns=1).rollout(pool, MyEnv, [{"target": 14}],
                                                                      GenerationConfig())

The library's own tests use it too (``tests/fake_pool.py`` re-exports it). :func:`serve_vllm` starts and stops a
``vllm serve`` for the tests of server mode and its benchmark. docs/guides/new_environment.md shows it
in a test of an environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from trl_multiagent.generation.requests import Generation, Prompt

Script = Callable[[str, Prompt, int], str]


class ScriptedPool:
    """A stand-in for ``AgentPool`` that answers from ``script(agent, prompt, k) -> text`` and records every call.

    Args:
        agents: the agents' names, in the environment's order.
        script: the response of ``agent`` to ``prompt`` (a string or chat messages, as the environment returned
            it); ``k`` counts the samples asked for in one call, from 0.
        policies: ``{agent: policy}`` (default: each agent its own policy, named after it).

    Each response becomes a :class:`~trl_multiagent.generation.requests.Generation` whose token ids are placeholders
    (one id per character of the text), so that lengths and the rollout statistics are defined.
    """

    def __init__(self, agents: Sequence[str], script: Script, policies: Mapping[str, str] | None = None):
        self.agent_names = list(agents)
        self.script = script
        self.policies = dict(policies) if policies else {a: a for a in agents}
        self.calls: list[tuple[str, int, int]] = []  # (agent, number of prompts, samples per prompt)

    def policy_of(self, agent: str) -> str:
        return self.policies[agent]

    def generate(self, agent: str, prompts: Sequence[Prompt], num_samples: int, generation_config=None
                 ) -> list[list[Generation]]:
        """``num_samples`` scripted responses of ``agent`` to each prompt."""
        self.calls.append((agent, len(prompts), num_samples))
        out = []
        for p in prompts:
            group = []
            for k in range(num_samples):
                text = self.script(agent, p, k)
                group.append(Generation(prompt_ids=[len(str(p))], completion_ids=[ord(c) for c in text] or [0],
                                        text=text))
            out.append(group)
        return out

    def generate_by_agent(self, prompts: Mapping[str, Sequence[Prompt]], num_samples: int, generation_config=None
                          ) -> dict[str, list[list[Generation]]]:
        """The team-level call of AgentPool, answered agent by agent (each recorded as one call)."""
        return {agent: self.generate(agent, list(ps), num_samples, generation_config) for agent, ps in prompts.items()}

    @property
    def num_generations(self) -> int:
        """Responses generated so far, over all calls."""
        return sum(n * k for _, n, k in self.calls)


__all__ = ["ScriptedPool"]


#: The special tokens of :func:`char_tokenizer`, first in its vocabulary: padding, end of sequence, unknown.
CHAR_SPECIALS = ["<pad>", "<eos>", "<unk>"]


def char_tokenizer(chars: Sequence[str]):
    """A character-level tokenizer built on the spot (no download): :data:`CHAR_SPECIALS`, then one token per
    character of ``chars`` (any other character is ``<unk>``); left padding. The library's tests build their tiny
    models' tokenizers with it, and ``benchmarks/gpu_check.py`` its random checkpoints'."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS + list(chars))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


# ------------------------------------------------------------------------------------------------ a vLLM server
@contextlib.contextmanager
def serve_vllm(model: str, port: int, flags: Sequence[str], log_path: str | Path, cores: set[int] | None = None,
               start_seconds: float = 900.0, env: Mapping[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A ``vllm serve`` of ``model`` on 127.0.0.1:``port`` with runtime LoRA loading and ``flags``, for the tests of
    server mode and ``benchmarks/server_rollouts.py``: started as vLLM's OpenAI server module (the CPU build's ``vllm``
    command looks for a distribution named ``vllm``; the flags are the same), in a process group of its own (on
    ``cores`` when given), its output in ``log_path``. Yields the process once it answers ``/health``; a server that
    exits first raises :class:`RuntimeError` with the end of its log, one that does not answer within
    ``start_seconds`` a :class:`TimeoutError`. Stopped (the whole group) on leaving, unless already gone."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
               "--port", str(port), *flags]
    environment = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **(env or {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                   start_new_session=True,
                                   preexec_fn=None if cores is None else (lambda: os.sched_setaffinity(0, cores)))
    try:
        deadline = time.monotonic() + start_seconds
        while True:  # the server's own start, watched so that a server that dies says why
            if process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {process.returncode}: "
                                   + " | ".join(Path(log_path).read_text().splitlines()[-15:]))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not start within {start_seconds:g} s")
            time.sleep(2)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
