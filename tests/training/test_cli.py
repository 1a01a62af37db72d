"""sentdp-train's flags: their defaults are TrainConfig's."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from training.cli import _stop, config_from_args, main, parse_args
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


def test_sigterm_unwinds_so_the_staged_bundle_is_removed(tmp_path: Path) -> None:
    """A training stopped by SIGTERM (a container's stop, a CI timeout) must not leave its
    staged bundle, which holds the training vocabulary, in the temporary folder."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit):
            main(["--dataset", str(tmp_path / "missing.csv"), "--corpus-is-public"])
        assert signal.getsignal(signal.SIGTERM) is _stop
    finally:
        signal.signal(signal.SIGTERM, before)
    script = (
        "import os, signal, sys, tempfile, time\n"
        "from training.cli import _stop\n"
        "signal.signal(signal.SIGTERM, _stop)\n"
        "with tempfile.TemporaryDirectory(prefix='sentdp-bundle-', dir=sys.argv[1]):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], check=False, timeout=60, cwd=REPO
    )
    assert ended.returncode == 128 + signal.SIGTERM
    assert not list(tmp_path.glob("sentdp-bundle-*"))
