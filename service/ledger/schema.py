"""The ledger's tables and how an older database is brought up to date.

Compatibility promise (``sentdp_meta.schema_version``): columns are never removed and never
change meaning; new columns are nullable or have defaults, so an older sentdp keeps working
on a newer database. Version 5 added the bytes of each stored reply
(``sentdp_idempotency.response_bytes``) and their sum per tenant
(``sentdp_stored_replies``), kept in the transactions that store and delete replies, so one
tenant's stored replies can be bounded (replies an older sentdp stores are not counted).
Version 4 added when each account's automatic period ends (``period_ends``, Unix seconds): a
period runs to the end of the window it opened in, so a tenant that changes ``period_days``
renews nobody early (``period_window``, the window's index under the period length of the
time, is still written for older replicas, and read for accounts from before version 4).
Version 3 added per-document and zCDP accounting: an account's spend in its accountant's
units (``spend_units``, filled from ``spent_micro`` for older rows), which accountant kept
it, its automatic period, each charge's units and document id, and the per-document spends
(``sentdp_documents``). Version 2 added ``sentdp_idempotency.status`` (the stored response's
HTTP status) and ``sentdp_idempotency.request_id`` (the request that owns the key), an index
for purging expired idempotency rows, and moved the body-HMAC secret out of the database.
"""

from __future__ import annotations

SCHEMA_VERSION = 5


def create_tables(autoincrement: str) -> list[str]:
    """``CREATE TABLE IF NOT EXISTS`` statements of the current schema."""
    return [
        "CREATE TABLE IF NOT EXISTS sentdp_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS sentdp_accounts (
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            spent_micro BIGINT NOT NULL DEFAULT 0,
            documents BIGINT NOT NULL DEFAULT 0,
            period INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (tenant, user_id))""",
        f"""CREATE TABLE IF NOT EXISTS sentdp_charges (
            id {autoincrement},
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            period INTEGER NOT NULL,
            micro BIGINT NOT NULL,
            state TEXT NOT NULL,
            request_id TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            settled_at DOUBLE PRECISION)""",
        """CREATE TABLE IF NOT EXISTS sentdp_documents (
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            period INTEGER NOT NULL,
            document_id TEXT NOT NULL,
            spend_units BIGINT NOT NULL,
            PRIMARY KEY (tenant, user_id, period, document_id))""",
        """CREATE TABLE IF NOT EXISTS sentdp_idempotency (
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            key TEXT NOT NULL,
            body_hmac TEXT NOT NULL,
            state TEXT NOT NULL,
            response TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (tenant, user_id, key))""",
        """CREATE TABLE IF NOT EXISTS sentdp_stored_replies (
            tenant TEXT PRIMARY KEY,
            bytes BIGINT NOT NULL DEFAULT 0)""",
    ]


ADDED_COLUMNS = [
    ("sentdp_idempotency", "status", "INTEGER"),
    ("sentdp_idempotency", "request_id", "TEXT"),
    ("sentdp_accounts", "spend_units", "BIGINT"),
    ("sentdp_accounts", "accountant", "TEXT"),
    ("sentdp_accounts", "period_window", "BIGINT"),
    ("sentdp_charges", "units", "BIGINT"),
    ("sentdp_charges", "document_id", "TEXT"),
    ("sentdp_accounts", "period_ends", "BIGINT"),
    ("sentdp_idempotency", "response_bytes", "BIGINT"),
]
"""Columns added after version 1: (table, column, type); all nullable."""

UPGRADES = [
    # Version 3: every account before it was kept sequentially in pure epsilon.
    "UPDATE sentdp_accounts SET spend_units = spent_micro WHERE spend_units IS NULL",
    "UPDATE sentdp_charges SET units = micro WHERE units IS NULL",
]
"""Idempotent statements that fill added columns of older rows."""

STORED_REPLIES_COUNTED_SINCE = 5
"""The schema version from which stored replies are counted: a ledger upgraded from an
earlier one is counted once, from its rows."""

RECOUNT_STORED_REPLIES = [
    "DELETE FROM sentdp_stored_replies",
    "INSERT INTO sentdp_stored_replies (tenant, bytes) "
    "SELECT tenant, SUM(COALESCE(response_bytes, 0)) FROM sentdp_idempotency GROUP BY tenant",
]
"""Every tenant's stored-reply bytes counted again from the rows (when a ledger is upgraded
to schema 5, and by ``sentdp-admin recount-replies``): an older sentdp that purged or took
over counted rows never lowered the count."""

INDEXES = [
    "CREATE INDEX IF NOT EXISTS sentdp_idempotency_created ON sentdp_idempotency (created_at)",
]

RECORD_VERSION = (
    "INSERT INTO sentdp_meta (key, value) VALUES ('schema_version', :v) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value "
    "WHERE CAST(sentdp_meta.value AS INTEGER) < CAST(excluded.value AS INTEGER)"
)
