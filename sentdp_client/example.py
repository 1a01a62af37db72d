"""What a product backend does with sentdp: privatize, label, check the budget, handle 402.

Run against a server: ``python -m sentdp_client.example http://127.0.0.1:3000 <API key>``.
"""

from __future__ import annotations

import sys

from sentdp_client import (
    AuthenticationError,
    BudgetExhaustedError,
    Client,
    Document,
    OutcomeUnknownError,
    SentDPError,
)


def main(url: str, api_key: str) -> None:
    review = (
        "I ordered this dress in a medium. The fabric is soft and the colour is lovely. "
        "It runs a little small, so size up."
    )
    with Client(url, api_key) as sentdp:
        release = sentdp.privatize("user-42", epsilon=3.0, documents=[review])
        document = release.documents[0]
        assert document.embedding is not None
        print(f"embedding of {len(document.embedding)} numbers, {document.k} sentences")
        labelled = sentdp.classify(
            "user-42", epsilon=3.0, documents=[Document(sentences=["Great match.", "We won."])]
        )
        label = labelled.documents[0]
        print(f"label {label.label!r} from {label.label_mechanism}")
        print(f"user-42 has {sentdp.budget('user-42').remaining_epsilon:g} epsilon left")
        try:  # a demo user: spend the rest of its budget to see the refusal
            for _ in range(1000):
                sentdp.privatize("user-42", epsilon=3.0, documents=[review])
        except BudgetExhaustedError as refused:
            print(f"refused: {refused.message} (remaining {refused.remaining})")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m sentdp_client.example URL API_KEY")
    try:
        main(sys.argv[1], sys.argv[2])
    except AuthenticationError as refused:  # often a key file's path instead of the key
        sys.exit(f'{refused} (pass the key itself, e.g. "$(cat .sentdp/demo-api-key)")')
    except OutcomeUnknownError as unknown:  # charged: a retry must reuse the key
        sys.exit(f"{unknown} (charged; retry with Idempotency-Key {unknown.idempotency_key})")
    except SentDPError as failed:  # the server refused, or could not be reached
        sys.exit(str(failed))
