"""The paper's two experiments on the held-out test split of a bundle's corpus.

* epsilon sweep: macro-F1 of DeepCandidate, truncation, word-level metric DP, non-private and a
  random guesser, ``trials`` runs each (randomness over the mechanisms), mean and sd;
* k sweep at one epsilon: the same methods on test documents binned by number of sentences
  (reusing that epsilon's runs).

Every hyperparameter was chosen on validation at training time; nothing here looks at test
labels except to score.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from evaluation.baselines import TruncationBox, WordMetricDP, random_guess_macro_f1
from evaluation.results import (
    DEEPCANDIDATE,
    SERVED,
    VOTE,
    EvaluationResults,
    KSweep,
    MethodScores,
    PairedSweep,
    Score,
    deepcandidate_method,
    epsilon_key,
    served_method,
    vote_method,
)
from sentdp.bundle import Bundle, PChoice
from sentdp.encoders import Encoder, open_encoder, recode
from sentdp.errors import InputError
from sentdp.mechanism import DeepCandidate, mechanism_epsilon
from sentdp.sampling import plan_selection
from training.classifiers import macro_f1, train_classifier
from training.corpora import CorpusSpec, load_corpus
from training.datasets import (
    Corpus,
    CorpusFileMissingError,
    Splits,
    load_glove,
    stratified_splits,
)
from training.embeddings import CorpusEmbeddings, embed_corpus
from training.nets import seed_everything
from training.p_selection import DEFAULT_EPSILONS
from training.settings import TrainingSettings

K_BINS = ((2, 5), (6, 10), (11, 15), (16, 20), (21, 30), (31, 45), (46, 10_000))
BASELINES = ("truncation", "word_mdp", "nonprivate", "random_guess")


@dataclass(frozen=True)
class EvalConfig:
    """How thoroughly to evaluate; ``sentdp-eval`` builds one from its flags."""

    trials: int = 5
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    k_epsilon: float = 10.0
    mdp_documents: int = 100
    mdp_vocabulary: int = 20_000
    seed: int = 0
    max_test_documents: int | None = None
    baselines: tuple[str, ...] = ("truncation", "word_mdp")
    """Private baselines to run (word-level metric DP is the slow one)."""
    dataset: str | None = None
    """The corpus file, where it is not at the path the bundle was trained with (its sha256
    must still be the trained one's)."""

    def quick(self) -> EvalConfig:
        """A small, fast evaluation for tests and smoke runs (same code path)."""
        return replace(self, trials=2, mdp_documents=10, max_test_documents=20)


@dataclass
class Predictions:
    """Per trial, the predicted class of every scored document, for one method and epsilon."""

    documents: list[int]
    trials: list[npt.NDArray[np.int64]] = field(default_factory=list)


def evaluation_corpus(
    bundle: Bundle, settings: TrainingSettings, dataset: str | None = None
) -> tuple[Corpus, Splits]:
    """The bundle's corpus and splits, rebuilt exactly as at training time (from ``dataset``
    if given: the same file moved)."""
    extra = bundle.manifest.extra
    spec = CorpusSpec(
        dataset=dataset or str(extra.get("dataset", bundle.manifest.corpus.name)),
        per_class=extra.get("per_class"),
        seed=bundle.manifest.corpus.split_seed,
        corpus_is_public=bundle.manifest.corpus.is_public,
        text_column=str(extra.get("text_column", "text")),
        label_column=str(extra.get("label_column", "label")),
    )
    try:
        corpus = load_corpus(spec, settings)
    except CorpusFileMissingError as error:
        if dataset is not None:
            raise
        raise InputError(
            f"{error} (the path {bundle.manifest.name} was trained from; give the file's path "
            "now with --dataset)"
        ) from None
    if corpus.sha256 != bundle.manifest.corpus.sha256:  # its test split is other documents
        raise InputError(
            f"{spec.dataset} is not the file {bundle.manifest.name} was trained on (sha256 "
            f"{corpus.sha256[:12]}..., trained on {bundle.manifest.corpus.sha256[:12]}...)"
        )
    return corpus, stratified_splits(corpus, bundle.manifest.corpus.split_seed)


def bundle_encoder(bundle: Bundle, settings: TrainingSettings) -> Encoder:
    """The bundle's G as training runs it (``SENTDP_DEVICE``, ``SENTDP_ENCODE_BATCH_SIZE``,
    ``SENTDP_THREADS``, ``SENTDP_ENCODER_THREADING``): every evaluation and the audit encode
    alike, into one embeddings cache."""
    return open_encoder(
        bundle.encoder_dir,
        bundle.encoder_backend,
        settings.device,
        settings.encode_batch_size,
        threads=settings.threads,
        onnx_threading=settings.encoder_threading,
        cpu_linear=settings.cpu_linear,
    )


def embedded_corpus(
    bundle: Bundle, settings: TrainingSettings
) -> tuple[Corpus, Splits, Encoder, CorpusEmbeddings]:
    """The bundle's corpus and splits, its encoder (checked against the bundle) and every
    document's sentence embeddings (cached), for the scripts that score a bundle's rules."""
    corpus, splits = evaluation_corpus(bundle, settings)
    bundle.check_encoder()
    encoder = bundle_encoder(bundle, settings)
    embeddings = embed_corpus(corpus, encoder, settings.cache_dir, dict(bundle.manifest.splitter))
    return corpus, splits, encoder, embeddings


def run_evaluation(
    bundles: Sequence[Bundle],
    settings: TrainingSettings,
    config: EvalConfig,
    log: Callable[[str], None] = print,
) -> EvaluationResults:
    """Score every bundle's DeepCandidate and the baselines on the same test documents.

    The bundles must come from the same corpus and split seed (e.g. the paper's recipe and a
    task-tuned bundle); the baselines use the first bundle's encoder and C_nonpriv.
    """
    started = time.perf_counter()
    run = _experiment(bundles, settings, config, log)
    run.nonprivate_and_guess()
    for each in bundles:
        run.deepcandidate(each)
    voted = [each for each in _distinct_votes(bundles) if run.sentence_vote(each)]
    served = [each for each in bundles if run.served_labels(each, voted)]
    if "truncation" in config.baselines:
        run.truncation()
    if "word_mdp" in config.baselines:
        run.word_mdp()
    methods = (
        [deepcandidate_method(b.manifest.name) for b in bundles]
        + [vote_method(b.manifest.name) for b in voted]
        + [served_method(b.manifest.name) for b in served]
        + [m for m in BASELINES if m in config.baselines or m in ("nonprivate", "random_guess")]
    )
    paired = None
    if "word_mdp" in config.baselines:
        rows = run.on_mdp_documents(methods) | {"word_mdp": run.eps_sweep["word_mdp"]}
        paired = _paired(run, served, voted, rows)
    return EvaluationResults(
        models={b.manifest.name: b.manifest.recipe for b in bundles},
        corpus=run.corpus.name,
        test_documents=len(run.test),
        epsilons=config.epsilons,
        trials=config.trials,
        k_epsilon=config.k_epsilon,
        methods=methods,
        eps_sweep=run.eps_sweep,
        notes=run.notes,
        k_sweep=run.k_sweep(),
        seconds=time.perf_counter() - started,
        on_mdp_documents=paired,
        split_seed=run.splits.seed,
    )


def _served_row(
    bundle: Bundle, candidate: MethodScores, vote: MethodScores, epsilons: Sequence[float]
) -> MethodScores:
    """What /classify serves with ``bundle``, per epsilon: the vote's score or the
    candidate's, as the bundle's validation chose."""
    row: MethodScores = {}
    for epsilon in epsilons:
        key = epsilon_key(epsilon)
        by_vote = bundle.manifest.choice_for(epsilon).label == "vote"
        row[key] = replace(vote[key], variant="sentence-vote") if by_vote else candidate[key]
    return row


def _paired(
    run: Experiment,
    served: Sequence[Bundle],
    voted: Sequence[Bundle],
    rows: dict[str, MethodScores],
) -> PairedSweep:
    """``rows`` (methods already scored on word-level metric DP's documents) with the
    /classify rows built from them as :meth:`Experiment.served_labels` builds its own."""
    rows = dict(rows)
    for bundle in served:
        scorer = next(b for b in voted if _same_vote(b, bundle))
        rows[served_method(bundle.manifest.name)] = _served_row(
            bundle,
            rows[deepcandidate_method(bundle.manifest.name)],
            rows[vote_method(scorer.manifest.name)],
            run.config.epsilons,
        )
    return PairedSweep(len(run.mdp_documents()), rows)


def _distinct_votes(bundles: Sequence[Bundle]) -> list[Bundle]:
    """The bundles whose SentenceVote differs from every earlier bundle's (recipes trained
    on the same corpus and seed share one vote: it is scored once)."""
    distinct: list[Bundle] = []
    for bundle in bundles:
        if not bundle.votes:
            continue
        if not any(_same_vote(other, bundle) for other in distinct):
            distinct.append(bundle)
    return distinct


def _same_vote(a: Bundle, b: Bundle) -> bool:
    """Whether both bundles run the same vote, and draw the same short documents from the
    hard-vote table, at every grid epsilon of either."""
    if not (a.votes and b.votes):
        return False
    grid = {c.epsilon for c in a.manifest.p_table} | {c.epsilon for c in b.manifest.p_table}
    for epsilon in grid:
        mine, theirs = a.vote_for(epsilon), b.vote_for(epsilon)
        tables = (
            a.manifest.choice_for(epsilon).vote_table,
            b.manifest.choice_for(epsilon).vote_table,
        )
        if not mine.same_as(theirs) or tables[0] != tables[1]:
            return False
    return True


def _check_same_corpus(bundles: Sequence[Bundle]) -> None:
    def corpus_of(bundle: Bundle) -> tuple[str, int, object]:
        manifest = bundle.manifest
        return manifest.corpus.sha256, manifest.corpus.split_seed, manifest.extra.get("per_class")

    if len({corpus_of(b) for b in bundles}) > 1:
        raise ValueError("bundles evaluated together must share corpus and splits")

    def encoder_of(bundle: Bundle) -> str:
        # cpu_linear records what training ran; this run encodes with SENTDP_CPU_LINEAR
        ignored = ("name", "cpu_linear")
        described = {k: v for k, v in bundle.manifest.encoder.items() if k not in ignored}
        return json.dumps({"backend": bundle.encoder_backend} | described, sort_keys=True)

    if len({encoder_of(b) for b in bundles}) > 1:  # they would share the first's embeddings
        raise ValueError(
            "bundles evaluated together must share an encoder (backend and files); evaluate "
            "each in its own run"
        )


def scored_as(choice: PChoice) -> tuple[str, int | None]:
    """How a p table entry names its row in a report: the variant and p for Tukey depth, the
    variant and rule with its radius (and no p) for the clipped mean."""
    if choice.radius is None:
        return choice.variant, choice.p
    return f"{choice.variant}, clipped mean R={choice.radius:.4g}", None


def _experiment(
    bundles: Sequence[Bundle],
    settings: TrainingSettings,
    config: EvalConfig,
    log: Callable[[str], None],
) -> Experiment:
    """The test documents and their embeddings under the first bundle's encoder."""
    seed_everything(config.seed, settings.threads)
    _check_same_corpus(bundles)
    bundle = bundles[0]
    corpus, splits = evaluation_corpus(bundle, settings, config.dataset)
    bundle.check_encoder()
    encoder = bundle_encoder(bundle, settings)
    embeddings = embed_corpus(
        corpus, encoder, settings.cache_dir, dict(bundle.manifest.splitter), show_progress=False
    )
    return Experiment(bundle, corpus, splits, encoder, embeddings, settings, config, log)


def rescore_labels(
    bundles: Sequence[Bundle],
    previous: EvaluationResults,
    settings: TrainingSettings,
    config: EvalConfig,
    log: Callable[[str], None] = print,
) -> EvaluationResults:
    """``previous`` with only the label rows (SentenceVote, /classify as served) scored again,
    e.g. after the label mechanism changed: every other row stays as it was.

    Refused unless the bundles (names and recipes), test documents, epsilons and trials are
    the ones ``previous`` scored, the first bundle's C_nonpriv scores exactly as recorded (a
    retrained bundle of the same name almost surely does not), and each bundle still picks
    the (variant, p) that ``previous``'s DeepCandidate row records at every epsilon (the
    served label may be that candidate's).
    """
    started = time.perf_counter()
    names = {b.manifest.name: b.manifest.recipe for b in bundles}
    if list(names.items()) != list(previous.models.items()):
        raise ValueError(f"the report scored {previous.models}, not {names}")
    if (previous.epsilons, previous.trials, previous.k_epsilon) != (
        config.epsilons,
        config.trials,
        config.k_epsilon,
    ):
        raise ValueError("epsilons, trials and the k-sweep epsilon must be the report's")
    run = _experiment(bundles, settings, config, log)
    if len(run.test) != previous.test_documents:
        raise ValueError(f"the report scored {previous.test_documents} test documents")
    paired = previous.on_mdp_documents
    if paired is not None and len(run.mdp_documents()) != paired.documents:
        # the subset is a seeded draw from the same test documents: the same count, the same set
        raise ValueError(
            f"the report's paired table scored word-level metric DP's {paired.documents} "
            f"documents: pass --mdp-documents {paired.documents}"
        )
    run.nonprivate_and_guess()  # a fingerprint of the first bundle: its C_nonpriv's test score
    if run.eps_sweep["nonprivate"] != previous.eps_sweep.get("nonprivate"):
        raise ValueError(
            f"{bundles[0].manifest.name}'s non-private classifier scores differently from the "
            "report's: not the bundle it scored; run a full evaluation"
        )
    for bundle in bundles:
        method = deepcandidate_method(bundle.manifest.name)
        for epsilon in config.epsilons:
            recorded, choice = previous.score(method, epsilon), bundle.manifest.choice_for(epsilon)
            variant, p = scored_as(choice)
            if (recorded.variant, recorded.p) != (variant, p):
                raise ValueError(
                    f"{bundle.manifest.name} picks {variant} p={p} at epsilon {epsilon:g}, "
                    f"the report's row {recorded.variant} p={recorded.p}: run a full evaluation"
                )
        run.eps_sweep[method] = previous.eps_sweep[method]
    voted = [each for each in _distinct_votes(bundles) if run.sentence_vote(each)]
    served = [each for each in bundles if run.served_labels(each, voted)]
    labels = [vote_method(b.manifest.name) for b in voted] + [
        served_method(b.manifest.name) for b in served
    ]
    kept = [m for m in previous.methods if not m.startswith((VOTE, SERVED))]
    candidates = [m for m in kept if m.startswith(DEEPCANDIDATE)]
    methods = candidates + labels + [m for m in kept if m not in candidates]
    eps_sweep = {m: previous.eps_sweep[m] for m in kept} | {m: run.eps_sweep[m] for m in labels}
    k_rows = {m: r for m, r in previous.k_sweep.methods.items() if not m.startswith(VOTE)}
    k_rows |= {m: r for m, r in run.k_sweep().methods.items() if m.startswith(VOTE)}
    if paired is not None:
        rows = {m: r for m, r in paired.eps_sweep.items() if not m.startswith((VOTE, SERVED))}
        paired = _paired(run, served, voted, rows | run.on_mdp_documents(labels))
    seconds = time.perf_counter() - started
    return replace(
        previous,
        methods=methods,
        eps_sweep=eps_sweep,
        k_sweep=KSweep(previous.k_sweep.bins, k_rows),
        on_mdp_documents=paired,
        notes=[
            *previous.notes,
            f"label rows (SentenceVote, /classify as served) re-scored in {seconds:.0f} s by "
            "the second command; every other row is the first command's",
        ],
    )


class Experiment:
    """One evaluation: the test documents, every method's scores, and the predictions at
    ``k_epsilon`` that the k sweep bins by document length."""

    def __init__(
        self,
        bundle: Bundle,
        corpus: Corpus,
        splits: Splits,
        encoder: Encoder,
        embeddings: CorpusEmbeddings,
        settings: TrainingSettings,
        config: EvalConfig,
        log: Callable[[str], None],
    ) -> None:
        self.bundle, self.corpus, self.splits = bundle, corpus, splits
        self.encoder, self.embeddings = encoder, embeddings
        self.settings, self.config, self.log = settings, config, log
        label_index = {label: i for i, label in enumerate(corpus.labels)}
        self.y = np.array([label_index[d.label] for d in corpus.documents], dtype=np.int64)
        self.test = list(splits.test)[: config.max_test_documents]
        self.n_classes = len(corpus.labels)
        self.predictions: dict[str, Predictions] = {}
        self.on_test: dict[str, dict[str, list[npt.NDArray[np.int64]]]] = {}
        """Per method and epsilon key, the trials' predictions for every test document."""
        self.guess = random_guess_macro_f1(self.y[splits.train], self.n_classes)
        self.eps_sweep: dict[str, MethodScores] = {}
        self.notes: list[str] = []

    def score(
        self,
        method: str,
        epsilon: float,
        documents: list[int],
        predicted: list[npt.NDArray[np.int64]],
        variant: str | None = None,
        p: int | None = None,
    ) -> None:
        """Record macro-F1 mean and sd over the trials' predictions, and keep the predictions
        at ``k_epsilon`` for the k sweep."""
        values = [macro_f1(self.y[documents], t, self.n_classes) for t in predicted]
        score = Score.of(values, p=p, variant=variant)
        self.eps_sweep.setdefault(method, {})[epsilon_key(epsilon)] = score
        if documents == self.test:
            self.on_test.setdefault(method, {})[epsilon_key(epsilon)] = predicted
        if epsilon == self.config.k_epsilon:
            self.predictions[method] = Predictions(documents, predicted)
        described = f"variant={variant} p={p}" if variant is not None else ""
        self.log(f"{method} eps={epsilon:g} {described}: {statistics.fmean(values):.3f}")

    def rng(self, trial: int, epsilon: float, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.config.seed, trial, int(epsilon * 1000), stream])

    def nonprivate_and_guess(self) -> None:
        classifier = self.bundle.classifier_nonpriv
        if classifier is None:
            raise ValueError("the bundle has no C_nonpriv classifier")
        predicted = np.argmax(classifier(self.embeddings.means(self.test)), axis=1)
        for epsilon in self.config.epsilons:
            self.score("nonprivate", epsilon, self.test, [predicted])
            guess = Score.of([self.guess])
            self.eps_sweep.setdefault("random_guess", {})[epsilon_key(epsilon)] = guess

    def deepcandidate(self, bundle: Bundle) -> None:
        """The released candidate's class, drawn as the service draws it at each epsilon (the
        p table's variant and rule: Tukey depth over p directions, or the clipped mean)."""
        deviations: dict[tuple[str, int, float], list[npt.NDArray[np.int64]]] = {}
        for epsilon in self.config.epsilons:
            choice = bundle.manifest.choice_for(epsilon)
            variant = bundle.variant(choice.variant)
            mean = None if choice.radius is None else variant.mean_mechanism(choice.radius)
            cached = (choice.variant, choice.p, choice.radius or 0.0)
            if cached not in deviations:
                documents = [
                    recode(variant.recoder, self.embeddings.document(i)) for i in self.test
                ]
                if mean is None:
                    utilities = variant.mechanism().utilities_batch(
                        documents, [choice.p] * len(documents)
                    )
                    deviations[cached] = [np.rint(-2.0 * u).astype(np.int64) for u in utilities]
                else:
                    deviations[cached] = [mean.deviations(d) for d in documents]
            run_at = (
                mechanism_epsilon(epsilon, variant.record.candidates)
                if mean is None
                else mean.plan_epsilon(epsilon)
            )
            plans = [plan_selection(d, run_at) for d in deviations[cached]]
            labels = variant.candidate_labels()
            predicted = [
                labels[DeepCandidate.draw_plans(plans, self.rng(trial, epsilon, 0))]
                for trial in range(self.config.trials)
            ]
            method = deepcandidate_method(bundle.manifest.name)
            self.score(method, epsilon, self.test, predicted, *scored_as(choice))

    def sentence_vote(self, bundle: Bundle) -> bool:
        """The label mechanism of /classify, scored like DeepCandidate's label (False when
        the bundle predates it)."""
        if not bundle.votes:
            return False
        logits: dict[int, list[npt.NDArray[np.float64]]] = {}
        for epsilon in self.config.epsilons:
            choice = bundle.manifest.choice_for(epsilon)  # as the service runs it
            vote = bundle.votes[choice.vote_index]
            if choice.vote_index not in logits:
                logits[choice.vote_index] = [
                    vote.logits(self.embeddings.document(i), self.corpus.documents[i].sentences)
                    for i in self.test
                ]
            plans = [
                vote.plan_from_logits(x, epsilon, table_sentences=choice.vote_table)
                for x in logits[choice.vote_index]
            ]
            predicted = [
                DeepCandidate.draw_plans(plans, self.rng(trial, epsilon, 3))
                for trial in range(self.config.trials)
            ]
            self.score(vote_method(bundle.manifest.name), epsilon, self.test, predicted)
        return True

    def served_labels(self, bundle: Bundle, voted: Sequence[Bundle]) -> bool:
        """What /classify returns with ``bundle``, per epsilon: the vote's label or the
        candidate's, as chosen on validation (False for a bundle without a vote)."""
        if not bundle.votes:
            return False
        scorer = next(b for b in voted if _same_vote(b, bundle))
        candidate = self.eps_sweep[deepcandidate_method(bundle.manifest.name)]
        vote = self.eps_sweep[vote_method(scorer.manifest.name)]
        row = _served_row(bundle, candidate, vote, self.config.epsilons)
        self.eps_sweep[served_method(bundle.manifest.name)] = row
        return True

    def truncation(self) -> None:
        emb, splits = self.embeddings, self.splits
        box = TruncationBox.from_public(emb.means(splits.train))

        def clipped(docs: Sequence[int]) -> npt.NDArray[np.float64]:
            return np.stack([box.clipped_mean(emb.document(i)) for i in docs])

        classifier = train_classifier(
            clipped(splits.train),
            self.y[splits.train],
            clipped(splits.validation),
            self.y[splits.validation],
            self.n_classes,
            self.config.seed,
        ).classifier
        for epsilon in self.config.epsilons:
            predicted = []
            for trial in range(self.config.trials):
                rng = self.rng(trial, epsilon, 1)
                noisy = [box.privatize(emb.document(i), epsilon, rng) for i in self.test]
                predicted.append(np.argmax(classifier(np.stack(noisy)), axis=1))
            self.score("truncation", epsilon, self.test, predicted)

    def mdp_documents(self) -> list[int]:
        """The test documents word-level metric DP scores: a seeded subset, because every
        randomised document must be encoded again."""
        count = min(self.config.mdp_documents, len(self.test))
        picked = np.random.default_rng([self.config.seed, 7]).choice(self.test, count, False)
        return sorted(int(i) for i in picked)

    def on_mdp_documents(self, methods: Sequence[str]) -> dict[str, MethodScores]:
        """``methods`` scored again on word-level metric DP's documents only, from the same
        predictions: a paired comparison with that baseline (its 100 documents are a sample
        of the test split, whose macro-F1 can sit a few points from the whole split's)."""
        subset = self.mdp_documents()
        position = {document: n for n, document in enumerate(self.test)}
        rows = np.array([position[i] for i in subset], dtype=np.intp)
        sweep: dict[str, MethodScores] = {}
        for method in methods:
            if method not in self.on_test:
                continue
            sweep[method] = {}
            for key, predicted in self.on_test[method].items():
                values = [macro_f1(self.y[subset], t[rows], self.n_classes) for t in predicted]
                whole = self.eps_sweep[method][key]
                sweep[method][key] = Score.of(values, p=whole.p, variant=whole.variant)
        return sweep

    def word_mdp(self) -> None:
        vectors, words = load_glove(self.settings.cache_dir)
        mdp = WordMetricDP(vectors, words, self.config.mdp_vocabulary)
        scored = self.mdp_documents()
        self.notes.append(
            f"word-level metric DP: {len(scored)} of {len(self.test)} test documents "
            "(re-encoding every randomised document is the slow part), output vocabulary = "
            f"the {self.config.mdp_vocabulary} most frequent GloVe words, words absent from "
            "GloVe randomised from the mean GloVe vector (not kept), GloVe 6B 50-d: no 300-d "
            "GloVe reaches this machine through a package registry"
        )
        classifier = self.bundle.classifier_nonpriv
        assert classifier is not None
        for epsilon in self.config.epsilons:
            predicted = []
            for trial in range(self.config.trials):
                rng = self.rng(trial, epsilon, 2)
                means = []
                for i in scored:
                    sentences = list(self.corpus.documents[i].sentences)
                    randomized = mdp.randomize(sentences, epsilon, rng)
                    means.append(self.encoder.encode(randomized).astype(np.float64).mean(axis=0))
                predicted.append(np.argmax(classifier(np.stack(means)), axis=1))
            self.score("word_mdp", epsilon, scored, predicted)

    def k_sweep(self) -> KSweep:
        """Every method's scores at ``k_epsilon`` per bin of sentences per document."""
        k_of = {i: len(self.corpus.documents[i].sentences) for i in self.test}
        bins = [f"{low}-{high}" if high < 10_000 else f"{low}+" for low, high in K_BINS]
        methods: dict[str, list[Score | None]] = {}
        for method, found in self.predictions.items():
            rows: list[Score | None] = []
            for low, high in K_BINS:
                positions = [n for n, i in enumerate(found.documents) if low <= k_of[i] <= high]
                if len(positions) < 5:
                    rows.append(None)
                    continue
                docs = [found.documents[n] for n in positions]
                values = [
                    macro_f1(self.y[docs], t[positions], self.n_classes) for t in found.trials
                ]
                rows.append(Score.of(values, documents=len(positions)))
            methods[method] = rows
        methods["random_guess"] = [Score.of([self.guess]) for _ in K_BINS]
        return KSweep(bins, methods)
