"""The BentoML service: :mod:`service.gateway` (HTTP, validation, ledger, idempotency),
:mod:`service.worker` (batched encoding and the mechanism), :mod:`service.ledger` (budget
storage), :mod:`service.guard` (authentication and body limits), :mod:`service.tenants`."""
