"""The DynamoDB task store's one on-demand table: its keys, indexes and limits.

The table (``table_definition`` gives its ``CreateTable`` arguments; the SAM template declares
the same, with point-in-time recovery on). Billing is on demand (``PAY_PER_REQUEST``). Every
item has the string key ``pk`` (hash) and ``sk`` (range); these names, the index names and their
key attributes are the contract with the template and must stay stable:

==================  ===========  ==============================================================
``pk``              ``sk``       item
==================  ===========  ==============================================================
``campaign``        id           a campaign: ``st`` its state, ``rk`` its recipient key, ``d``
                                 the campaign as JSON
``R#<id>#<rk>``     position     a recipient (position zero-padded to 10 digits)
``T#<task id>``     ``#``        a task: ``v`` its version, ``st`` its state, ``d`` the task as
                                 JSON, ``ca`` its claim time, ``rs`` its reason (when it has
                                 one), and the index keys below
``P#<campaign>``    position     the marker that makes a campaign's position taken once per
                                 step (``<position>#s<step>`` after the first step)
``log``             first id     change-log entries ``first..first+n-1`` (``n``; ``d`` JSON;
                                 ``cs`` the set of their campaigns); ids are zero-padded to 20
``lease``           name         a lease: ``owner``, ``exp``
``counter``         name         a counter (``TaskStore.counter``): ``n`` its value (N)
``suppression``     address      a suppressed address (``SuppressionList``): ``rs`` its reason,
                                 ``task``, ``at``
``SB#<address>``    message key  a transient bounce of the address (``FeedbackStore``): ``at``
``AW#<campaign>``   position     a recipient's return date (``FeedbackStore.set_away``): ``until``
                                 (ISO day), ``at``
``FU#<campaign>``   pos#step     a sent task whose sequence's next step is still to make
                                 (``FollowUpMarks``; the step 2 digits): ``task``, ``at``
``cursor``          mailbox      a feedback mailbox's position: ``uv`` its UIDVALIDITY, ``uid``
``sender``          id           a sender (``SenderStore``): ``em`` its address lower-cased,
                                 ``d`` the sender as JSON (its transport as given)
``senderaddr``      address      the claim that keeps an address (lower-cased) to one sender:
                                 ``sid``
``SL#<sender>``     epoch ms     a booked slot (ms zero-padded to 15): ``task``, ``at``,
                                 ``day``, ``cid``, ``rc``, ``cap``, ``sent`` (BOOL)
``SD#<sender>``     ISO day      a sender's local day: ``planned``, ``sent``, ``total`` (N)
``BK#<task id>``    ``#``        the task's booking: the slot's attributes, ``v`` its version,
                                 ``fr`` old slots still to free (a large move, in JSON)
``ST#<address>``    ``#``        the first sender a recipient was booked on: ``sid``
``webhook``         id           a webhook endpoint: one attribute per field, each its JSON
``WD#<endpoint>``   time#seq     one delivery attempt: ``ev``, ``et``, ``at``, ``n``, ``ms``,
                                 ``sc`` (status), ``er`` (error), ``rd`` (redelivery)
``DL#<letter id>``  ``#``        a dead letter relayed into the change log (its ``dead_letter``
                                 entry written in the same transaction): ``task``, ``at``
==================  ===========  ==============================================================

The sender items need no index: every read of them is a query of one partition's sort-key
range or a get (see :mod:`~sendqueue.adapters.dynamodb.senders`).

A task item also carries ``ga`` (its address's compared form, ``key_of_normalized``), once
sent ``oc`` (its outcome) and, for a step after the first, ``sp`` (its step).

Global secondary indexes, all on task items (projection ALL unless said):

- ``by_campaign``: hash ``gc`` (campaign id, S), range ``gp`` (position, N): a campaign's tasks
  in position order (``list_tasks``).
- ``by_state``: hash ``gs`` (``<campaign>#<state>``, S), range ``gt`` (``<send_at>#<task id>``,
  S): a campaign's tasks in one state by send time (``transition_all``, ``count_tasks``,
  ``has_unfinished_tasks``).
- ``due``: hash ``gd`` (state, S), range ``gt``: due and stale tasks across campaigns.
- ``by_address``: hash ``ga`` (the address's compared form, S), range ``gt``, projection
  KEYS_ONLY: an address's tasks across campaigns, newest first (``FeedbackStore.tasks_for``).

Why an index and not an item per (address, task): DynamoDB keeps an index in step with every
task write by itself, where an extra item would have to join each insert's and each
reschedule's transaction (half as many tasks per transaction). Keys only, because its keys
(``ga``, ``gt``) change only at insert and reschedule: a state change does not rewrite the
index entry, and ``tasks_for`` reads the tasks themselves afterwards (consistently, so their
state is current even while the index lags).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ATTEMPTS",
    "GSI_NAMES",
    "GSI_PROJECTIONS",
    "ITEM_BYTES",
    "LOG_MAX",
    "RETRYABLE",
    "TXN_BYTES",
    "TXN_ITEMS",
    "WRITERS",
    "table_definition",
]

#: The global secondary indexes, by name: (hash key, range key). Stable: the template uses them.
GSI_NAMES: dict[str, tuple[str, str]] = {
    "by_campaign": ("gc", "gp"),
    "by_state": ("gs", "gt"),
    "due": ("gd", "gt"),
    "by_address": ("ga", "gt"),
}
#: Each index's projection (the template declares the same).
GSI_PROJECTIONS: dict[str, str] = {
    "by_campaign": "ALL",
    "by_state": "ALL",
    "due": "ALL",
    "by_address": "KEYS_ONLY",
}
_KEY_TYPES = {
    "pk": "S",
    "sk": "S",
    "gc": "S",
    "gp": "N",
    "gs": "S",
    "gt": "S",
    "gd": "S",
    "ga": "S",
}

#: Items per TransactWriteItems (DynamoDB's limit is 100) and entries per log item.
TXN_ITEMS = 100
LOG_MAX = TXN_ITEMS - 1
#: Bytes per TransactWriteItems (DynamoDB's limit is 4 MB) and per item (400 KB), with room.
TXN_BYTES = 3_500_000
ITEM_BYTES = 380_000
#: Transaction cancellation reasons that a retry (after reading again) resolves.
RETRYABLE = frozenset(
    {
        "None",
        "ConditionalCheckFailed",
        "TransactionConflict",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
    }
)
ATTEMPTS = 200
#: Threads writing recipient batches in parallel (boto3 clients are thread-safe).
WRITERS = 4


def table_definition(name: str) -> dict[str, Any]:
    """``CreateTable`` arguments for the store's table (the SAM template declares the same).

    On-demand billing; point-in-time recovery is a table setting the template turns on (and
    ``create_table`` too, where the endpoint supports it).
    """
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": k, "AttributeType": t} for k, t in _KEY_TYPES.items()
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": index,
                "KeySchema": [
                    {"AttributeName": hash_key, "KeyType": "HASH"},
                    {"AttributeName": range_key, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": GSI_PROJECTIONS[index]},
            }
            for index, (hash_key, range_key) in GSI_NAMES.items()
        ],
    }
