"""Over real HTTP: at an epsilon whose p table entry is the clipped-mean rule, /privatize's
candidates follow that rule's exact distribution (real encoder, H, gateway, worker batch and
WorkItem on the wire), told apart from Tukey depth's over the same candidates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.accounting import charge_for, epsilon_of_charge
from sentdp.bundle import Bundle
from sentdp.encoders import recode
from service.tenants import Tenant, hash_key
from tests.support import Server, client, draws_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

KEY = "sdp_test_mean_key_0123456789abcdef"
SENTENCES = [
    "Shares in the bank fell sharply on Monday.",
    "The striker scored twice in the second half.",
    "The minister will face questions in parliament.",
]
DOCUMENTS = 16
REQUESTS = 150  # 2,400 draws
ACCEPT = 1e-5  # CSPRNG draws: a right server fails the fit with this probability
REJECT = 1e-12


@pytest.fixture(scope="module")
def mean_server(mean_bundle_tag: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("mean-draws")
    tenant = Tenant(id="t", key_sha256=[hash_key(KEY)], max_epsilon=20, budget=10**6)
    server = draws_server(folder, mean_bundle_tag, [tenant], DOCUMENTS)
    yield server
    server.stop()


def binned(probabilities: np.ndarray, total: int) -> list[np.ndarray]:
    """Candidate groups for a chi-square test: every candidate expected at least 5 times on
    its own, the rest together."""
    order = np.argsort(-probabilities)
    alone = [np.array([i]) for i in order if probabilities[i] * total >= 5]
    rest = order[len(alone) :]
    return [*alone, rest] if probabilities[rest].sum() * total >= 5 else alone


def test_privatize_draws_the_clipped_mean_rule_where_the_p_table_names_it(
    mean_server: Server, mean_bundle_tag: str, bentoml_home: Path, encoder
) -> None:  # type: ignore[no-untyped-def]
    import bentoml

    bundle = Bundle.load(Path(bentoml.models.get(mean_bundle_tag).path))
    choice = bundle.manifest.p_table[-1]
    assert choice.selection == "mean"
    assert choice.radius is not None
    epsilon = choice.epsilon
    variant = bundle.variant(choice.variant)
    run_at = epsilon_of_charge(charge_for(epsilon))
    recoded = recode(variant.recoder, encoder.encode(SENTENCES))
    mean = np.exp(variant.mean_mechanism(choice.radius).log_probs(recoded, run_at))
    depth = np.exp(variant.mechanism().log_probs(recoded, run_at, variant.record.p_max))
    assert np.abs(mean - depth).sum() > 0.3  # the two rules are told apart by these draws

    counts = np.zeros(variant.record.candidates, dtype=np.int64)
    with client(mean_server, KEY) as http:
        for n in range(REQUESTS):
            body = {
                "user": f"u{n}",
                "epsilon": epsilon,
                "documents": [{"sentences": SENTENCES}] * DOCUMENTS,
            }
            response = http.post("/privatize", json=body)
            assert response.status_code == 200, response.text
            for document in response.json()["documents"]:
                assert (document["selection"], document["variant"]) == ("mean", choice.variant)
                assert "p" not in document
                counts[document["candidate"] - variant.record.offset] += 1
        below = http.post(
            "/privatize",
            json={"user": "low", "epsilon": 1.0, "documents": [{"sentences": SENTENCES}]},
        )
    (low,) = below.json()["documents"]
    assert low["selection"] == "depth"
    assert low["p"] == bundle.manifest.choice_for(1.0).p
    total = DOCUMENTS * REQUESTS
    assert counts.sum() == total
    groups = binned(mean, total)
    observed = [counts[g].sum() for g in groups]
    assert chisquare(observed, [mean[g].sum() * total for g in groups]).pvalue > ACCEPT
    other = binned(depth, total)
    observed = [counts[g].sum() for g in other]
    expected = np.array([depth[g].sum() * total for g in other])
    assert chisquare(observed, expected * total / expected.sum()).pvalue < REJECT
