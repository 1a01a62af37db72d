"""sentdp's Python client: ``Client(url, api_key).privatize(user, epsilon, documents)``.

Depends on httpx only, so a product backend can use it without the service's packages.
"""

from sentdp_client.client import (
    AuthenticationError,
    Budget,
    BudgetExhaustedError,
    Client,
    Document,
    InvalidRequestError,
    OutcomeUnknownError,
    PrivateDocument,
    Release,
    SentDPError,
    UnavailableError,
)

__all__ = [
    "AuthenticationError",
    "Budget",
    "BudgetExhaustedError",
    "Client",
    "Document",
    "InvalidRequestError",
    "OutcomeUnknownError",
    "PrivateDocument",
    "Release",
    "SentDPError",
    "UnavailableError",
]
