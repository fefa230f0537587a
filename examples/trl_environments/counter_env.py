"""A small environment in TRL's ``environment_factory`` form, written as one writes it for ``trl.GRPOTrainer``:
``reset(**kwargs)`` starts an episode from a dataset row and returns text for the prompt, every public method is a
tool (type hints and a Google-style docstring), ``get_reward()`` scores the episode.

With TRL it trains one model: ``GRPOTrainer(model, train_dataset=..., environment_factory=CounterEnv)``.
docs/guides/trl_environments.md trains a two-agent team on it, unchanged, with
``trl_multiagent.environments.TRLEnvironmentTeam``: one agent may only increment, the other only decrement.
"""


class CounterEnv:
    """A counter that starts at 0; the episode is won when it shows the target."""

    def __init__(self):
        self.value = 0
        self.target = 0
        self.moves = 0

    def reset(self, **kwargs) -> str | None:
        self.value, self.target, self.moves = 0, int(kwargs["target"]), 0
        return f" The counter shows 0; the target is {self.target}."

    def increment(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: how much to add, from 1 to 5.
        """
        if not 1 <= amount <= 5:
            raise ValueError("amount must be from 1 to 5")
        self.value += amount
        self.moves += 1
        return f"The counter shows {self.value}."

    def decrement(self, amount: int) -> str:
        """Subtract from the counter.

        Args:
            amount: how much to subtract, from 1 to 5.
        """
        if not 1 <= amount <= 5:
            raise ValueError("amount must be from 1 to 5")
        self.value -= amount
        self.moves += 1
        return f"The counter shows {self.value}."

    def get_reward(self) -> float:
        """1 at the target, less the further away the counter ended."""
        return 1.0 / (1.0 + abs(self.value - self.target))
