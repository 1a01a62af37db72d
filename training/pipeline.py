"""The offline pipeline end to end: corpus -> G embeddings -> k-means -> H -> F, V -> classifiers
-> p per epsilon -> a bundle saved as a versioned BentoML model."""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.console import Console

from sentdp.bundle import (
    Bundle,
    BundleManifest,
    CorpusRecord,
    PChoice,
    Variant,
)
from sentdp.encoders import (
    Encoder,
    SentenceEncoder,
    default_encoder_path,
    encoder_files_sha256,
    open_encoder,
    recode,
)
from sentdp.errors import InputError
from sentdp.labels import VOTE_SHAPES, SentenceVote, VoteShape
from sentdp.text import SentenceSplitter, TextLimits
from sentdp.words import TOKENIZER
from training.candidates import choose_candidates
from training.classifiers import train_classifier
from training.console import plain_console
from training.corpora import CorpusSpec, load_corpus
from training.datasets import Corpus, Splits, stratified_splits
from training.embeddings import CorpusEmbeddings, embed_corpus
from training.label_vote import train_vote, with_label_choice
from training.nets import seed_everything
from training.p_selection import (
    DEFAULT_EPSILONS,
    DEFAULT_PS,
    RADIUS_QUANTILES,
    Option,
    choose_p,
    radii_of,
    radius_sentences,
)
from training.prototypes import DEFAULT_PER_CLASS, prototype_variants
from training.settings import TrainingSettings
from training.store import check_new_tag, check_store, save_to_store
from training.variants import (
    TrainingData,
    VariantSpec,
    build_variant,
    default_label_dims,
    specs_for,
)

VERSIONED_PACKAGES = (
    "sentdp",
    "torch",
    "sentence-transformers",
    "transformers",
    "numpy",
    "scikit-learn",
    "bentoml",
    "onnxruntime",
    "tokenizers",
)


@dataclass(frozen=True)
class TrainConfig:
    """What to train; ``sentdp-train`` builds one from its flags."""

    dataset: str
    name: str | None = None
    seed: int = 0
    n_clusters: int = 50
    max_candidates: int = 5000
    p_max: int = 100
    ps: tuple[int, ...] = DEFAULT_PS
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    max_epochs: int = 20
    recipe: str = "paper"
    label_dims: tuple[int, ...] | None = None
    """Sizes of the label-tuned variants (default: 1, 2, 4 for two classes, else 2, 4, 8)."""
    prototypes: tuple[int, ...] = DEFAULT_PER_CLASS
    """Per-class sizes of prototype variants, made for every variant of every recipe but the
    paper's, which stays the reference as published."""
    encoder_backend: str = "torch"
    """How G runs, in training and then in serving: torch, onnx (float32) or onnx-int8."""
    corpus_is_public: bool = False
    text_column: str = "text"
    label_column: str = "label"
    per_class: int | None = None
    limits: TextLimits = field(default_factory=TextLimits)
    vote_by_count: bool = True
    """Draw SentenceVote by the sentence-count rule (:mod:`sentdp.count_calibrated`); False
    draws every vote by permute-and-flip, as bundles before format version 5 do."""
    vote_shapes: tuple[VoteShape, ...] = VOTE_SHAPES
    """The vote shapes validation may choose among per epsilon (:data:`sentdp.labels.VOTE_SHAPES`;
    ``("simplex",)`` trains votes as bundles before format version 7 do)."""
    mean_selection: bool | None = None
    """Let the p table pick the clipped-mean rule (:mod:`sentdp.mean_selection`) where it
    scores better on validation; None: for every recipe but the paper's, which stays the
    reference as published (Tukey depth only)."""
    radius_quantiles: tuple[float, ...] = RADIUS_QUANTILES
    """The mean rule's radii to try: these quantiles of the recoded norms of public training
    sentences."""

    @property
    def uses_mean(self) -> bool:
        return self.recipe != "paper" if self.mean_selection is None else self.mean_selection

    def quick(self) -> TrainConfig:
        """A small, fast variant for tests and smoke runs (same code path, smaller numbers)."""
        return replace(
            self,
            per_class=self.per_class or 30,
            n_clusters=min(self.n_clusters, 8),
            p_max=min(self.p_max, 20),
            ps=(10, 20),
            epsilons=(1.0, 10.0),
            max_epochs=min(self.max_epochs, 4),
            radius_quantiles=(0.5, 0.9),
        )

    def corpus_spec(self) -> CorpusSpec:
        """The corpus part of the config (evaluation rebuilds it from the manifest)."""
        return CorpusSpec(
            dataset=self.dataset,
            seed=self.seed,
            per_class=self.per_class,
            corpus_is_public=self.corpus_is_public,
            text_column=self.text_column,
            label_column=self.label_column,
            limits=self.limits,
        )


@dataclass
class TrainReport:
    tag: str
    bundle: Bundle
    corpus: Corpus
    seconds_total: float
    seconds_encoding: float
    embeddings_from_cache: bool
    scores: dict[str, Any]


def model_name(config: TrainConfig, corpus: Corpus) -> str:
    if config.name:
        return config.name
    suffix = "" if config.recipe == "paper" else f"-{config.recipe}"
    return f"sentdp-{corpus.name}{suffix}"


def library_versions() -> dict[str, str]:
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _opened_encoder(
    config: TrainConfig, settings: TrainingSettings, corpus: Corpus, splits: Splits
) -> Encoder:
    """:func:`_encoder`, with a ``SENTDP_ENCODER_DIR`` that does not load (a broken
    ``modules.json``, a config without a model type) reported as the user's mistake."""
    try:
        return _encoder(config, settings, corpus, splits)
    except InputError:
        raise
    except (ValueError, KeyError) as error:  # not OSError: a full disk is not the directory's
        if settings.encoder_dir is None:  # the packaged encoder: sentdp's own problem
            raise
        why = " ".join(str(error).split())[:300]
        raise InputError(
            f"SENTDP_ENCODER_DIR {settings.encoder_dir} does not load as a sentence-transformers "
            f"model ({type(error).__name__}: {why})"
        ) from None


def _encoder(
    config: TrainConfig, settings: TrainingSettings, corpus: Corpus, splits: Splits
) -> Encoder:
    """G for ``config.encoder_backend``; an ONNX graph is exported (once, cached) first, int8
    calibrated on sentences of the public training split."""
    if config.encoder_backend == "torch":
        return SentenceEncoder(
            settings.encoder_dir,
            settings.device,
            settings.encode_batch_size,
            cpu_linear=settings.cpu_linear,
        )
    from training.onnx_export import exported_encoder

    if settings.device not in (None, "cpu"):
        raise InputError(
            f"the {config.encoder_backend} backend runs on the CPU, not on {settings.device}"
        )
    source = settings.encoder_dir or default_encoder_path()
    calibration: list[str] = []
    if config.encoder_backend == "onnx-int8":
        rng = np.random.default_rng(config.seed)
        train = [corpus.documents[int(i)] for i in rng.permutation(splits.train)]
        calibration = [s for document in train[:200] for s in document.sentences]
    directory = exported_encoder(source, config.encoder_backend, settings.cache_dir, calibration)
    return open_encoder(
        directory,
        config.encoder_backend,
        settings.device,
        settings.encode_batch_size,
        threads=settings.threads,
        onnx_threading=settings.encoder_threading,
    )


def run_training(
    config: TrainConfig,
    settings: TrainingSettings,
    console: Console | None = None,
    commit_guard: AbstractContextManager[None] | None = None,
) -> TrainReport:
    """Train a bundle and save it to the BentoML store; every choice is made on validation.
    ``commit_guard`` is entered around the copy into the store."""
    console = console or plain_console()
    check_store()
    if config.name:
        stored_as = check_new_tag(config.name)
        if stored_as != config.name:
            console.print(f"--out {config.name!r} is saved as {stored_as!r}: tags are lower case")
            config = replace(config, name=stored_as)
    started = time.perf_counter()
    corpus = load_corpus(config.corpus_spec(), settings)
    splits = stratified_splits(corpus, config.seed)
    over_limit = (
        f", {corpus.removed_over_limit} with more than {config.limits.max_sentences} sentences"
        if corpus.removed_over_limit
        else ""
    )
    console.print(
        f"corpus {corpus.name}: {len(corpus.documents)} documents ({corpus.removed_duplicates} "
        f"duplicates{over_limit} and {corpus.removed_short} with < 2 sentences removed), "
        f"splits {splits.sizes()}"
    )
    seed_everything(config.seed, settings.threads)
    encoder = _opened_encoder(config, settings, corpus, splits)
    splitter = SentenceSplitter().describe() | {"sentences_from": corpus.sentences_from}
    embeddings = _embed(corpus, encoder, settings, splitter, console)
    bundle, scores = build_bundle(config, corpus, splits, encoder, embeddings, splitter, console)
    metadata = {
        "corpus": corpus.name,
        "corpus_sha256": corpus.sha256,
        "corpus_is_public": corpus.is_public,
        "split_seed": config.seed,
        "splits": splits.sizes(),
        "candidates": bundle.manifest.candidates,
        "variants": [v.name for v in bundle.manifest.variants],
        "recipe": config.recipe,
        "validation": scores,
        "versions": bundle.manifest.versions,
    }
    tag = save_to_store(bundle, model_name(config, corpus), metadata, commit_guard)
    total = time.perf_counter() - started
    return TrainReport(
        tag, bundle, corpus, total, embeddings.seconds, embeddings.from_cache, scores
    )


def _embed(
    corpus: Corpus,
    encoder: Encoder,
    settings: TrainingSettings,
    splitter: dict[str, str],
    console: Console,
) -> CorpusEmbeddings:
    """Every sentence's G embedding, from the cache when the same corpus was encoded before."""
    embeddings = embed_corpus(corpus, encoder, settings.cache_dir, splitter, console.is_terminal)
    if embeddings.from_cache:
        console.print("sentence embeddings: reused from the cache")
    else:
        rate = len(embeddings.vectors) / max(embeddings.seconds, 1e-9)
        console.print(
            f"sentence embeddings: {len(embeddings.vectors)} sentences in "
            f"{embeddings.seconds:.1f} s ({rate:.0f} sentences/s)"
        )
    return embeddings


def build_bundle(
    config: TrainConfig,
    corpus: Corpus,
    splits: Splits,
    encoder: Encoder,
    embeddings: CorpusEmbeddings,
    splitter: dict[str, str],
    console: Console,
) -> tuple[Bundle, dict[str, Any]]:
    """Every variant of the recipe, C_nonpriv, and the (variant, p) table from cached embeddings.

    The steps run in a fixed order (candidates, C_nonpriv, then each variant) because every
    network draws its initial weights from torch's seeded global generator.
    """
    data = training_data(config, corpus, splits, embeddings)
    c_nonpriv = train_classifier(
        embeddings.means(data.train),
        data.y[data.train],
        embeddings.means(data.validation),
        data.y[data.validation],
        data.n_classes,
        config.seed,
        config.max_epochs,
    )
    specs = specs_for(config.recipe, config.label_dims or default_label_dims(data.n_classes))
    made, variant_scores = train_variants(specs, data, console)
    variants = [v for v, _ in made]
    p_table, grid = choose_ps(made, data, config)
    vote = train_vote(
        data.embeddings,
        data.y,
        data.train,
        data.validation,
        config.epsilons,
        config.seed,
        [document.sentences for document in corpus.documents],
        by_count=config.vote_by_count,
        shapes=config.vote_shapes,
    )
    p_table = with_label_choice(p_table, vote)
    for choice in p_table:  # where the vote gives the label and validation chose a table
        if choice.vote_table:
            console.print(
                f"SentenceVote at ε={choice.epsilon:g}: documents of at most "
                f"{choice.vote_table} sentences drawn from the hard-vote table (expected "
                f"validation macro-F1 {choice.vote_macro_f1:.3f})"
            )
    for index, fit in enumerate(vote.fits):
        runs_at = [e for e, i in vote.index_by_epsilon.items() if i == index]
        words = fit.word_regularisation
        strength = f"C={fit.regularisation:g}"
        if words is not None and fit.fitted_on != "words":
            strength += f", words C={words:g}"
        console.print(
            f"SentenceVote {index}: fitted on {fit.fitted_on}, {strength}, "
            f"temperature {fit.temperature:g}, {fit.vote.shape} votes, "
            + ("" if fit.calibrated_at is None else f"calibrated at ε={fit.calibrated_at:g}, ")
            + f"runs at ε={'/'.join(runs_at) or '-'}; "
            "expected validation macro-F1 "
            + ", ".join(f"ε={e} {f:.3f}" for e, f in fit.validation_macro_f1.items())
        )
    scores: dict[str, Any] = {
        "validation_macro_f1": {
            "nonprivate": c_nonpriv.validation_macro_f1,
            "deepcandidate": {f"{c.epsilon:g}": c.validation_macro_f1 for c in p_table},
        },
        "choice_by_epsilon": {f"{c.epsilon:g}": c.describe() for c in p_table},
        "label_by_epsilon": {f"{c.epsilon:g}": c.label for c in p_table},
        "vote": vote.validation_macro_f1,
        "votes": [
            {**fit.describe(), "validation_macro_f1": fit.validation_macro_f1} for fit in vote.fits
        ],
        "vote_by_epsilon": vote.index_by_epsilon,
        "vote_table_by_epsilon": vote.table_by_epsilon,
        "variants": variant_scores,
        "validation_grid": grid,
    }
    manifest = bundle_manifest(
        config, corpus, splits, encoder, splitter, data, variants, p_table, scores, vote.votes
    )
    bundle = Bundle(
        manifest=manifest,
        variants=tuple(variants),
        classifier_nonpriv=c_nonpriv.classifier,
        encoder_dir=encoder.path,
        votes=vote.votes,
    )
    return bundle, scores


def bundle_format_version(
    variants: Sequence[Variant], p_table: Sequence[PChoice], votes: Sequence[SentenceVote] = ()
) -> int:
    """The lowest format version whose readers run this bundle as it was trained."""
    needs = [
        (8, any(choice.vote_table for choice in p_table)),
        (7, any(vote.shape != "simplex" for vote in votes)),
        (6, any(choice.selection != "depth" for choice in p_table)),
        (5, any(vote.by_count for vote in votes)),
        (4, any(vote.reads_words for vote in votes)),
        (3, any(choice.vote_index for choice in p_table)),
        (2, any(v.record.recoder_from for v in variants)),
    ]
    return max((version for version, needed in needs if needed), default=1)


def training_data(
    config: TrainConfig, corpus: Corpus, splits: Splits, embeddings: CorpusEmbeddings
) -> TrainingData:
    """What every variant trains on: labels, splits, the shared candidate documents."""
    label_index = {label: i for i, label in enumerate(corpus.labels)}
    y = np.array([label_index[d.label] for d in corpus.documents], dtype=np.int64)
    return TrainingData(
        embeddings=embeddings,
        y=y,
        train=list(splits.train),
        validation=list(splits.validation),
        n_classes=len(corpus.labels),
        seed=config.seed,
        max_epochs=config.max_epochs,
        n_clusters=config.n_clusters,
        candidate_docs=choose_candidates(
            embeddings, list(splits.train), config.max_candidates, config.seed
        ),
        p_max=config.p_max,
        prototypes=() if config.recipe == "paper" else config.prototypes,
    )


def train_variants(
    specs: list[VariantSpec], data: TrainingData, console: Console
) -> tuple[list[tuple[Variant, VariantSpec]], dict[str, Any]]:
    """Each variant in turn, then its prototype variants, every one's candidates placed after
    the previous ones' in F. Each comes with the spec it was made from."""
    variants: list[tuple[Variant, VariantSpec]] = []
    scores: dict[str, Any] = {}
    offset = 0
    classes = data.y[data.candidate_docs]
    for spec in specs:
        variant, trained = build_variant(spec, data, offset, console)
        offset += variant.record.candidates
        made = prototype_variants(variant, classes, data.prototypes, offset, data.seed)
        offset += sum(p.record.candidates for p in made)
        variants.extend((v, spec) for v in [variant, *made])
        scores[spec.name] = trained
    return variants, scores


def choose_ps(
    variants: list[tuple[Variant, VariantSpec]], data: TrainingData, config: TrainConfig
) -> tuple[list[PChoice], dict[str, dict[str, list[float]]]]:
    """The (variant, rule) of best expected validation macro-F1 for every epsilon of the
    grid. Validation documents are recoded once per H (prototype variants share their
    base's), and so are the public training sentences whose norms give the mean rule's
    radii."""
    recoded: dict[str, list[npt.NDArray[np.float64]]] = {}
    radii: dict[str, dict[str, float]] = {}
    public = radius_sentences(data.embeddings, data.train, data.seed) if config.uses_mean else None
    options = []
    for v, spec in variants:
        owner = v.record.recoder_from or v.record.name
        if owner not in recoded:
            recoded[owner] = [
                recode(v.recoder, data.embeddings.document(i)) for i in data.validation
            ]
            if public is not None:
                radii[owner] = radii_of(recode(v.recoder, public), config.radius_quantiles)
        options.append(
            Option(
                variant=v.record.name,
                mechanism=v.mechanism(),
                documents=recoded[owner],
                candidate_labels=v.candidate_labels(),
                ps=spec.ps(config.ps),
                means={
                    name: v.mean_mechanism(radius) for name, radius in radii.get(owner, {}).items()
                },
            )
        )
    truth = list(data.y[data.validation])
    return choose_p(options, truth, data.n_classes, config.epsilons)


def bundle_manifest(
    config: TrainConfig,
    corpus: Corpus,
    splits: Splits,
    encoder: Encoder,
    splitter: dict[str, str],
    data: TrainingData,
    variants: list[Variant],
    p_table: list[PChoice],
    scores: dict[str, Any],
    votes: Sequence[SentenceVote] = (),
) -> BundleManifest:
    """Everything needed to load, audit and reproduce the bundle."""
    return BundleManifest(
        format_version=bundle_format_version(variants, p_table, votes),
        vote_words=TOKENIZER if any(vote.reads_words for vote in votes) else None,
        vote_by_count=any(vote.by_count for vote in votes),
        vote_shapes=[v.shape for v in votes] if any(v.shape != "simplex" for v in votes) else None,
        name=model_name(config, corpus),
        recipe=config.recipe,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        corpus=CorpusRecord(
            name=corpus.name,
            sha256=corpus.sha256,
            source=corpus.source,
            is_public=corpus.is_public,
            documents=len(corpus.documents),
            split_seed=config.seed,
            splits=splits.sizes(),
            labels=corpus.labels,
        ),
        encoder=encoder.describe() | {"files_sha256": encoder_files_sha256(encoder.path)},
        splitter=splitter,
        variants=[v.record for v in variants],
        p_table=p_table,
        scores=scores,
        versions=library_versions(),
        extra={
            "dataset": config.dataset,
            "text_column": config.text_column,
            "label_column": config.label_column,
            "per_class": config.per_class,
            "candidate_doc_ids": [corpus.documents[i].doc_id for i in data.candidate_docs],
            "text_limits": {
                "max_sentences": config.limits.max_sentences,
                "max_sentence_chars": config.limits.max_sentence_chars,
            },
        },
    )
