"""What a team asks generation for and what it gets back: the :data:`Prompt` type, :class:`GenerationRequest` (one
prompt of one agent) and :class:`Generation` (one sampled response).

The bottom of the library: this module imports nothing of it, so that environments, samplers, evaluators and
trainers can name these types without importing anything above them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A prompt: a string (wrapped as one user message when the agent's tokenizer has a chat template) or a list of chat
#: messages ``[{"role": ..., "content": ...}, ...]``.
Prompt = str | list[dict[str, str]]


@dataclass
class Generation:
    """One sampled response: token ids of the prompt and the completion, and the decoded completion text."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    truncated: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt of one agent to sample ``num_samples`` responses for, in a team-level :meth:`AgentPool.generate_many`
    call. ``use_adapter=False`` samples from the agent's base model with its adapter switched off (the untrained
    model: the inference-time baselines)."""

    agent: str
    prompt: Prompt
    num_samples: int = 1
    use_adapter: bool = True
