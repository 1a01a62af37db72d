"""The worker's BentoML API definitions (service.worker)."""

from __future__ import annotations

from service.worker import Worker


def test_worker_replies_declare_their_media_type() -> None:
    """An undeclared list reply makes BentoML rebuild its JSON schema on every response to
    find the media type; the worker declares it, so no API of the worker leaves it open."""
    assert set(Worker.apis) == {"privatize", "privatize_unbatched"}
    for name, api in Worker.apis.items():
        assert api.output_spec.media_type == "application/json", name
        assert api.output_spec.mime_type() == "application/json", name
