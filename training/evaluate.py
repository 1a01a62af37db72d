"""The paper's two experiments on the held-out test split of a bundle's corpus.

* epsilon sweep: macro-F1 of DeepCandidate, truncation, word-level metric DP, non-private and a
  random guesser, ``trials`` runs each (randomness over the mechanisms), mean and sd;
* k sweep at one epsilon: the same methods on test documents binned by number of sentences
  (reusing that epsilon's runs).

Every hyperparameter was chosen on validation at training time; nothing here looks at test
labels except to score.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.baselines import TruncationBox, WordMetricDP, random_guess_macro_f1
from sentdp.bundle import Bundle
from sentdp.encoders import SentenceEncoder, recode
from sentdp.mechanism import sample_from_utilities
from training.classifiers import macro_f1, train_classifier
from training.datasets import Corpus, Splits, load_glove, stratified_splits
from training.embeddings import CorpusEmbeddings, embed_corpus
from training.nets import seed_everything
from training.p_selection import DEFAULT_EPSILONS
from training.pipeline import TrainConfig, load_corpus
from training.settings import TrainingSettings

K_BINS = ((2, 5), (6, 10), (11, 15), (16, 20), (21, 30), (31, 45), (46, 10_000))
BASELINES = ("truncation", "word_mdp", "nonprivate", "random_guess")


def deepcandidate_key(bundle: Bundle) -> str:
    return f"deepcandidate:{bundle.manifest.name}"


@dataclass(frozen=True)
class EvalConfig:
    trials: int = 5
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    k_epsilon: float = 10.0
    mdp_documents: int = 100
    mdp_vocabulary: int = 20_000
    seed: int = 0
    max_test_documents: int | None = None


@dataclass
class Predictions:
    """Per trial, the predicted class of every scored document, for one method and epsilon."""

    documents: list[int]
    trials: list[npt.NDArray[np.int64]] = field(default_factory=list)


def summary(values: Sequence[float]) -> dict[str, Any]:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": mean, "sd": sd, "trials": list(values)}


def evaluation_corpus(bundle: Bundle, settings: TrainingSettings) -> tuple[Corpus, Splits]:
    """The bundle's corpus and splits, rebuilt exactly as at training time."""
    extra = bundle.manifest.extra
    config = TrainConfig(
        dataset=str(extra.get("dataset", bundle.manifest.corpus.name)),
        per_class=extra.get("per_class"),
        seed=bundle.manifest.corpus.split_seed,
        corpus_is_public=bundle.manifest.corpus.is_public,
    )
    corpus = load_corpus(config, settings)
    return corpus, stratified_splits(corpus, bundle.manifest.corpus.split_seed)


def run_evaluation(
    bundles: Sequence[Bundle],
    settings: TrainingSettings,
    config: EvalConfig,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Score every bundle's DeepCandidate and the baselines on the same test documents.

    The bundles must come from the same corpus and split seed (e.g. the paper's recipe and a
    task-tuned bundle); the baselines use the first bundle's encoder and C_nonpriv.
    """
    started = time.perf_counter()
    seed_everything(config.seed, settings.threads)
    bundle = bundles[0]
    for other in bundles[1:]:
        same = (other.manifest.corpus.sha256, other.manifest.corpus.split_seed) == (
            bundle.manifest.corpus.sha256,
            bundle.manifest.corpus.split_seed,
        )
        if not same or other.manifest.extra.get("per_class") != bundle.manifest.extra.get(
            "per_class"
        ):
            raise ValueError("bundles evaluated together must share corpus and splits")
    corpus, splits = evaluation_corpus(bundle, settings)
    encoder = SentenceEncoder(bundle.encoder_dir, settings.device, settings.encode_batch_size)
    splitter = dict(bundle.manifest.splitter)
    embeddings = embed_corpus(corpus, encoder, settings.cache_dir, splitter, show_progress=False)
    label_index = {label: i for i, label in enumerate(corpus.labels)}
    y = np.array([label_index[d.label] for d in corpus.documents], dtype=np.int64)
    test = list(splits.test)
    if config.max_test_documents is not None:
        test = test[: config.max_test_documents]
    n_classes = len(corpus.labels)
    k_of = {i: len(corpus.documents[i].sentences) for i in test}
    methods = [deepcandidate_key(b) for b in bundles] + list(BASELINES)
    results: dict[str, Any] = {
        "models": {b.manifest.name: b.manifest.recipe for b in bundles},
        "corpus": corpus.name,
        "test_documents": len(test),
        "epsilons": list(config.epsilons),
        "trials": config.trials,
        "k_epsilon": config.k_epsilon,
        "methods": methods,
        "eps_sweep": {m: {} for m in methods},
        "notes": [],
    }
    predictions: dict[str, Predictions] = {}

    nonprivate = bundle.classifier_nonpriv
    if nonprivate is None:
        raise ValueError("the bundle has no C_nonpriv classifier")
    plain_test = embeddings.means(test)
    nonprivate_pred = np.argmax(nonprivate(plain_test), axis=1)
    score = macro_f1(y[test], nonprivate_pred, n_classes)
    guess = random_guess_macro_f1(y[splits.train], n_classes)
    for epsilon in config.epsilons:
        results["eps_sweep"]["nonprivate"][f"{epsilon:g}"] = summary([score])
        results["eps_sweep"]["random_guess"][f"{epsilon:g}"] = summary([guess])
    predictions["nonprivate"] = Predictions(test, [nonprivate_pred])
    log(f"non-private macro-F1 {score:.3f}; random guess {guess:.3f}")

    for each in bundles:
        _deepcandidate(each, embeddings, test, y, n_classes, config, results, predictions, log)
    _truncation(bundle, embeddings, splits, test, y, n_classes, config, results, predictions, log)
    _word_mdp(
        bundle, encoder, corpus, test, y, n_classes, settings, config, results, predictions, log
    )
    results["k_sweep"] = _k_sweep(predictions, y, k_of, n_classes, guess)
    results["seconds"] = time.perf_counter() - started
    return results


def _deepcandidate(
    bundle: Bundle,
    embeddings: CorpusEmbeddings,
    test: list[int],
    y: npt.NDArray[np.int64],
    n_classes: int,
    config: EvalConfig,
    results: dict[str, Any],
    predictions: dict[str, Predictions],
    log: Callable[[str], None],
) -> None:
    utilities: dict[tuple[str, int], list[npt.NDArray[np.float64]]] = {}
    for epsilon in config.epsilons:
        choice = bundle.manifest.choice_for(epsilon)
        variant = bundle.variant(choice.variant)
        cached = (choice.variant, choice.p)
        if cached not in utilities:
            documents = [recode(variant.recoder, embeddings.document(i)) for i in test]
            utilities[cached] = variant.mechanism().utilities_batch(
                documents, [choice.p] * len(documents)
            )
        labels = variant.candidate_labels()
        scores, trials = [], []
        for trial in range(config.trials):
            rng = np.random.default_rng([config.seed, trial, int(epsilon * 1000)])
            chosen = np.array([sample_from_utilities(u, epsilon, rng) for u in utilities[cached]])
            predicted = labels[chosen]
            trials.append(predicted)
            scores.append(macro_f1(y[test], predicted, n_classes))
        key = deepcandidate_key(bundle)
        results["eps_sweep"][key][f"{epsilon:g}"] = summary(scores) | {
            "p": choice.p,
            "variant": choice.variant,
        }
        if epsilon == config.k_epsilon:
            predictions[key] = Predictions(test, trials)
        log(
            f"DeepCandidate {bundle.manifest.name} eps={epsilon:g} {choice.variant} p={choice.p}: "
            f"{statistics.fmean(scores):.3f}"
        )


def _truncation(
    bundle: Bundle,
    embeddings: CorpusEmbeddings,
    splits: Splits,
    test: list[int],
    y: npt.NDArray[np.int64],
    n_classes: int,
    config: EvalConfig,
    results: dict[str, Any],
    predictions: dict[str, Predictions],
    log: Callable[[str], None],
) -> None:
    box = TruncationBox.from_public(embeddings.means(splits.train))

    def clipped(docs: Sequence[int]) -> npt.NDArray[np.float64]:
        return np.stack([box.clipped_mean(embeddings.document(i)) for i in docs])

    classifier = train_classifier(
        clipped(splits.train),
        y[splits.train],
        clipped(splits.validation),
        y[splits.validation],
        n_classes,
        config.seed,
    ).classifier
    for epsilon in config.epsilons:
        scores, trials = [], []
        for trial in range(config.trials):
            rng = np.random.default_rng([config.seed, trial, int(epsilon * 1000), 1])
            noisy = np.stack([box.privatize(embeddings.document(i), epsilon, rng) for i in test])
            predicted = np.argmax(classifier(noisy), axis=1)
            trials.append(predicted)
            scores.append(macro_f1(y[test], predicted, n_classes))
        results["eps_sweep"]["truncation"][f"{epsilon:g}"] = summary(scores)
        if epsilon == config.k_epsilon:
            predictions["truncation"] = Predictions(test, trials)
        log(f"truncation eps={epsilon:g}: {statistics.fmean(scores):.3f}")


def _word_mdp(
    bundle: Bundle,
    encoder: SentenceEncoder,
    corpus: Corpus,
    test: list[int],
    y: npt.NDArray[np.int64],
    n_classes: int,
    settings: TrainingSettings,
    config: EvalConfig,
    results: dict[str, Any],
    predictions: dict[str, Predictions],
    log: Callable[[str], None],
) -> None:
    vectors, words = load_glove(settings.cache_dir)
    mdp = WordMetricDP(vectors, words, config.mdp_vocabulary)
    rng = np.random.default_rng([config.seed, 7])
    scored = sorted(rng.choice(test, size=min(config.mdp_documents, len(test)), replace=False))
    scored = [int(i) for i in scored]
    results["notes"].append(
        f"word-level metric DP: {len(scored)} of {len(test)} test documents (re-encoding every "
        f"randomised document is the slow part), output vocabulary = the {config.mdp_vocabulary} "
        "most frequent GloVe words, words absent from GloVe kept unchanged"
    )
    classifier = bundle.classifier_nonpriv
    assert classifier is not None
    for epsilon in config.epsilons:
        scores, trials = [], []
        for trial in range(config.trials):
            noise = np.random.default_rng([config.seed, trial, int(epsilon * 1000), 2])
            means = []
            for i in scored:
                randomized = mdp.randomize(list(corpus.documents[i].sentences), epsilon, noise)
                means.append(encoder.encode(randomized).astype(np.float64).mean(axis=0))
            predicted = np.argmax(classifier(np.stack(means)), axis=1)
            trials.append(predicted)
            scores.append(macro_f1(y[scored], predicted, n_classes))
        results["eps_sweep"]["word_mdp"][f"{epsilon:g}"] = summary(scores)
        if epsilon == config.k_epsilon:
            predictions["word_mdp"] = Predictions(scored, trials)
        log(f"word-level metric DP eps={epsilon:g}: {statistics.fmean(scores):.3f}")


def _k_sweep(
    predictions: dict[str, Predictions],
    y: npt.NDArray[np.int64],
    k_of: dict[int, int],
    n_classes: int,
    guess: float,
) -> dict[str, Any]:
    sweep: dict[str, Any] = {"bins": [], "methods": {}}
    for low, high in K_BINS:
        sweep["bins"].append(f"{low}-{high}" if high < 10_000 else f"{low}+")
    for method, found in predictions.items():
        rows: list[dict[str, Any] | None] = []
        for low, high in K_BINS:
            positions = [n for n, i in enumerate(found.documents) if low <= k_of[i] <= high]
            if len(positions) < 5:
                rows.append(None)
                continue
            docs = [found.documents[n] for n in positions]
            values = [macro_f1(y[docs], t[positions], n_classes) for t in found.trials]
            rows.append(summary(values) | {"documents": len(positions)})
        sweep["methods"][method] = rows
    sweep["methods"]["random_guess"] = [summary([guess]) for _ in K_BINS]
    return sweep
