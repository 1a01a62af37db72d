"""Offline training on small real slices: the bundle, its reproducibility, and clear errors."""

from __future__ import annotations

import csv
import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from sentdp.bundle import Bundle
from sentdp.errors import InputError
from sentdp.text import TextLimits
from tests.support import REPO
from training.cli import main as train_main
from training.datasets import REGISTRY, load_user_corpus, stratified_splits
from training.pipeline import TrainConfig, run_training
from training.settings import load_settings
from training.store import load_from_store, save_to_store


@pytest.fixture(scope="module")
def quick_bundle(quick_bundle_tag: str) -> Bundle:
    return load_from_store(quick_bundle_tag)


def test_the_quick_bundle_is_in_the_store_and_loads_back(
    quick_bundle_tag: str, quick_bundle: Bundle
) -> None:
    import bentoml

    assert quick_bundle_tag in {str(m.tag) for m in bentoml.models.list()}
    stored = bentoml.models.get(quick_bundle_tag)
    assert stored.info.metadata["corpus"].startswith("bbc-news")
    assert stored.info.metadata["corpus_sha256"] == quick_bundle.manifest.corpus.sha256
    manifest = quick_bundle.manifest
    assert manifest.corpus.labels == ["business", "entertainment", "politics", "sports", "tech"]
    assert manifest.corpus.is_public
    assert manifest.splitter["name"] == "sentdp-left-context"
    assert [c.epsilon for c in manifest.p_table] == [1.0, 10.0]
    assert {c.variant for c in manifest.p_table} == {"paper"}
    # the paper's recipe stays the paper's rule: no clipped-mean options were even scored
    assert {c.selection for c in manifest.p_table} == {"depth"}
    assert all(key.isdigit() for key in manifest.scores["validation_grid"]["paper"])
    (variant,) = quick_bundle.variants
    assert variant.record.p_max == 20
    m = manifest.candidates
    assert variant.candidates.shape == (m, 384)
    assert len(manifest.extra["candidate_doc_ids"]) == m
    np.testing.assert_allclose(np.linalg.norm(variant.directions, axis=1), 1.0)
    np.testing.assert_allclose(variant.candidate_class_probs.sum(axis=1), 1.0)
    assert (quick_bundle.encoder_dir / "modules.json").is_file()  # self-contained


def test_candidates_are_the_recoded_means_of_their_public_documents(
    quick_bundle: Bundle, encoder
) -> None:
    from sentdp.encoders import recode

    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    by_id = {d.doc_id: d for d in corpus.documents}
    (variant,) = quick_bundle.variants
    for position in (0, len(variant.candidates) - 1):
        document = by_id[quick_bundle.manifest.extra["candidate_doc_ids"][position]]
        assert len(document.sentences) >= 8
        sentences = encoder.encode(list(document.sentences))
        mean = recode(variant.recoder, sentences).mean(axis=0)
        # Training encoded the corpus in large batches; on CPUs whose kernels vary with the
        # batch (about 2e-7 in G) the means then differ slightly from a re-encoding.
        np.testing.assert_allclose(variant.candidates[position], mean, rtol=0, atol=1e-6)


def test_retraining_with_the_same_seed_is_byte_identical(
    quick_bundle_tag: str, quick_bundle: Bundle
) -> None:
    # the quick bundle's config (tests/conftest.py), under another name, in capitals: the
    # store holds tags in lower case, and the run says so in its own words
    config = TrainConfig(dataset="bbc-news", name="SentDP-Test-Again", vote_shapes=("simplex",))
    console = Console(record=True, width=200)
    report = run_training(config.quick(), load_settings(), console)
    assert report.tag.startswith("sentdp-test-again:")
    assert "--out 'SentDP-Test-Again' is saved as 'sentdp-test-again'" in console.export_text()
    assert report.embeddings_from_cache
    (again,) = report.bundle.variants
    (first,) = quick_bundle.variants
    assert again.candidates.tobytes() == first.candidates.tobytes()
    assert again.directions.tobytes() == first.directions.tobytes()
    assert report.bundle.manifest.p_table == quick_bundle.manifest.p_table
    assert report.bundle.manifest.scores == quick_bundle.manifest.scores


def test_a_user_csv_trains_only_when_declared_public(tmp_path: Path) -> None:
    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    rows = [d for d in corpus.documents if d.label == "sports"][:30]
    rows += [d for d in corpus.documents if d.label == "tech"][:30]
    path = tmp_path / "mine.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["body", "topic"])
        for document in rows:
            writer.writerow([" ".join(document.sentences), document.label])
    config = TrainConfig(
        dataset=str(path), text_column="body", label_column="topic", recipe="mixed", label_dims=(2,)
    ).quick()
    with pytest.raises(InputError, match="--corpus-is-public"):
        run_training(config, load_settings())
    report = run_training(dataclasses.replace(config, corpus_is_public=True), load_settings())
    assert report.bundle.labels == ["sports", "tech"]
    # Each variant is followed by its prototypes: 1, 4 and 16 per class.
    names = [v.record.name for v in report.bundle.variants]
    assert names == [
        f"{base}{suffix}"
        for base in ("paper", "label-2d", "vote-2d")
        for suffix in ("", "-k1", "-k4", "-k16")
    ]
    label = report.bundle.variant("label-2d")
    assert label.candidates.shape[1] == 2
    assert label.record.offset == sum(v.record.candidates for v in report.bundle.variants[:4])
    assert report.tag.startswith("sentdp-mine-quick30-mixed:")
    # other recipes also score the clipped-mean rule at each H's radii, and pick per epsilon
    grid = report.bundle.manifest.scores["validation_grid"]
    for name in names:
        assert {"mean q0.5", "mean q0.9"} <= set(grid[name])
    for column, choice in enumerate(report.bundle.manifest.p_table):
        best = max(values[column] for scores in grid.values() for values in scores.values())
        assert choice.validation_macro_f1 == best
    means = [c for c in report.bundle.manifest.p_table if c.selection == "mean"]
    cube = any(vote.shape == "cube" for vote in report.bundle.votes)
    tabled = any(c.vote_table for c in report.bundle.manifest.p_table)
    expected = 8 if tabled else 7 if cube else 6 if means else 5
    assert report.bundle.manifest.format_version == expected
    shapes = report.bundle.manifest.vote_shapes
    assert shapes == ([v.shape for v in report.bundle.votes] if cube else None)


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_user_corpus_errors_say_what_is_wrong(tmp_path: Path) -> None:
    limits = TextLimits()
    good = [{"text": "One here. Two there.", "label": "a"}] * 3
    with pytest.raises(InputError, match="no column 'body'"):
        load_user_corpus(write_jsonl(tmp_path / "a.jsonl", good), "body", "label", True, limits)
    with pytest.raises(InputError, match="holds no documents"):
        load_user_corpus(write_jsonl(tmp_path / "b.jsonl", []), "text", "label", True, limits)
    one_sentence = write_jsonl(tmp_path / "c.jsonl", [{"text": "Only one.", "label": "a"}])
    with pytest.raises(InputError, match="at least 2 sentences"):
        load_user_corpus(one_sentence, "text", "label", True, limits)
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(InputError, match=r"\.csv, \.tsv or \.jsonl"):
        load_user_corpus(tmp_path / "d.txt", "text", "label", True, limits)
    rows = [
        {"text": f"Doc {i} starts. It ends {i}.", "label": "a" if i % 2 else "b"} for i in range(8)
    ]
    corpus = load_user_corpus(
        write_jsonl(tmp_path / "e.jsonl", rows), "text", "label", True, limits
    )
    with pytest.raises(InputError, match="at least 5 documents"):
        stratified_splits(corpus, 0)
    one_label = [{"text": f"Doc {i} starts. It ends {i}.", "label": "a"} for i in range(8)]
    corpus = load_user_corpus(
        write_jsonl(tmp_path / "f.jsonl", one_label), "text", "label", True, limits
    )
    with pytest.raises(InputError, match="at least two labels"):
        stratified_splits(corpus, 0)


def test_a_corpus_without_long_documents_has_no_candidates(tmp_path: Path) -> None:
    rows = [
        {
            "text": f"Short doc {i}. About {'cats' if i % 2 else 'dogs'}.",
            "label": "c" if i % 2 else "d",
        }
        for i in range(40)
    ]
    path = write_jsonl(tmp_path / "short.jsonl", rows)
    config = TrainConfig(dataset=str(path), corpus_is_public=True).quick()
    with pytest.raises(InputError, match="8 or more sentences"):
        run_training(config, load_settings())


def test_a_failed_save_leaves_nothing_in_the_store(quick_bundle: Bundle) -> None:
    import bentoml

    before = {str(m.tag) for m in bentoml.models.list()}
    broken = dataclasses.replace(quick_bundle, encoder_dir=Path("/nonexistent/encoder"))
    with pytest.raises(FileNotFoundError):
        save_to_store(broken, "sentdp-broken", {})
    assert {str(m.tag) for m in bentoml.models.list()} == before


def test_the_cli_reports_errors_with_exit_code_2(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": "A. B.", "label": "a"}])
    result = subprocess.run(
        [sys.executable, "-m", "training.cli", "--dataset", str(path), "--text-column", "body"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "--corpus-is-public" in result.stderr


def test_long_csv_fields_load_and_bad_files_end_in_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv

    from training import datasets

    thread = " ".join(f"Reply number {n} quotes the thread again." for n in range(5000))
    assert len(thread) > 128 * 1024  # over Python's default csv field limit
    path = tmp_path / "long.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows([[thread, "a"], ["Short one. Second.", "b"]])
    corpus = load_user_corpus(path, "text", "label", True, TextLimits(max_sentences=6000))
    assert len(corpus.documents[0].sentences) == 5000
    monkeypatch.setattr(datasets, "CSV_FIELD_LIMIT", 1000)
    with pytest.raises(InputError, match=r"line 2 of .* up to 1,000 characters"):
        load_user_corpus(path, "text", "label", True, TextLimits(max_sentences=6000))
    (tmp_path / "latin.csv").write_bytes(b"text,label\n\xe9t\xe9,a\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_user_corpus(tmp_path / "latin.csv", "text", "label", True, TextLimits())
    (tmp_path / "list.jsonl").write_text('["not", "an", "object"]\n')
    with pytest.raises(InputError, match=r"line 1 of .* not a JSON object"):
        load_user_corpus(tmp_path / "list.jsonl", "text", "label", True, TextLimits())


def test_a_file_without_a_header_row_is_refused_without_printing_its_first_document(
    tmp_path: Path,
) -> None:
    first = "Nu xi beta. " * 400 + "This is about sport."
    path = tmp_path / "noheader.csv"
    path.write_text(f"{first},sport\nAnother one. And more.,tech\n")
    with pytest.raises(InputError, match="has no column 'text'") as refused:
        load_user_corpus(path, "text", "label", True, TextLimits())
    assert "This is about sport" not in str(refused.value)
    assert len(str(refused.value)) < 300


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    """Spreadsheets write a UTF-8 byte order mark: the first column keeps its name."""
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbftext,label\nOne here. Two there.,a\n")
    corpus = load_user_corpus(path, "text", "label", True, TextLimits())
    assert corpus.documents[0].sentences == ("One here.", "Two there.")


def test_cli_errors_are_shown_as_written_and_a_bad_tag_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Brackets in a file name or a CSV column are text, not rich markup (which crashed the
    message), and a model name the store would refuse stops the run before the corpus is
    read, not after training."""
    (tmp_path / "x[").mkdir()
    odd = tmp_path / "x[" / "y] :x:.csv"  # the path holds "[/y]", a closing tag
    odd.write_text("body,label\nA. B.,a\n")
    cases = (
        (["--dataset", str(odd), "--corpus-is-public"], f"{odd} has no column 'text'"),
        (["--dataset", "bbc-news", "--out", "a:b:c"], "--out 'a:b:c' is not a BentoML model tag"),
        (["--dataset", "bbc-news", "--out", "x:latest"], "'latest' names the newest version"),
        (["--dataset", "bbc-news", "--clusters", "0"], "--clusters must be at least 1"),
        (["--dataset", "bbc-news", "--out", " "], "--out is empty"),
        (["--dataset", str(tmp_path / "nosuch.csv"), "--corpus-is-public"], "no such corpus file"),
        (["--dataset", "bbc-news", "--epsilons", "1", "nan"], "--epsilons must be finite"),
    )
    before = signal.getsignal(signal.SIGTERM)  # main sets its own
    try:
        for flags, message in cases:  # in process: any other exception fails the test
            with pytest.raises(SystemExit) as exited:
                train_main(flags)
            assert exited.value.code == 2
            error = capsys.readouterr().err
            assert message in " ".join(error.split()), error
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_int8_bundle_records_and_carries_its_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also: a user corpus with columns of its own is read again by sentdp-eval with them,
    from another folder with --dataset, and a changed file is refused there."""
    from evaluation.experiment import evaluation_corpus

    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    path = tmp_path / "int8.jsonl"
    rows = [d for d in corpus.documents if d.label == "business"][:40]
    rows += [d for d in corpus.documents if d.label == "tech"][:40]
    write_jsonl(path, [{"body": " ".join(d.sentences), "topic": d.label} for d in rows])
    monkeypatch.chdir(tmp_path)
    config = TrainConfig(
        dataset="int8.jsonl",
        corpus_is_public=True,
        encoder_backend="onnx-int8",
        prototypes=(),
        text_column="body",
        label_column="topic",
    ).quick()
    report = run_training(config, load_settings())
    bundle = report.bundle
    assert bundle.encoder_backend == "onnx-int8"
    assert bundle.manifest.encoder["backend"] == "onnx-int8"
    stored = load_from_store(report.tag)
    stored.check_encoder("onnx-int8")
    with pytest.raises(InputError, match="cannot serve with torch"):
        stored.check_encoder("torch")
    monkeypatch.chdir(REPO)  # the relative path no longer reaches it: --dataset does
    with pytest.raises(InputError, match=r"no such corpus file: int8\.jsonl .* with --dataset"):
        evaluation_corpus(stored, load_settings())
    again, splits = evaluation_corpus(stored, load_settings(), str(path))
    assert len(again.documents) == stored.manifest.corpus.documents
    assert again.labels == stored.manifest.corpus.labels
    assert splits.sizes() == stored.manifest.corpus.splits
    with path.open("a") as changed:
        changed.write(json.dumps({"body": "One more. And another.", "topic": "tech"}) + "\n")
    with pytest.raises(InputError, match=r"is not the file .* was trained on"):
        evaluation_corpus(stored, load_settings(), str(path))


def test_one_sentence_documents_are_kept_out_of_the_splits_but_not_lost(tmp_path: Path) -> None:
    """The loader drops documents of fewer than two sentences from every split, and keeps
    them aside (evaluation scores short texts on them): never duplicates, never empty ones."""
    rows = [{"text": f"Doc {i} starts. It ends {i}.", "label": "ab"[i % 2]} for i in range(6)]
    rows += [{"text": "Only one here.", "label": "a"}, {"text": "Only one here.", "label": "a"}]
    rows += [{"text": "Another lone one!", "label": "b"}, {"text": "   ", "label": "b"}]
    path = write_jsonl(tmp_path / "short.jsonl", rows)
    corpus = load_user_corpus(path, "text", "label", True, TextLimits())
    assert len(corpus.documents) == 6
    assert [d.sentences for d in corpus.short] == [("Only one here.",), ("Another lone one!",)]
    assert corpus.removed_short == 3  # the empty text counts as removed, not kept aside
    assert corpus.removed_duplicates == 1


def test_documents_over_the_sentence_limit_are_counted_as_such_not_as_short(
    tmp_path: Path,
) -> None:
    rows = [{"text": f"Doc {i} starts. It ends {i}.", "label": "ab"[i % 2]} for i in range(6)]
    long = " ".join(f"Sentence {j} of a long thread." for j in range(6))
    rows += [{"text": long, "label": "a"}, {"text": long + " One more.", "label": "b"}]
    rows += [{"text": "Only one here.", "label": "a"}]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    corpus = load_user_corpus(path, "text", "label", True, TextLimits(max_sentences=5))
    assert (len(corpus.documents), corpus.removed_over_limit, corpus.removed_short) == (6, 2, 1)
    assert corpus.removed_duplicates == 0
    corpus = load_user_corpus(path, "text", "label", True, TextLimits(max_sentences=7))
    assert (len(corpus.documents), corpus.removed_over_limit, corpus.removed_short) == (8, 0, 1)


def test_a_quote_never_closed_is_named_with_its_line_and_other_slips_are_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "quotes.csv"
    path.write_text('text,label\n"One. Two.",a\n"Three. Four,b\nFive. Six.,a\nSeven. Eight.,b\n')
    with pytest.raises(InputError, match=r"line 3 of .* opens a quoted field that is never"):
        load_user_corpus(path, "text", "label", True, TextLimits())
    for body in (
        'label,text\na,"Best" dress. Ever.\nb,"Open. Never closed\na,X. Y.\n',  # after a slip
        'text,label\nA. B.,a\n\n\n"Three. Four,b\nFive. Six.,a\n',  # after blank lines
    ):
        path.write_text(body)
        with pytest.raises(InputError, match=r"line 3 of .* opens a quoted field|line 5 of"):
            load_user_corpus(path, "text", "label", True, TextLimits())
    path.write_text('text,label\n"Best" dress. Ever.,a\nHe said "hi". Then left.,b\n')
    corpus = load_user_corpus(path, "text", "label", True, TextLimits())  # as before: leniently
    assert [d.sentences for d in corpus.documents] == [
        ("Best dress.", "Ever."),
        ('He said "hi".', "Then left."),
    ]


def test_too_small_classes_are_counted_and_at_most_twenty_named(tmp_path: Path) -> None:
    rows = [{"text": f"Doc {i} starts. It ends {i}.", "label": "ab"[i % 2]} for i in range(20)]
    rows += [
        {"text": f"Lone {i}. Post {i}.", "label": f"class-{i:04d}-" + "x" * 60} for i in range(500)
    ]
    corpus = load_user_corpus(
        write_jsonl(tmp_path / "many.jsonl", rows), "text", "label", True, TextLimits()
    )
    with pytest.raises(InputError) as refused:
        stratified_splits(corpus, 0)
    message = str(refused.value)
    assert "500 of 502 classes have fewer" in message
    assert message.endswith(" and 480 more")
    assert message.count("class-") == 20
    assert len(message) < 2000


def test_jsonl_lines_split_at_newlines_only_and_unreadable_json_is_a_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "odd.jsonl"
    rows = [
        {"text": f"Doc {i}\u2028starts. It\u0085ends {i}.", "label": "ab"[i % 2]} for i in range(6)
    ]
    path.write_text("\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n")
    corpus = load_user_corpus(path, "text", "label", True, TextLimits())
    assert len(corpus.documents) == 6  # U+2028 and U+0085 are inside strings, not line ends
    for bad in ("[" * 100_000, '{"text": "A. B.", "label": ' + "9" * 5000 + "}"):
        path.write_text('{"text": "A. B.", "label": "a"}\n' + bad + "\n")
        with pytest.raises(InputError, match=r"line 2 of .* is not a JSON object sentdp can read"):
            load_user_corpus(path, "text", "label", True, TextLimits())


def test_an_encoder_dir_that_does_not_load_is_the_user_s_mistake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"text": f"Doc {i} starts. It ends {i}.", "label": "ab"[i % 2]} for i in range(12)]
    path = write_jsonl(tmp_path / "small.jsonl", rows)
    broken = tmp_path / "encoder"
    broken.mkdir()
    (broken / "modules.json").write_text("garbage")
    monkeypatch.setenv("SENTDP_ENCODER_DIR", str(broken))
    config = TrainConfig(dataset=str(path), corpus_is_public=True).quick()
    with pytest.raises(InputError, match=r"SENTDP_ENCODER_DIR .* does not load as a sentence"):
        run_training(config, load_settings())


def test_a_column_named_twice_or_a_label_that_is_not_one_value_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.csv"
    path.write_text("text,label,text\nOne here. Two there.,a,Other.\n")
    with pytest.raises(InputError, match=r"header names \['text'\] twice"):
        load_user_corpus(path, "text", "label", True, TextLimits())
    path.write_text("text,label,,\nOne here. Two there.,a,,\n")  # a spreadsheet's blank columns
    assert len(load_user_corpus(path, "text", "label", True, TextLimits()).documents) == 1
    rows = [{"text": "One here. Two there.", "label": ["sport"]}]
    with pytest.raises(InputError, match=r"row 1 of .*: the label is a list"):
        load_user_corpus(
            write_jsonl(tmp_path / "l.jsonl", rows), "text", "label", True, TextLimits()
        )
