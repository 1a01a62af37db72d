"""The word-level metric-DP baseline randomises every word, unknown ones included."""

from __future__ import annotations

import numpy as np

from evaluation.baselines import WordMetricDP, tokenize_words

WORDS = ["the", "cat", "sat", "on", "mat", ".", "dog", "ran"]


def mechanism() -> WordMetricDP:
    rng = np.random.default_rng(0)
    return WordMetricDP(rng.normal(size=(len(WORDS), 6)), WORDS, output_vocabulary=6)


def test_unknown_words_never_pass_through() -> None:
    mdp = mechanism()
    for epsilon in (0.1, 1.0, 100.0):
        out = mdp.randomize(["Zyxwv sat on Qwerty's mat."], epsilon, np.random.default_rng(1))
        assert set(tokenize_words(out[0])) <= set(WORDS[:6]), out


def test_all_unknown_words_have_the_same_output_distribution() -> None:
    """Two sentences that differ only in an unknown word are indistinguishable: the same
    randomness gives the same output (distance 0 in the metric)."""
    mdp = mechanism()
    for seed in range(20):
        a = mdp.randomize(["the zyxwv sat ."], 2.0, np.random.default_rng(seed))
        b = mdp.randomize(["the Smithson sat ."], 2.0, np.random.default_rng(seed))
        assert a == b


def test_at_large_epsilon_words_decode_to_themselves_and_unknowns_to_the_mean() -> None:
    mdp = mechanism()
    out = mdp.randomize(["the cat sat on mat ."], 1e6, np.random.default_rng(2))
    assert out == ["the cat sat on mat ."]
    nearest = WORDS[int(np.argmin(((mdp.output - mdp.unknown) ** 2).sum(axis=1)))]
    assert mdp.randomize(["zyxwv"], 1e6, np.random.default_rng(3)) == [nearest]
    # Words outside the output vocabulary decode to their nearest word inside it.
    assert mdp.randomize(["dog"], 1e6, np.random.default_rng(4))[0] in WORDS[:6]
