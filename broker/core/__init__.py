"""The sans-IO core: exchanges, queues, bindings, routing, deliveries, confirms, leases.

No trio, no sockets, no files: commands in (method calls), effects out
(:meth:`Broker.take_effects`). The one thing it reads is the log, through a function the
IO layer hands it (``Broker.read_log``): the bodies of paged-out messages. See :mod:`broker.core.broker` for the theory of
operation.
"""

from .broker import (
    BUILTIN_EXCHANGES,
    DELIVERY_OVERHEAD_BYTES,
    REST_CHANNEL,
    Broker,
    PublishResult,
)
from .browsing import MAX_BROWSE
from .config import CoreConfig
from .constants import QUEUE_DELETED, delivery_cost
from .consumertags import ConsumerTagInUse
from .coordstate import MISSED_POLICIES, LockGranted, LockWaitEnded, TickFired
from .deadletter import MAX_REDRIVE
from .delays import MAX_DELAY_S, check_delay
from .directreply import (
    REPLY_TO,
    is_reply,
    reply_node,
    reply_secret,
)
from .effects import (
    AppendRecords,
    Confirm,
    ConsumerActive,
    ConsumerCancelled,
    DeadLetterDropped,
    DeadLetterHeld,
    Deliver,
    DeliveryExpired,
    Effect,
    LogReadFailed,
    MessageLost,
    QueueAutoDeleted,
    QueueReady,
    Return,
)
from .entities import ChannelState, Consumer, Delivery, Exchange, Queue
from .errors import (
    AccessRefused,
    ChannelError,
    ErrorReply,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    ResourceLocked,
    Unavailable,
)
from .fieldtables import TAGGED_TYPES, is_tagged, tagged_value_error
from .heldletters import DeadLetterRoutes
from .locks import (
    MAX_LOCK_TTL_S,
    MAX_LOCK_WAIT_S,
    MIN_LOCK_TTL_S,
    LockBusy,
    NotLockHolder,
    check_lock_ttl,
    check_lock_wait,
    check_owner,
)
from .message import (
    MAX_EXPIRATION_MS,
    MAX_JSON_DEPTH,
    MAX_JSON_ITEMS,
    PROPERTY_NAMES,
    Entry,
    StoredMessage,
    check_json_value,
    check_properties,
)
from .names import SERVER_NAMED_PREFIX, check_name, check_routing_key
from .records import (
    RecordType,
    decode_counts,
    decode_enqueue,
    decode_move,
    decode_seqs,
    peek_enqueue,
    ref_lsns,
)
from .routing import EXCHANGE_TYPES, headers_match, topic_matches
from .schedules import LIVE_GRACE_S, MAX_MISSED
from .timing import TIMING_FIELDS, Timing, iso_utc, parse_timing
from .userstore import (
    ADMINISTRATOR,
    PERMISSIONS,
    Token,
    User,
    UserStore,
    check_username,
)
from .views import QUEUE_COUNTERS, BrokerViews

__all__ = [
    "Broker",
    "BrokerViews",
    "QUEUE_COUNTERS",
    "CoreConfig",
    "DELIVERY_OVERHEAD_BYTES",
    "delivery_cost",
    "REST_CHANNEL",
    "BUILTIN_EXCHANGES",
    "PublishResult",
    "Effect",
    "AppendRecords",
    "Confirm",
    "ConsumerCancelled",
    "Deliver",
    "DeliveryExpired",
    "MessageLost",
    "LogReadFailed",
    "DeadLetterDropped",
    "DeadLetterHeld",
    "DeadLetterRoutes",
    "ConsumerActive",
    "MAX_DELAY_S",
    "MAX_BROWSE",
    "MAX_REDRIVE",
    "check_delay",
    "QueueAutoDeleted",
    "QueueReady",
    "Return",
    "ChannelState",
    "Consumer",
    "Delivery",
    "Exchange",
    "Queue",
    "ErrorReply",
    "AccessRefused",
    "ChannelError",
    "ConsumerTagInUse",
    "InvalidArgument",
    "NotFound",
    "PayloadTooLarge",
    "PreconditionFailed",
    "ResourceLocked",
    "Unavailable",
    "Entry",
    "StoredMessage",
    "PROPERTY_NAMES",
    "check_properties",
    "check_json_value",
    "is_tagged",
    "tagged_value_error",
    "TAGGED_TYPES",
    "MAX_EXPIRATION_MS",
    "MAX_JSON_DEPTH",
    "MAX_JSON_ITEMS",
    "SERVER_NAMED_PREFIX",
    "QUEUE_DELETED",
    "REPLY_TO",
    "is_reply",
    "reply_node",
    "reply_secret",
    "check_name",
    "check_routing_key",
    "RecordType",
    "ref_lsns",
    "decode_counts",
    "decode_enqueue",
    "peek_enqueue",
    "decode_move",
    "decode_seqs",
    "EXCHANGE_TYPES",
    "headers_match",
    "topic_matches",
    "ADMINISTRATOR",
    "PERMISSIONS",
    "Token",
    "User",
    "UserStore",
    "check_username",
    "LockGranted",
    "LockWaitEnded",
    "LockBusy",
    "NotLockHolder",
    "MIN_LOCK_TTL_S",
    "MAX_LOCK_TTL_S",
    "MAX_LOCK_WAIT_S",
    "check_owner",
    "check_lock_ttl",
    "check_lock_wait",
    "MISSED_POLICIES",
    "TickFired",
    "LIVE_GRACE_S",
    "MAX_MISSED",
    "TIMING_FIELDS",
    "iso_utc",
    "parse_timing",
    "Timing",
]
