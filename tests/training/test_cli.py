"""sentdp-train's flags: their defaults are TrainConfig's."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import REPO
from training.cli import config_from_args, main, parse_args
from training.pipeline import TrainConfig
from training.stops import STOP_SIGNALS, Stops
from training.store import check_store, load_from_store, save_to_store


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
    staged bundle, which holds the training vocabulary, in the temporary folder; main puts
    back the handlers it replaced."""
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    with pytest.raises(SystemExit):
        main(["--dataset", str(tmp_path / "missing.csv"), "--corpus-is-public"])
    assert {number: signal.getsignal(number) for number in STOP_SIGNALS} == before
    script = (
        "import os, signal, sys, tempfile, time\n"
        "from training.stops import Stops\n"
        "Stops().install()\n"
        "with tempfile.TemporaryDirectory(prefix='sentdp-bundle-', dir=sys.argv[1]):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], check=False, timeout=60, cwd=REPO
    )
    assert ended.returncode == 128 + signal.SIGTERM
    assert not list(tmp_path.glob("sentdp-bundle-*"))


def test_a_stop_waits_while_the_model_is_saved_and_is_ignored_once_it_is(
    quick_bundle_tag: str,
) -> None:
    """A stop during the copy into the store would leave a half-written model, and one after
    it would report a failure for a model that exists (so a script would train again)."""
    quick_bundle = load_from_store(quick_bundle_tag)
    # as in a terminal: a run started in the background (CI's nohup) inherits SIGINT ignored
    inherited = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
        signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    }
    try:
        stops = Stops()
        stops.install()
        try:

            @contextmanager
            def stopped_while_saving() -> Iterator[None]:
                with stops.saving():
                    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in this thread
                    yield

            tag = save_to_store(quick_bundle, "sentdp-test-stopped", {}, stopped_while_saving())
            assert stops.saved
            assert stops.ignored
            assert load_from_store(tag).manifest == quick_bundle.manifest  # whole
            os.kill(os.getpid(), signal.SIGINT)  # after saving: noted, not raised
            failed = Stops()
            failed.install()

            def save_fails() -> None:
                with failed.saving():
                    os.kill(os.getpid(), signal.SIGTERM)
                    raise OSError("disk full")

            with pytest.raises(OSError, match="disk full"):  # the save's own error ends the run
                save_fails()
            assert not failed.saved
            with pytest.raises(SystemExit) as ended:
                os.kill(os.getpid(), signal.SIGINT)  # no save under way: a stop ends the run
            assert ended.value.code == 128 + signal.SIGINT
            os.kill(os.getpid(), signal.SIGTERM)  # a second stop: the first one's unwinding goes on
            failed.restore()
        finally:
            stops.restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as under nohup
        ignoring = Stops()
        ignoring.install()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        ignoring.restore()
    finally:
        for number, handler in inherited.items():
            signal.signal(number, handler)


def test_a_store_that_cannot_be_used_stops_the_run_before_the_corpus_is_read(
    tmp_path: Path,
) -> None:
    """It failed only at the save, after the whole training."""
    home = tmp_path / "a-file"
    home.write_text("")
    ended = subprocess.run(
        [sys.executable, "-m", "training.cli", "--dataset", str(tmp_path / "x.csv")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "BENTOML_HOME": str(home)},
    )
    assert ended.returncode == 2
    assert "the BentoML model store cannot be used (check BENTOML_HOME)" in " ".join(
        ended.stderr.split()
    )


def test_a_model_being_saved_elsewhere_does_not_stop_the_store_check(bentoml_home: Path) -> None:
    """Another sentdp-train's model has its folder before its model.yaml; reading every model
    (bentoml.models.list) failed on it, and on any version a killed save left behind."""
    incomplete = bentoml_home / "models" / "sentdp-being-saved" / "abc123"
    incomplete.mkdir(parents=True)
    try:
        check_store()
    finally:
        shutil.rmtree(incomplete.parent)
