"""Over real HTTP: a zCDP tenant's /classify votes follow the epsilon-bounded-range
exponential mechanism and a pure-epsilon tenant's the bundle's own rule, and a calibrated cube
vote is drawn as trained, through the real gateway, worker batch and WorkItem on the wire (the
unit tests use a fake worker)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.accounting import charge_for, epsilon_of_charge
from sentdp.bundle import Bundle
from service.tenants import Tenant, hash_key
from tests.support import Server, client, cube_calibration
from tests.support import draws_server as started_server
from training.vote_calibration import calibrated

pytestmark = [pytest.mark.server, pytest.mark.slow]

KEYS = {"pure": "sdp_test_pure_key_0123456789abcdef", "rho": "sdp_test_rhov_key_0123456789abcdef"}
CANDIDATES = (
    "The striker scored twice in the second half.",
    "Shares in the bank fell sharply on Monday.",
    "The new phone runs the latest software.",
    "The band's album went straight to number one.",
    "The minister will face questions in parliament.",
)
DOCUMENTS = 16
REQUESTS = 250  # 4,000 draws per tenant
# The draws come from the CSPRNG, so a right server fails the fit with probability ACCEPT per
# check; 4,000 draws of distributions 0.23 apart in total variation give rejections near
# p = 1e-40, so REJECT still tells a wrong server apart with a wide margin.
ACCEPT = 1e-5
REJECT = 1e-12


def voted_labels(
    server: Server, tenant: str, sentence: str, epsilon: float, labels: list[str]
) -> np.ndarray:
    """How often each label came back from REQUESTS x DOCUMENTS /classify draws of the
    one-sentence document ``sentence``, each by the vote."""
    counts = dict.fromkeys(labels, 0)
    with client(server, KEYS[tenant]) as http:
        for n in range(REQUESTS):
            body = {
                "user": f"{tenant}-{n}",
                "epsilon": epsilon,
                "documents": [{"sentences": [sentence]}] * DOCUMENTS,
            }
            response = http.post("/classify", json=body)
            assert response.status_code == 200, response.text
            for document in response.json()["documents"]:
                assert document["label_mechanism"] == "sentence-vote"
                counts[document["label"]] += 1
    return np.array([counts[label] for label in labels])


@pytest.fixture(scope="module")
def draws_server(quick_bundle_tag: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("vote-draws")
    common = {"max_epsilon": 10, "budget": 10_000}
    tenants = [
        Tenant(id="pure", key_sha256=[hash_key(KEYS["pure"])], **common),
        Tenant(
            id="rho", key_sha256=[hash_key(KEYS["rho"])], accounting="zcdp", delta=1e-6, **common
        ),
    ]
    server = started_server(folder, quick_bundle_tag, tenants, DOCUMENTS)
    yield server
    server.stop()


def test_each_tenant_s_votes_follow_its_accountant_s_draw(
    draws_server: Server, quick_bundle_tag: str, bentoml_home: Path, encoder
) -> None:  # type: ignore[no-untyped-def]
    import bentoml

    bundle = Bundle.load(Path(bentoml.models.get(quick_bundle_tag).path))
    epsilon = 1.0
    assert bundle.manifest.choice_for(epsilon).label == "vote"
    assert bundle.manifest.vote_by_count  # one sentence: the count rule differs from the EM
    vote = bundle.vote_for(epsilon)
    run_at = epsilon_of_charge(charge_for(epsilon))
    limit = bundle.manifest.choice_for(epsilon).vote_table  # as the gateway sends it

    def exact(sentence: str, bounded: bool) -> np.ndarray:
        embedded = encoder.encode([sentence])
        return np.exp(
            vote.log_probs(
                embedded, run_at, [sentence], bounded_range=bounded, table_sentences=limit
            )
        )

    # the sentence whose two draws differ most (total variation), so 2,000 draws tell them apart
    sentence = max(CANDIDATES, key=lambda s: float(np.abs(exact(s, True) - exact(s, False)).sum()))
    bounded, own = exact(sentence, True), exact(sentence, False)
    assert np.abs(bounded - own).sum() > 0.15
    observed = {
        tenant: voted_labels(draws_server, tenant, sentence, epsilon, bundle.labels)
        for tenant in ("pure", "rho")
    }
    total = DOCUMENTS * REQUESTS
    assert chisquare(observed["rho"], bounded * total).pvalue > ACCEPT
    assert chisquare(observed["rho"], own * total).pvalue < REJECT
    assert chisquare(observed["pure"], own * total).pvalue > ACCEPT
    assert chisquare(observed["pure"], bounded * total).pvalue < REJECT


@pytest.fixture(scope="module")
def cube_server(cube_bundle_tag: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("cube-draws")
    tenant = Tenant(id="pure", key_sha256=[hash_key(KEYS["pure"])], max_epsilon=10, budget=10_000)
    server = started_server(folder, cube_bundle_tag, [tenant], DOCUMENTS)
    yield server
    server.stop()


def test_a_calibrated_cube_vote_is_drawn_as_trained(
    cube_server: Server, cube_bundle_tag: str, quick_bundle_tag: str, bentoml_home: Path, encoder
) -> None:  # type: ignore[no-untyped-def]
    """The server draws the calibrated vote's exact distribution, not the same classifier's
    cube vote without its per-class scales and offsets."""
    import bentoml

    bundle = Bundle.load(Path(bentoml.models.get(cube_bundle_tag).path))
    epsilon = 1.0
    assert bundle.manifest.choice_for(epsilon).label == "vote"
    vote = bundle.vote_for(epsilon)
    assert vote.shape == "cube"
    # The same classifier voting in the cube with the scales but without the offsets.
    quick = Bundle.load(Path(bentoml.models.get(quick_bundle_tag).path)).vote_for(epsilon)
    scale, _ = cube_calibration(quick)
    plain = calibrated(quick, scale, np.zeros(len(bundle.labels)))  # scaled, not shifted
    run_at = epsilon_of_charge(charge_for(epsilon))

    def exact(of, sentence: str) -> np.ndarray:  # type: ignore[no-untyped-def]
        return np.exp(of.log_probs(encoder.encode([sentence]), run_at, [sentence]))

    sentence = max(CANDIDATES, key=lambda s: float(np.abs(exact(vote, s) - exact(plain, s)).sum()))
    served, uncalibrated = exact(vote, sentence), exact(plain, sentence)
    assert np.abs(served - uncalibrated).sum() > 0.15
    observed = voted_labels(cube_server, "pure", sentence, epsilon, bundle.labels)
    total = DOCUMENTS * REQUESTS
    assert chisquare(observed, served * total).pvalue > ACCEPT
    assert chisquare(observed, uncalibrated * total).pvalue < REJECT
