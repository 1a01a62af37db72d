"""The batched worker: encodes sentences and runs DeepCandidate for a whole adaptive batch.

A batch mixes documents of different users, k, epsilon and p. Everything that can fail runs
before any randomness is drawn (encoding, recoding, validation, selection plans), and such a
failure answers ``sampled=False`` for every item, which lets the gateway refund. After the
plans are built, each item's charge id is appended to the optional sample journal, then the
random words are drawn: from that point the charges are final whatever happens.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import bentoml
import numpy as np

from sentdp.mechanism import DeepCandidate
from service import logs
from service.metrics import metric
from service.schemas import WorkItem, WorkResult
from service.settings import boot_settings, load_settings

BOOT = boot_settings()


def _resources() -> dict[str, Any]:
    return {"gpu": BOOT.worker_gpus} if BOOT.worker_gpus else {}


@bentoml.service(
    name="sentdp-worker",
    workers=1,
    resources=_resources(),
    traffic={"timeout": BOOT.worker_max_latency_ms / 1000 * 2},
)
class Worker:
    bundle_model = bentoml.models.BentoModel(BOOT.model)

    def __init__(self) -> None:
        logs.configure()
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        from sentdp.bundle import Bundle
        from sentdp.encoders import SentenceEncoder

        settings = load_settings()
        torch.set_num_threads(settings.worker_threads)
        stored = self.bundle_model
        self.version = str(stored.tag)
        self.bundle = Bundle.load(Path(stored.path))
        self.encoder = SentenceEncoder(
            self.bundle.encoder_dir, settings.device, settings.encode_batch_size
        )
        device = self.encoder.device if self.encoder.device.startswith("cuda") else None
        self.variants = {v.record.name: v for v in self.bundle.variants}
        self.mechanisms = {name: v.mechanism(device=device) for name, v in self.variants.items()}
        self.journal = settings.sample_journal
        self.fault_marker = settings.fault_marker
        self.encoder.encode(["Warm up the encoder."])

    @bentoml.api(
        batchable=True,
        max_batch_size=BOOT.worker_batch_size,
        max_latency_ms=BOOT.worker_max_latency_ms,
    )
    def privatize(self, items: list[WorkItem]) -> list[WorkResult]:
        """Adaptive-batched: items of many requests are merged into one call."""
        return self._run(items)

    @bentoml.api
    def privatize_unbatched(self, items: list[WorkItem]) -> list[WorkResult]:
        """The same work without adaptive batching (one request's items per call)."""
        return self._run(items)

    def _run(self, items: list[WorkItem]) -> list[WorkResult]:
        started = time.perf_counter()
        metric("batch_documents").observe(len(items))
        results = [
            WorkResult(sampled=False, error=f"this worker serves {self.version}, not {i.model}")
            for i in items
        ]
        mine = [
            n
            for n, item in enumerate(items)
            if item.model == self.version and item.variant in self.variants
        ]
        if not mine:
            return results
        try:
            plans = self._plans([items[n] for n in mine])
        except Exception as error:
            for n in mine:
                results[n] = WorkResult(
                    sampled=False, error=f"{type(error).__name__} before sampling"
                )
            return results
        metric("worker_seconds").labels("prepare").observe(time.perf_counter() - started)
        self._journal([items[n] for n in mine])
        chosen = DeepCandidate.draw_plans(plans)
        self._inject_fault([items[n] for n in mine], "after")
        for n, local in zip(mine, chosen, strict=True):
            offset = self.variants[items[n].variant].record.offset
            results[n] = WorkResult(candidate=offset + int(local), sampled=True)
        metric("worker_seconds").labels("total").observe(time.perf_counter() - started)
        return results

    def _plans(self, items: list[WorkItem]) -> list[Any]:
        """Encode once with G, recode and plan each item in its variant: all the work that
        draws no randomness. Plans come back in the order of ``items``."""
        from sentdp.encoders import recode

        self._inject_fault(items, "before")
        sentences = [s for item in items for s in item.sentences]
        metric("batch_sentences").observe(len(sentences))
        encoded = self.encoder.encode(sentences)
        bounds = np.cumsum([0] + [len(item.sentences) for item in items])
        plans: list[Any] = [None] * len(items)
        for name in sorted({item.variant for item in items}):
            members = [n for n, item in enumerate(items) if item.variant == name]
            recoder = self.variants[name].recoder
            documents = [recode(recoder, encoded[bounds[n] : bounds[n + 1]]) for n in members]
            planned = self.mechanisms[name].plan_batch(
                documents, [items[n].epsilon for n in members], [items[n].p for n in members]
            )
            for n, plan in zip(members, planned, strict=True):
                plans[n] = plan
        return plans

    def _inject_fault(self, items: list[WorkItem], stage: str) -> None:
        if self.fault_marker and any(
            i.sentences[0] == f"{self.fault_marker}:{stage}" for i in items
        ):
            raise RuntimeError(f"injected fault {stage} sampling")

    def _journal(self, items: list[WorkItem]) -> None:
        if self.journal is None:
            return
        with self.journal.open("a") as handle:
            handle.write("".join(f"{item.charge_id}\n" for item in items))
            handle.flush()
            os.fsync(handle.fileno())
