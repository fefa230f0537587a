"""Collaborative-writing rewards (MAGRPO paper, Appendix C: rewards/writing.py over the blocks of
trl_multiagent/reward_blocks/writing.py) and the TLDR / arXiv environments, by hand."""

import math
from pathlib import Path

import pytest

from trl_multiagent.environments import ENVIRONMENTS
from trl_multiagent.environments.writing import ArxivExpansionEnv, TLDREnv
from trl_multiagent.reward_blocks.writing import (
    ARXIV,
    TLDR,
    banded_score,
    capped_jaccard,
    coherence_score,
    jaccard,
    length_ratio,
    transition_categories,
    unique_word_ratio,
)
from trl_multiagent.runtime.user_code import import_object

ROOT = Path(__file__).resolve().parents[1]
# the task rewards that recipes name, in the repository's top-level rewards/ (loaded by path, not installed)
tldr_reward = import_object(f"{ROOT}/rewards/writing.py:tldr_reward")
arxiv_reward = import_object(f"{ROOT}/rewards/writing.py:arxiv_reward")


def test_bands_full_proportional_and_termination():
    # TLDR length ratio: full 1.6-3.2, acceptable 1.1-5.0
    assert banded_score(2.0, TLDR.length_full, TLDR.length_accept) == 1.0
    assert banded_score(1.35, TLDR.length_full, TLDR.length_accept) == pytest.approx((1.35 - 1.1) / (1.6 - 1.1))  # 0.5
    assert banded_score(4.1, TLDR.length_full, TLDR.length_accept) == pytest.approx((5.0 - 4.1) / (5.0 - 3.2))  # 0.5
    assert banded_score(1.0, TLDR.length_full, TLDR.length_accept) is None  # outside: evaluation stops
    assert banded_score(5.5, TLDR.length_full, TLDR.length_accept) is None
    # TLDR unique-word ratio: full >= 2.0, proportional from 1.3; no upper edge
    assert banded_score(1.65, TLDR.unique_full, TLDR.unique_accept) == pytest.approx(0.5)
    assert banded_score(40.0, TLDR.unique_full, TLDR.unique_accept) == 1.0
    assert banded_score(1.2, TLDR.unique_full, TLDR.unique_accept) is None
    # arXiv unique-word ratio: full 0.7-1.3, acceptable 0.5-1.7
    assert banded_score(0.6, ARXIV.unique_full, ARXIV.unique_accept) == pytest.approx(0.5)
    assert banded_score(1.8, ARXIV.unique_full, ARXIV.unique_accept) is None


def test_jaccard_cap_and_coherence_by_hand():
    # non-stopword vocabularies {cats, dogs} and {cats, owls, bats}: 1 shared of 4
    assert jaccard("the cats and the dogs", "cats with owls and bats") == pytest.approx(0.25)
    assert capped_jaccard("the cats and the dogs", "cats with owls and bats", cap=0.03) == 1.0  # capped at 0.03
    assert capped_jaccard("the cats and the dogs", "cats with owls and bats", cap=0.5) == pytest.approx(0.5)
    assert jaccard("the", "a") == 0.0
    # categories: "however" contrast, "for example" example, "in conclusion" conclusion; "first" (sequence)
    text = "First, we met. However, it rained; for example, at noon. In conclusion, stay home."
    assert transition_categories(text) == {"sequence", "contrast", "example", "conclusion"}
    assert coherence_score(text, 0.4) == pytest.approx(0.4 * math.log(5))  # 0.6438
    assert coherence_score(text, 0.6) == pytest.approx(0.6 * math.log(5))  # 0.9657, just under the cap
    assert coherence_score(text + " Therefore, go.", 0.6) == 1.0  # 5 categories: 0.6 ln 6 = 1.075, capped at 1
    assert coherence_score("nothing here", 0.6) == 0.0
    assert transition_categories("whatever thence") == set()  # word boundaries: no 'what'/'then' inside words


def test_tldr_reward_by_hand():
    first = "cats dogs birds fish"  # 4 words, vocabulary 4
    second = "however cats run fast therefore owls jump high"  # 8 words, vocabulary 8, 'cats' shared
    assert length_ratio(first, second) == 2.0 and unique_word_ratio(first, second) == 2.0
    r = tldr_reward(first, second)
    # structure (1 + 1) / 2 = 1; Jaccard 1/11 > 0.03 -> style 1; 2 categories (contrast, consequence) ->
    # min(0.6 ln 3, 1) = 0.65917; total (1 + 1 + 0.65917) / 3
    assert r.stopped_at is None
    assert r.levels["structure"] == 1.0 and r.levels["style"] == 1.0
    assert r.levels["coherence"] == pytest.approx(0.6 * math.log(3))
    assert r.total == pytest.approx((2 + 0.6 * math.log(3)) / 3)
    # early termination: too short (length ratio 1.0 < 1.1), too repetitive (unique ratio 1/4 < 1.3), empty
    assert tldr_reward(first, "cats dogs birds fish").total == 0.0
    assert tldr_reward(first, "cats dogs birds fish").stopped_at == "length"
    assert tldr_reward(first, "cats " * 8).stopped_at == "unique_words"
    assert tldr_reward(first, "").stopped_at == "empty" and tldr_reward(first, None).total == 0.0
    # the weights are the project's (a third each) and can be overridden
    assert tldr_reward(first, second, weights={"coherence": 0.0}).total == pytest.approx(2 / 3)


def test_arxiv_reward_by_hand_with_proportional_bands():
    first = "models learn patterns data quickly using large networks today systems"  # 10 words, vocabulary 10
    second = ("however models learn rules meanwhile agents share memory graphs labels tokens layers agents "
              "share")  # 14 words, vocabulary 12, {models, learn} shared
    r = arxiv_reward(first, second)
    # length 1.4: (1.5 - 1.4) / (1.5 - 1.3) = 0.5; unique 1.2 in 0.7-1.3: 1 -> structure 0.75
    # Jaccard 2 / 20 = 0.1, cap 0.23 -> 0.1 / 0.23; categories contrast + sequence -> 0.4 ln 3
    expected = {"structure": 0.75, "style": 0.1 / 0.23, "coherence": 0.4 * math.log(3)}
    for key, value in expected.items():
        assert r.levels[key] == pytest.approx(value), key
    assert r.total == pytest.approx(sum(expected.values()) / 3)  # 0.54141
    assert arxiv_reward(first, first + " " + first).stopped_at == "length"  # ratio 2.0 > 1.5


def test_writing_environments_one_turn_and_rounds():
    assert ENVIRONMENTS["tldr"] is TLDREnv and ENVIRONMENTS["arxiv_expansion"] is ArxivExpansionEnv
    env = TLDREnv()
    prompts = env.reset({"prompt": "POST: my cat sleeps all day"})
    assert set(prompts) == {"summary", "elaboration"} and "my cat sleeps all day" in prompts["elaboration"]
    result = env.step({"summary": "cats dogs birds fish",
                       "elaboration": "however cats run fast therefore owls jump high"})
    assert result.done and result.team_reward == pytest.approx((2 + 0.6 * math.log(3)) / 3)
    assert result.info["score"] == result.team_reward and result.info["stopped"] == 0.0
    two = ArxivExpansionEnv(max_turns=2)
    two.reset({"abstract": "We study things."})
    first = two.step({"background": "a b", "method": "c"})
    assert not first.done and first.team_reward == 0.0  # 'a b' / 'c': length ratio 0.5, stopped
    assert "stopped at length" in first.next_prompts["method"] and "Your last draft:\nc" in first.next_prompts["method"]
    with pytest.raises(ValueError, match="one text per agent"):
        two.step({"background": "x"})


@pytest.mark.parametrize("env_cls", [TLDREnv, ArxivExpansionEnv])
def test_generated_texts_split_train_and_eval(env_cls):
    train = env_cls.make_rows(30, seed=0, split="train")
    evals = env_cls.make_rows(10, seed=0, split="eval")
    column = env_cls.source_column
    assert len({t[column] for t in train}) == 30 and not {t[column] for t in train} & {t[column] for t in evals}
    assert env_cls.make_rows(5, seed=0, split="train") == train[:5]
    env_cls.validate_dataset_columns(list(train[0]))
