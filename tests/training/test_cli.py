"""sentdp-train's flags: their defaults are TrainConfig's."""

from __future__ import annotations

import dataclasses

from training.cli import config_from_args, parse_args
from training.pipeline import TrainConfig


def test_the_flags_default_to_the_config_defaults() -> None:
    config = config_from_args(parse_args(["--dataset", "bbc-news"]))
    assert config == TrainConfig(dataset="bbc-news")


def test_epsilons_given_with_quick_replace_the_quick_grid() -> None:
    config = config_from_args(parse_args(["--dataset", "x", "--quick", "--epsilons", "5", "2"]))
    assert config == dataclasses.replace(TrainConfig(dataset="x").quick(), epsilons=(2.0, 5.0))


def test_the_vote_rule_flag_chooses_the_sentence_count_rule_or_permute_and_flip() -> None:
    assert config_from_args(parse_args(["--dataset", "x"])).vote_by_count
    flip = config_from_args(parse_args(["--dataset", "x", "--vote-rule", "flip"]))
    assert flip == TrainConfig(dataset="x", vote_by_count=False)


def test_the_vote_shape_flag_lets_validation_pick_cube_votes_or_keeps_the_simplex() -> None:
    assert config_from_args(parse_args(["--dataset", "x"])).vote_shapes == ("simplex", "cube")
    simplex = config_from_args(parse_args(["--dataset", "x", "--vote-shape", "simplex"]))
    assert simplex == TrainConfig(dataset="x", vote_shapes=("simplex",))


def test_the_selection_flag_decides_whether_the_p_table_may_pick_the_mean_rule() -> None:
    def uses_mean(*flags: str) -> bool:
        return config_from_args(parse_args(["--dataset", "x", *flags])).uses_mean

    assert not uses_mean()  # the paper's recipe: Tukey depth only
    assert uses_mean("--recipe", "mixed")
    assert uses_mean("--selection", "both")
    assert not uses_mean("--recipe", "mixed", "--selection", "depth")
