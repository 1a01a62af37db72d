"""Hostile input against the live service: no 5xx, and no ledger change on any refusal."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.ledger import open_ledger
from tests.support import METRICS_TOKEN, TENANTS, Server, client

pytestmark = [pytest.mark.server, pytest.mark.slow]

ZERO = TENANTS[3]  # budget 0: every charged request must be refused, so nothing may be charged


def assert_tenant_untouched(server: Server, tenant: str) -> None:
    ledger = open_ledger(server.env["SENTDP_LEDGER_URL"])
    assert ledger.charges(tenant) == []
    assert all(a.spent_micro == 0 for a in ledger.accounts() if a.tenant == tenant)


def test_schemathesis_finds_no_server_error(server: Server, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{server.url}/docs.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "25",
            "--seed",
            "1",
            "--mode",
            "all",
            "--request-timeout",
            "120",
            "--header",
            f"Authorization: Bearer {ZERO.key}",
            "--report",
            "junit,har",
            "--report-dir",
            str(tmp_path),
            "--report-har-path",
            str(tmp_path / "requests.har"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    tested = re.search(r"Tested:\s+(\d+)", result.stdout)
    assert tested is not None
    assert int(tested.group(1)) >= 3, result.stdout[-2000:]  # /privatize, /classify, /budget
    assert_tenant_untouched(server, "zero")
    # No string schemathesis sent (6 characters or more) reaches the server's log.
    sent = generated_strings(json.loads((tmp_path / "requests.har").read_text()))
    assert len(sent) >= 10, "schemathesis sent too few strings to check"
    assert server.log is not None
    log = server.log.read_text(errors="replace")
    # as sent, or as a JSON log line writes it (non-ASCII and quotes escaped)
    leaked = [text for text in sent if text in log or json.dumps(text)[1:-1] in log]
    assert not leaked, leaked[:5]


def generated_strings(har: dict) -> set[str]:
    """Every string value of at least 6 characters (and 3 distinct ones) in the bodies."""
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, str) and len(value) >= 6 and len(set(value)) >= 3:
            found.add(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for entry in har["log"]["entries"]:
        text = (entry["request"].get("postData") or {}).get("text") or ""
        try:
            walk(json.loads(text))
        except ValueError:
            if len(text) >= 6:
                found.add(text)
    return found


UNICODE = [
    "emoji \U0001f600\U0001f389 in a sentence. Another one \U0001f44d\U0001f3fd.",
    "RTL \u200f\u05e9\u05dc\u05d5\u05dd\u200f and Arabic \u0645\u0631\u062d\u0628\u0627. Two.",
    "zero\u200bwidth\u200djoiners and \ufeffBOM. Next.",
    "combining e\u0301\u0301\u0301 marks. Done.",
    "\u0000 null and \u0007 bell control characters. Ok.",
    "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48\u3000\uff54\uff45\uff58\uff54\u3002",
    "a" * 5000 + ". Short.",
]


@pytest.mark.parametrize("text", UNICODE)
def test_unicode_edge_cases_are_answered_without_5xx(server: Server, text: str) -> None:
    with client(server, ZERO.key) as http:
        response = http.post(
            "/privatize", json={"user": "u", "epsilon": 1.0, "documents": [{"text": text}]}
        )
    assert response.status_code in {400, 402, 413}, response.text
    assert_tenant_untouched(server, "zero")


def test_lone_surrogates_and_broken_escapes_are_400(server: Server) -> None:
    bodies = [
        b'{"user": "u", "epsilon": 1, "documents": [{"text": "\\ud800 lone"}]}',
        b'{"user": "u", "epsilon": 1, "documents": [{"text": "bad \\x escape"}]}',
        b'{"user": "\\ud800", "epsilon": 1, "documents": [{"text": "A. B."}]}',
    ]
    with client(server, ZERO.key) as http:
        for body in bodies:
            response = http.post(
                "/privatize", content=body, headers={"Content-Type": "application/json"}
            )
            assert response.status_code in {400, 402}, response.text


def test_ten_thousand_one_word_sentences_are_refused_as_too_large(server: Server) -> None:
    payload = {"user": "u", "epsilon": 1.0, "documents": [{"sentences": ["word"] * 10_000}]}
    with client(server, ZERO.key) as http:
        response = http.post("/privatize", content=json.dumps(payload))
        as_text = http.post(
            "/privatize",
            json={"user": "u", "epsilon": 1.0, "documents": [{"text": "Word. " * 10_000}]},
        )
    assert response.status_code == 413
    assert as_text.status_code == 413
    assert_tenant_untouched(server, "zero")


@pytest.mark.parametrize(
    "epsilon", ["NaN", "Infinity", "-Infinity", "0", "-0.0", "-5", "1e-300", "true", '"2.5"']
)
def test_special_epsilons_are_400(server: Server, epsilon: str) -> None:
    body = f'{{"user": "u", "epsilon": {epsilon}, "documents": [{{"text": "A. B."}}]}}'
    with client(server, ZERO.key) as http:
        response = http.post(
            "/privatize", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400, response.text
    assert_tenant_untouched(server, "zero")


@pytest.mark.parametrize(
    ("user", "status"),
    [
        ("cafe\u0301", 400),  # not NFC: "café" spelled another way would be another account
        ("a\u200bb", 400),  # zero-width space
        ("a\u202eb", 400),  # right-to-left override
        ("a\u2028b", 400),  # line separator
        ("a\x85b", 400),  # C1 control
        ("a\u00a0b", 400),  # no-break space: "a b" to the eye
        (" alice", 400),  # a space at either end
        ("a  b", 400),  # two spaces, which HTML shows as one
        ("\u0301a", 400),  # a combining mark with nothing to combine with
        ("alice\ufe0f", 400),  # a variation selector (default-ignorable)
        ("a\u3164b", 400),  # a Hangul filler, drawn as nothing
        ("caf\u00e9 \u4e2d\u6587 \U0001f600", 402),  # visible NFC text is an id (budget 0)
    ],
)
def test_user_ids_that_render_like_another_are_400(server: Server, user: str, status: int) -> None:
    with client(server, ZERO.key) as http:
        response = http.post(
            "/privatize", json={"user": user, "epsilon": 1.0, "documents": [{"text": "A. B."}]}
        )
        budget = http.post("/budget", json={"user": user})
    assert response.status_code == status, response.text
    assert budget.status_code == (400 if status == 400 else 200)
    assert user not in response.text
    assert_tenant_untouched(server, "zero")


MARKER = "Qxz7-private-sentence-marker"
HOSTILE_BODIES: list[tuple[str, bytes, str]] = [
    # (endpoint, raw body, content type)
    (
        "/privatize",
        json.dumps(
            {
                "user": "u",
                "epsilon": 1.0,
                "documents": [{"text": f"{MARKER} one.", "sentences": [MARKER]}],
            }
        ).encode(),
        "application/json",
    ),
    (
        "/privatize",
        f'{{"user": "u", "epsilon": 1.0, "documents": [{{"text": "{MARKER} cut'.encode(),
        "application/json",
    ),
    (
        "/privatize",
        json.dumps({"user": "u", "epsilon": 1.0, "documents": [{"sentences": MARKER}]}).encode(),
        "application/json",
    ),
    (
        "/privatize",
        json.dumps(
            {"user": "u", "epsilon": 1.0, "documents": [{"sentences": [MARKER, 7]}]}
        ).encode(),
        "application/json",
    ),
    (
        "/privatize",
        json.dumps({"user": "u", "epsilon": MARKER, "documents": [{"text": MARKER}]}).encode(),
        "application/json",
    ),
    (
        "/privatize",
        json.dumps(
            {"user": f"{MARKER}\u0000", "epsilon": 1.0, "documents": [{"text": MARKER}]}
        ).encode(),
        "application/json",
    ),
    (
        "/privatize",
        json.dumps({"user": MARKER * 20, "epsilon": 1.0, "documents": [{"text": MARKER}]}).encode(),
        "application/json",
    ),
    (
        "/privatize",
        json.dumps(
            {"user": "u", "epsilon": 1.0, "seed": MARKER, "documents": [{"text": MARKER}]}
        ).encode(),
        "application/json",
    ),
    (
        "/privatize",
        b'{"user": "u", "epsilon": NaN, "documents": [{"text": "' + MARKER.encode() + b'"}]}',
        "application/json",
    ),
    (
        "/privatize",
        b'{"user": "u", "epsilon": 1, "documents": [{"text": "\xff' + MARKER.encode() + b'"}]}',
        "application/json",
    ),
    (
        "/privatize",
        json.dumps({"user": "u", "epsilon": 1.0, "documents": [{"text": MARKER}]}).encode(),
        "text/plain",
    ),
    (
        "/privatize",
        (
            f'{{"user": "u", "documents": [{{"text": "{MARKER}"}}], "x": '
            + "[" * 40
            + "]" * 40
            + "}"
        ).encode(),
        "application/json",
    ),
    (
        "/classify",
        json.dumps(
            {"user": f"{MARKER}\u0000", "epsilon": 1.0, "documents": [{"text": MARKER}]}
        ).encode(),
        "application/json",
    ),
    ("/classify", json.dumps({"model": MARKER, "candidates": [0]}).encode(), "application/json"),
    ("/classify", json.dumps({"model": "x", "candidates": [MARKER]}).encode(), "application/json"),
    ("/budget", json.dumps({"user": [MARKER]}).encode(), "application/json"),
    ("/budget", json.dumps({"user": f"{MARKER}\u200b"}).encode(), "application/json"),
    # unknown fields whose names are the text (pydantic's loc would echo them)
    (
        "/privatize",
        json.dumps({"user": "u", "epsilon": 1.0, "documents": [{MARKER: "x"}]}).encode(),
        "application/json",
    ),
    (
        "/classify",
        json.dumps(
            {"user": "u", "epsilon": 1.0, MARKER: 1, "documents": [{"text": "A."}]}
        ).encode(),
        "application/json",
    ),
    ("/budget", json.dumps({"user": "u", MARKER: 1}).encode(), "application/json"),
]


def test_unknown_paths_share_one_metrics_label(server: Server) -> None:
    """BentoML labelled its HTTP metrics with the raw path: every made-up path, even
    without a key, grew each process's memory and the metrics folder on disk for good."""
    with client(server, METRICS_TOKEN) as http:
        before = http.get("/metrics").text
        for number in range(40):
            assert http.get(f"/made-up-path-{number}").status_code == 404
        assert http.get("/readyz").status_code == 200
        after = http.get("/metrics").text
    assert "made-up-path" not in after
    labels = set(re.findall(r'endpoint="([^"]*)"', after))
    assert "(other)" in labels
    assert "/readyz" in labels
    assert len(after.splitlines()) - len(before.splitlines()) < 200  # not 20 series a path


def test_the_metrics_folder_is_the_server_users_alone(server: Server) -> None:
    """Its files hold what /metrics gives only with the token; BentoML made it 0755."""
    folder = server.home / "prometheus_multiproc_dir"
    assert any(folder.iterdir())
    assert folder.stat().st_mode & 0o777 == 0o700


def test_no_request_text_reaches_the_log_metrics_or_error_bodies(server: Server) -> None:
    """Bodies that fail parsing or validation, carrying a marker, leave no trace of it."""
    statuses = []
    with client(server, ZERO.key) as http:
        for endpoint, body, content_type in HOSTILE_BODIES:
            response = http.post(
                endpoint,
                content=body,
                headers={"Content-Type": content_type, "Idempotency-Key": f"k-{MARKER}"},
            )
            statuses.append(response.status_code)
            assert response.status_code < 500, (endpoint, body[:80], response.text)
            assert MARKER not in response.text, (endpoint, body[:80], response.text)
    assert set(statuses) <= {400, 402, 404, 413, 415, 422}, statuses
    with client(server, ZERO.key) as http:  # paths no route serves, with and without a key
        for path in (f"/{MARKER}", f"/privatize/{MARKER}", f"/docs.json/{MARKER}"):
            assert http.get(path).status_code == 404
            assert http.post(path, headers={"Authorization": ""}).status_code == 404
    with client(server, METRICS_TOKEN) as http:
        assert MARKER not in http.get("/metrics").text
    assert server.log is not None
    log = server.log.read_text(errors="replace")
    assert "validation error" in log.lower() or "Exception on" in log  # errors were logged
    assert MARKER not in log
    assert_tenant_untouched(server, "zero")
