"""Text-Minecraft (StrBuild, HouseBuild): Appendix F.3 scores by hand, command handling, episodes, data splits."""

import pytest

from trl_multiagent.environments import ENVIRONMENTS
from trl_multiagent.environments.minecraft import (
    HouseBuildEnv,
    StrBuildEnv,
    command_lines,
    grid_cells,
    housebuild_metrics,
    render_string,
    strbuild_metrics,
)

STR_TASK = {"target": ["#.#", "###"], "origin": [0, 0, 0], "block_limit": 2,
            "agent_blocks": [["stone", "obsidian"], ["oak_planks", "white_concrete"]]}
HOUSE_TASK = {"boxes": ["0 0 0 1 0 0 stone", "0 1 0 1 1 0 oak_planks"], "bbox": [0, 0, 0, 2, 2, 1],
              "agent_blocks": [["stone"], ["oak_planks"]], "spiders": [[3], [], [], []], "spider_hp": 4,
              "player_hp": 20, "player_atk": 4}


def test_font_and_grid_mapping():
    assert render_string("HI") == ["#.#.###", "#.#..#.", "###..#.", "#.#..#.", "#.#.###"]
    # top row first: row 0 is the highest y; column k is x0 + k; z is constant
    assert grid_cells(["#.", ".#"], (2, 10, 5)) == {(2, 11, 5), (3, 10, 5)}
    with pytest.raises(ValueError, match="capital letters"):
        render_string("h1")


def test_strbuild_score_by_hand():
    target = grid_cells(STR_TASK["target"], (0, 0, 0))  # (0,1) (2,1) (0,0) (1,0) (2,0): T = 5
    world = {(0, 1, 0): "stone", (0, 0, 0): "stone", (1, 0, 0): "oak", (1, 1, 0): "oak"}
    m = strbuild_metrics(target, world)
    # covered 3, extra 1 (on air); side-sharing pairs: (0,0)-(1,0) differ, (0,0)-(0,1) same, (1,0)-(1,1) same,
    # (0,1)-(1,1) differ -> 2 same of 4
    # score = 2*3/5 - 1.5*1/5 - 2/(2*4) = 1.2 - 0.3 - 0.25 = 0.65
    assert m["score"] == pytest.approx(0.65)
    assert m["iou"] == pytest.approx(3 / 6) and m["coverage"] == pytest.approx(0.6)
    assert m["adjacency"] == pytest.approx(0.5) and m["extra"] == 1 and m["complete"] == 0


def test_housebuild_score_by_hand():
    target = {(0, 0, 0): "stone", (1, 0, 0): "stone", (0, 1, 0): "oak_planks", (1, 1, 0): "oak_planks"}
    world = {(0, 0, 0): "stone", (1, 0, 0): "oak_planks", (0, 1, 0): "oak_planks", (2, 2, 0): "stone"}
    m = housebuild_metrics(target, world, damage=5.0, player_hp=20.0)
    # covered 2 (the wrong block at (1,0,0) does not count), extra 1, damage 5/20
    # score = 2*2/4 - 1.5*1/4 - 0.2*0.25 = 1 - 0.375 - 0.05 = 0.575
    assert m["score"] == pytest.approx(0.575) and m["hp"] == pytest.approx(0.75) and m["iou"] == pytest.approx(2 / 5)
    # the damage term is capped at 0.2
    assert housebuild_metrics(target, {}, damage=50.0, player_hp=20.0)["score"] == pytest.approx(-0.2)


def test_command_lines_tolerate_surrounding_text():
    assert command_lines("```\n- `/setblock 1 2 3 stone`\nPlace: /setblock 4 5 6 minecraft:oak_planks.\n\nhi\n```") == \
        ["/setblock 1 2 3 stone", "/setblock 4 5 6 minecraft:oak_planks", "hi"]
    assert command_lines(None) == []


def test_strbuild_episode_rewards_rejections_and_early_stop():
    env = StrBuildEnv()
    assert env.max_turns == 4 and env.reward_max == 2.0  # H = 4 as in the paper
    prompts = env.reset(STR_TASK)
    assert "#.#\n###" in prompts["player1"] and "from (0 0 0) to (2 1 0)" in prompts["player1"]
    assert "stone (2 left), obsidian (2 left)" in prompts["player1"] and "oak_planks" not in prompts["player1"]
    r1 = env.step({
        "player1": "/setblock 0 1 0 stone\n/setblock 0 0 0 obsidian\n/give @p diamond\nplace stuff\n"
                   "/setblock 9 9 9 stone\n/setblock 2 1 0 oak_planks",
        "player2": "/setblock 1 0 0 oak_planks\n/setblock 2 0 0 white_concrete\n/setblock 1 1 0 oak_planks",
    })
    # world: 4 of 5 target cells, one extra at (1,1,0); pairs: 5, same: (1,0)-(1,1) oak/oak
    # score = 2*4/5 - 1.5*1/5 - 1/(2*5) = 1.6 - 0.3 - 0.1 = 1.2; the first turn starts from score 0
    assert r1.team_reward == pytest.approx(1.2) and not r1.done
    assert r1.info["accepted"] == 5 and r1.info["rejected"] == 4
    assert {k: r1.info[f"rejected/{k}"] for k in ("command", "syntax", "bbox", "block")} == \
        {"command": 1, "syntax": 1, "bbox": 1, "block": 1}
    # the simulated player's instructions for the incomplete build
    report = r1.next_prompts["player1"]
    assert "Still missing at: (2 1 0)" in report and "remove them: (1 1 0)" in report
    assert "/give is not allowed" in report and "(9 9 9) is outside the build area" in report
    assert "stone (1 left)" in report
    r2 = env.step({"player1": "/setblock 2 1 0 stone\n/setblock 2 1 0 stone\n/setblock 2 1 0 stone",
                   "player2": "/setblock 1 1 0 air"})
    # complete: 5 of 5, no extra, no same-block neighbours -> score 2.0; reward = 2.0 - 1.2; the episode stops early
    assert r2.team_reward == pytest.approx(0.8) and r2.done and r2.info["complete"] == 1.0
    # stone: 2 - 1 (turn 1) = 1 left, used by the first command; the other two find none left
    assert r2.info["rejected/inventory"] == 2 and r2.info["accepted"] == 2
    assert r1.team_reward + r2.team_reward == pytest.approx(2.0)  # the return is the final score
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step({"player1": "", "player2": ""})


def test_garbage_answers_never_crash_and_are_counted():
    env = StrBuildEnv(max_commands=3)
    env.reset(STR_TASK)
    result = env.step({"player1": "\x00\x01 /setblock a b c d\n" * 5, "player2": None})
    assert result.team_reward == 0.0 and result.info["rejected/syntax"] == 3 and result.info["rejected/limit"] == 2
    with pytest.raises(ValueError, match="one answer per player"):
        env.step({"player1": "x"})


def test_compact_prompts_list_cells_and_differ_between_players():
    env = StrBuildEnv(prompt_style="compact")
    prompts = env.reset(STR_TASK)
    assert "Cells to fill: 0 1 0, 2 1 0, 0 0 0, 1 0 0, 2 0 0" in prompts["player1"]
    assert "/setblock 0 1 0 stone\n/setblock 2 1 0 obsidian" in prompts["player1"]
    assert "/setblock 1 0 0 oak_planks\n/setblock 2 0 0 white_concrete" in prompts["player2"]
    with pytest.raises(ValueError, match="prompt_style"):
        StrBuildEnv(prompt_style="tiny")


def test_housebuild_episode_spiders_fill_and_damage():
    env = HouseBuildEnv()
    prompts = env.reset(HOUSE_TASK)
    assert "y=0: (0, 0, 0, 1, 0, 0, stone)" in prompts["player1"] and "1 spider(s)" in prompts["player1"]
    assert "/damage @e[type=spider,limit=1] 4 minecraft:player_attack" in prompts["player2"]
    r1 = env.step({"player1": "/fill 0 0 0 1 0 0 stone", "player2": "/fill 0 1 0 2 1 0 oak_planks"})
    # 4 of 4 correct, one extra at (2,1,0), the spider bites for 3 of 20 HP
    # score = 2 - 1.5/4 - 0.2*3/20 = 2 - 0.375 - 0.03 = 1.595
    assert r1.team_reward == pytest.approx(1.595) and r1.info["hp"] == pytest.approx(0.85) and not r1.done
    assert "Blocks outside the plan" in r1.next_prompts["player2"]
    r2 = env.step({"player1": "/damage @e[type=spider,limit=1] 5\n/damage @e[type=spider,limit=1] 4 minecraft:player_attack",
                   "player2": "/fill 2 1 0 2 1 0 air\n/kill @e[type=spider]\n/fill 0 0 0 0 0 0 stone"})
    # the spider (4 HP) dies; the extra block is cleared; no new damage: score 2 - 0.03 = 1.97; complete
    assert r2.team_reward == pytest.approx(1.97 - 1.595) and r2.done and r2.info["spiders"] == 0
    assert r2.info["rejected/attack"] == 1 and r2.info["rejected/command"] == 1 and r2.info["rejected/block"] == 1


def test_housebuild_attack_limit_and_no_spider():
    env = HouseBuildEnv(max_attacks=1)
    env.reset({**HOUSE_TASK, "spiders": [[1, 1], [], [], []], "spider_hp": 8})
    hit = "/damage @e[type=spider,limit=1] 4\n"
    r = env.step({"player1": hit * 2, "player2": ""})
    assert r.info["rejected/attack"] == 1 and r.info["damage"] == 2.0  # two spiders alive bite for 1 each
    env.reset({**HOUSE_TASK, "spiders": [[], [], [], []]})
    assert env.step({"player1": hit, "player2": ""}).info["rejected/attack"] == 1  # no spider alive


@pytest.mark.parametrize("env_cls", [StrBuildEnv, HouseBuildEnv])
def test_generated_tasks_split_train_and_eval_by_shape(env_cls):
    train = env_cls.make_rows(40, seed=0, split="train")
    evals = env_cls.make_rows(10, seed=0, split="eval")
    key = env_cls.split_key
    assert not {key(t) for t in train} & {key(t) for t in evals}  # no held-out shape is ever trained on
    assert env_cls.make_rows(5, seed=0, split="train") == train[:5]  # deterministic
    assert env_cls.make_rows(5, seed=1, split="train") != train[:5]
    for task in train[:10] + evals:
        env = env_cls()
        env.validate_dataset_columns(list(task))
        prompts = env.reset(task)
        assert set(prompts) == {"player1", "player2"}
        result = env.step({"player1": "", "player2": ""})
        assert result.team_reward <= 0.0 and result.info["coverage"] == 0.0


def test_registry_and_dataset():
    assert ENVIRONMENTS["strbuild"] is StrBuildEnv and ENVIRONMENTS["housebuild"] is HouseBuildEnv
    data = StrBuildEnv.make_dataset(num_tasks=3, seed=0)
    assert len(data) == 3 and set(StrBuildEnv.required_columns) <= set(data.column_names)
