"""sentdp-audit's command line: a deployment that refuses or cannot be reached ends the audit
with a message and exit status 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from rich.console import Console

from evaluation.audit import UnexpectedAnswerError, http_sampler, tenant_accounting
from evaluation.audit_cli import _http_errors, parse_args
from evaluation.audit_cli import main as audit_main
from evaluation.audit_stats import fit_pvalue
from evaluation.cli import main as eval_main
from sentdp.errors import InputError
from tests.support import json_server


@pytest.mark.parametrize(
    "url",
    [
        "http://auditor:Pa55word@127.0.0.1:9/sentdp?token=Secret#x",
        "auditor:Pa55word@127.0.0.1:9",  # no scheme: a parser takes "auditor" for one
        "http://auditor:Pa55/word@127.0.0.1:9",  # a raw "/" ends a parser's user-info early
        "http://auditor:Pa55#word@127.0.0.1:9",
        "http://auditor:Pa55?word@127.0.0.1:9",
    ],
)
def test_a_password_in_the_url_is_never_shown(url: str) -> None:
    console = Console(record=True, width=300)
    with pytest.raises(SystemExit) as exited, _http_errors(console, url, "/budget"):
        tenant_accounting(url, "sdp_no_key")
    assert exited.value.code == 2
    shown = console.export_text()
    assert shown.startswith("sentdp-audit: ")
    assert "Pa55" not in shown
    assert "word" not in shown
    assert "auditor" not in shown


def test_an_unreachable_deployment_is_a_message_and_status_2() -> None:
    console = Console(record=True, width=200)
    url = "http://auditor:Pa55word@127.0.0.1:9/sentdp?token=Secret#x"
    with pytest.raises(SystemExit) as exited, _http_errors(console, url, "/budget"):
        tenant_accounting(url, "sdp_no_key")  # nothing listens on port 9
    assert exited.value.code == 2
    shown = console.export_text()
    assert "sentdp-audit: cannot reach http://127.0.0.1:9/sentdp:" in shown
    assert "Pa55word" not in shown
    assert "Secret" not in shown


def test_a_refusal_names_what_was_refused() -> None:
    console = Console(record=True, width=200)
    request = httpx.Request("POST", "http://x/budget")
    body = {"error": {"code": "unauthorized", "message": "unknown key"}}
    refused = httpx.Response(401, json=body, request=request)
    with pytest.raises(SystemExit) as exited, _http_errors(console, "http://x", "/budget"):
        refused.raise_for_status()
    assert exited.value.code == 2
    assert "refused /budget: HTTP 401 unauthorized: unknown key" in console.export_text()


def test_answers_that_are_not_sentdp_s_stop_the_audit_instead_of_passing_it() -> None:
    """An audit scores the samples it was sent back: a deployment answering no documents (or
    an accountant sentdp does not have) must end it, not leave it with nothing to flag."""
    posts: list[str] = []

    def not_sentdp(path: str) -> tuple[int, object]:
        posts.append(path)
        return 200, {"accounting": "rdp"} if path == "/budget" else {"documents": []}

    with json_server(not_sentdp) as url:
        with pytest.raises(UnexpectedAnswerError, match="accountant 'rdp'"):
            tenant_accounting(url, "sdp_key")
        sample = http_sampler(url, "sdp_key", batch=4, concurrency=1)
        with pytest.raises(UnexpectedAnswerError, match="answered 0 documents for the 3"):
            sample(["One sentence.", "Another one."], 1.0, 3)
        posts.clear()  # the requests not yet sent when the answer came are cancelled
        one_by_one = http_sampler(url, "sdp_key", batch=1, concurrency=1)
        with pytest.raises(UnexpectedAnswerError):
            one_by_one(["One sentence.", "Another one."], 1.0, 50)
        assert len(posts) <= 2


def test_garbled_answers_end_the_audit_with_a_message() -> None:
    """A body that is not what its headers say, JSON nested past the recursion limit, or
    candidates that are not indices (a negative one would count as a real candidate)."""
    answers = iter(
        [
            (200, b"not gzip", {"Content-Encoding": "gzip"}),
            (200, b"[" * 100_000),
            (200, {"documents": [{"candidate": -1}]}),
            (200, {"documents": [{"candidate": 2.0}]}),
            (200, {"documents": [{"candidate": True}]}),
            (503, {}, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}),
            (200, {"documents": [{"candidate": 3}]}),
        ]
    )
    with json_server(lambda path: next(answers)) as url:
        console = Console(record=True, width=200)
        with pytest.raises(SystemExit), _http_errors(console, url, "/budget"):
            tenant_accounting(url, "sdp_key")
        assert "the answer to /budget could not be decoded" in console.export_text()
        with pytest.raises(UnexpectedAnswerError, match="without an accountant"):
            tenant_accounting(url, "sdp_key")
        sample = http_sampler(url, "sdp_key", batch=1, concurrency=1)
        for _ in range(3):
            with pytest.raises(UnexpectedAnswerError, match="without a sample per document"):
                sample(["One sentence.", "Another one."], 1.0, 1)
        assert sample(["One sentence.", "Another one."], 1.0, 1) == [3]  # retried after 1 s
    long_label = "http://" + "a" * 64 + ".example:9"  # a host label over 63 characters
    with pytest.raises(InputError, match="the --url's host name is not a valid one"):
        tenant_accounting(long_label, "sdp_key")
    assert fit_pvalue([-1, -2, -3, -4] * 25, [0.25] * 4) == 0.0
    assert fit_pvalue([0, 1, 2, 3] * 25, [0.25] * 4) == 1.0


def test_a_key_file_must_hold_one_key_and_is_never_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for content in (b"sdp_first\nsdp_second\n", b"sdp_a\x01b", b"\n", b"sdp_\xc3\xa9", b"sdp_\xff"):
        key_file = tmp_path / "key.txt"
        key_file.write_bytes(content)
        with pytest.raises(SystemExit) as exited:
            parse_args(["--url", "http://x", "--key-file", str(key_file), "--model", "m"])
        assert exited.value.code == 2
        error = capsys.readouterr().err
        assert "must hold one API key on one line" in error
        assert "sdp_" not in error.replace(str(tmp_path), "")


def test_a_key_file_an_editor_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_bytes(b"\xef\xbb\xbfsdp_key\n")
    args = parse_args(["--url", "http://x", "--key-file", str(key_file), "--model", "m"])
    assert args.key == "sdp_key"


def test_an_unknown_model_or_a_bad_setting_is_a_message_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: any exception other than the exit fails the test."""
    key_file = tmp_path / "key.txt"
    key_file.write_text("sdp_key\n")
    audit = ["--url", "http://127.0.0.1:9", "--key-file", str(key_file), "--model"]
    for main, flags in ((audit_main, audit), (eval_main, ["--model"])):
        with pytest.raises(SystemExit) as exited:
            main([*flags, "no-such-model"])
        assert exited.value.code == 2
        assert "no model 'no-such-model' in the BentoML store" in capsys.readouterr().err
    monkeypatch.setenv("SENTDP_THREADS", "0")
    with pytest.raises(SystemExit) as exited:
        audit_main([*audit, "m"])
    assert exited.value.code == 2
    assert "a SENTDP_* setting is not valid: SENTDP_THREADS: Input should be greater" in " ".join(
        capsys.readouterr().err.split()
    )
