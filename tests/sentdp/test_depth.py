"""The fast Tukey utility equals the brute-force definition exactly, ties included."""

from __future__ import annotations

import numpy as np
import pytest

from sentdp.depth import DepthIndex, TorchDepthIndex, project
from sentdp.errors import InputError
from sentdp.mechanism import DeepCandidate, tukey_utility
from tests.sentdp.reference import brute_force_utility


def random_case(rng: np.random.Generator, m: int, k: int, p: int, d: int, ties: str) -> tuple:
    if ties == "grid":  # integer data on coordinate directions: ties everywhere
        candidates = rng.integers(-2, 3, size=(m, d)).astype(float)
        sentences = rng.integers(-2, 3, size=(k, d)).astype(float)
        directions = np.eye(d)[rng.integers(0, d, size=p)]
        return sentences, candidates, directions
    candidates = rng.standard_normal((m, d))
    sentences = rng.standard_normal((k, d))
    directions = rng.standard_normal((p, d))
    if ties == "shared":  # sentences that are candidates, and repeated sentences
        sentences[: k // 2] = candidates[rng.integers(0, m, size=k // 2)]
        sentences[-1] = sentences[0]
    return sentences, candidates, directions


@pytest.mark.parametrize("ties", ["none", "shared", "grid"])
@pytest.mark.parametrize(
    ("m", "k", "p"), [(1, 1, 1), (7, 2, 3), (50, 5, 10), (300, 31, 17), (64, 130, 4)]
)
def test_tukey_utility_equals_brute_force(m: int, k: int, p: int, ties: str) -> None:
    rng = np.random.default_rng(1000 * m + 10 * k + p)
    for _ in range(5):
        sentences, candidates, directions = random_case(rng, m, k, p, d=6, ties=ties)
        fast = tukey_utility(sentences, candidates, directions)
        assert fast.shape == (m,)
        np.testing.assert_array_equal(fast, brute_force_utility(sentences, candidates, directions))


def test_utilities_lie_on_half_integer_levels_between_minus_k_half_and_zero() -> None:
    rng = np.random.default_rng(3)
    sentences, candidates, directions = random_case(rng, 400, 11, 8, d=5, ties="shared")
    u = tukey_utility(sentences, candidates, directions)
    assert u.min() >= -11 / 2
    assert u.max() <= 0
    assert set(np.unique(u * 2 % 2)) <= {1.0}  # k odd: every utility is a half-integer
    assert len(np.unique(u)) <= 11 // 2 + 1


def test_lowest_depth_over_directions_not_the_highest() -> None:
    # A candidate central on one direction but outside the sentences on another must get the
    # worst utility -k/2 (the paper's text), not 0 (its appendix's max over directions).
    sentences = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    candidates = np.array([[1.5, 10.0], [1.5, 1.5]])
    directions = np.eye(2)
    np.testing.assert_array_equal(tukey_utility(sentences, candidates, directions), [-2.0, 0.0])


def test_batched_documents_with_own_k_and_p_match_single_documents() -> None:
    rng = np.random.default_rng(5)
    candidates = rng.standard_normal((200, 8))
    directions = rng.standard_normal((12, 8))
    mechanism = DeepCandidate(candidates, directions)
    documents = [rng.standard_normal((k, 8)) for k in (1, 2, 9, 40, 3)]
    ps = [1, 12, 5, 7, 12]
    batch = mechanism.utilities_batch(documents, ps)
    for doc, p, utilities in zip(documents, ps, batch, strict=True):
        np.testing.assert_array_equal(utilities, mechanism.utilities(doc, p=p))
        np.testing.assert_array_equal(
            utilities, brute_force_utility(doc, candidates, directions, p)
        )


def test_projection_of_a_row_does_not_depend_on_the_other_rows() -> None:
    rng = np.random.default_rng(6)
    rows = rng.standard_normal((300, 384))
    directions = rng.standard_normal((100, 384))
    together = project(rows, directions)
    for start, count in [(0, 1), (5, 3), (17, 30), (64, 65), (250, 50)]:
        np.testing.assert_array_equal(
            project(rows[start : start + count], directions), together[start : start + count]
        )


def torch_devices() -> list[str]:
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.parametrize("device", torch_devices())
def test_torch_backend_equals_its_own_brute_force(device: str) -> None:
    import torch

    rng = np.random.default_rng(7)
    for ties in ("none", "shared", "grid"):
        sentences, candidates, directions = random_case(rng, 150, 13, 9, d=6, ties=ties)
        index = TorchDepthIndex(candidates, directions, device)
        lengths, ps = [13, 13], [9, 4]
        stacked = np.concatenate([sentences, sentences])
        devs = index.deviations(stacked, lengths, ps)
        projected_s = index.project(sentences).cpu()
        projected_f = index.project(candidates).cpu()
        for p, dev in zip(ps, devs, strict=True):
            h = (projected_s[None, :, :p] >= projected_f[:, None, :p]).sum(dim=1)
            expected = torch.abs(2 * h - 13).amax(dim=1).numpy()
            np.testing.assert_array_equal(dev, expected)


def test_numpy_and_torch_backends_agree_on_generic_data() -> None:
    rng = np.random.default_rng(8)
    sentences, candidates, directions = random_case(rng, 500, 25, 30, d=16, ties="none")
    cpu = DepthIndex(candidates, directions).deviations(sentences, [25], [30])[0]
    torch_cpu = TorchDepthIndex(candidates, directions, "cpu").deviations(sentences, [25], [30])[0]
    np.testing.assert_array_equal(cpu, torch_cpu)


@pytest.mark.parametrize(
    ("sentences", "match"),
    [
        (np.zeros((0, 4)), "at least one sentence"),
        (np.zeros((3, 5)), r"\(k, 4\)"),
        (np.array([[0.0, np.nan, 0.0, 0.0]]), "finite"),
        (np.array([[0.0, np.inf, 0.0, 0.0]]), "finite"),
    ],
)
def test_bad_documents_are_refused_with_a_clear_message(sentences: np.ndarray, match: str) -> None:
    mechanism = DeepCandidate(np.eye(4), np.eye(4))
    with pytest.raises(InputError, match=match):
        mechanism.utilities(sentences)


@pytest.mark.parametrize("p", [0, 5, -1])
def test_p_outside_the_bundle_is_refused(p: int) -> None:
    mechanism = DeepCandidate(np.eye(4), np.eye(4))
    with pytest.raises(InputError, match="p must be between 1 and 4"):
        mechanism.utilities(np.ones((2, 4)), p=p)
