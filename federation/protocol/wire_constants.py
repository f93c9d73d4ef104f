"""The wire format's vocabulary: message types, flag bits, modes, the ranges of the numbers a packet carries, and
the error every refused packet raises.

A leaf beneath the encoder (federation.protocol.wire) and the decoder
(federation.protocol.wire_decode): both speak these names, and the rest of
the protocol imports them from `wire` as before.
"""

from __future__ import annotations

PROTOCOL_VERSION = 5
"""5: acknowledgements (`ta`, `tk`) carry `reach`, the subscribing brokers that have the publication, and a `tm`
of mode 3 repairs one publication for one broker the origin's custody waits for (docs/protocol.md rule 7f);
4: topic cores' claims and mesh memberships are announced when they change and kept by digests (`td`, `tr`,
`tz`, docs/protocol.md rule 5a), not refreshed; 3: runs of QoS 1/2 publications (`tq`) and their acknowledgements
(`tk`), rule 7e; 2: `tm` carries `prev` (rule 7d). Nodes of different versions refuse each other's packets
(`version`), so their link never comes up: a version 3 node would expire every claim a version 4 node made, as
nothing refreshes it"""

HELLO = "hl"
HELLO_BACK = "hb"
FEDERATE = "fd"
RECONSIDER = "rc"
CORE_ANNOUNCEMENT = "ca"
TOPIC_CORE = "tc"
RECONSIDER_TOPIC_CORE = "rt"
TOPIC_SUBSCRIBE = "ts"
TOPIC_MESSAGE = "tm"
TOPOLOGY_UPDATE = "tu"
DATABASE_DIGEST = "dd"
DATABASE_SUMMARY = "ds"
DATABASE_REQUEST = "dr"
TOPIC_ACK = "ta"
RECEIVER_BUSY = "rb"
TOPIC_BATCH = "tb"
SHARED_GROUPS = "sg"
RETAINED_DIGEST = "rd"
RETAINED_SUMMARY = "rs"
RETAINED_REQUEST = "rr"
RETAINED_VALUES = "rv"
TOPIC_RELIABLE_BATCH = "tq"
TOPIC_ACKS = "tk"
TOPIC_DIGEST = "td"
TOPIC_REQUEST = "tr"
TOPIC_SUBSCRIPTIONS = "tz"

MESSAGE_TYPES = (HELLO, HELLO_BACK, FEDERATE, RECONSIDER, CORE_ANNOUNCEMENT, TOPIC_CORE,
                 RECONSIDER_TOPIC_CORE, TOPIC_SUBSCRIBE, TOPIC_MESSAGE, TOPOLOGY_UPDATE,
                 DATABASE_DIGEST, DATABASE_SUMMARY, DATABASE_REQUEST, TOPIC_ACK, RECEIVER_BUSY, TOPIC_BATCH,
                 SHARED_GROUPS, RETAINED_DIGEST, RETAINED_SUMMARY, RETAINED_REQUEST, RETAINED_VALUES,
                 TOPIC_RELIABLE_BATCH, TOPIC_ACKS, TOPIC_DIGEST, TOPIC_REQUEST, TOPIC_SUBSCRIPTIONS)
DATA_TYPES = frozenset((TOPIC_MESSAGE, TOPIC_BATCH, TOPIC_RELIABLE_BATCH))
"""the packets that carry publications (data traffic); every other type is control traffic"""

DIGEST_BUCKETS = 16   # dd, rd: bucket hashes per digest; td: children per bucket

# The topic sets a `td` or `tr` names (rule 5a).
SET_CLAIMS = 0        # the live topic cores' claims (every node of a component holds the same)
SET_MEMBERSHIPS = 1   # the sender's memberships as a child, toward the receiver (the sender is their authority)
SET_RECORDED = 2      # the receiver's memberships as the sender, its parent, records them (`td` only)
MAX_TOPIC_DEPTH = 15  # td, tr, tz: nibbles in a bucket's path

# Flag bits.
FLAG_LEAVING = 1      # fd: the origin is shutting down cleanly
FLAG_WITHDRAWN = 1    # tc/rt: the core withdraws (no subscribers left anywhere)
FLAG_OWNER = 2        # tc: not a claim: `core` announces that it owns the subtree `filter` (docs/modes.md)
FLAG_PRUNE = 1        # ts: the sender leaves the mesh
FLAG_STANDBY = 2      # ts: a standby parent: keep the sender as a child, send it no publications (rule 6)

MODE_TOWARD_CORE = 0  # tm: still climbing toward the topic core
MODE_IN_MESH = 1      # tm: spreading through the mesh
MODE_TO_MEMBER = 2    # tm: on its way to the member broker `target` of the shared group `filter` (rule 9)
MODE_REPAIR = 3       # tm: a repair on its way to the broker `target`, its `filter` `$repair/<host>/<port>/F` (rule 7f)
MAX_REACH = 4096      # ta, tk: addresses in `reach` at most

# The ranges of the numbers a packet carries (docs/protocol.md, "Ranges"). A number outside its range is refused
# at decode (`out_of_range`), before it touches any state: a node must never adopt a number it cannot go past,
# such as an epoch of 2^64-1 naming itself, which it would jump past into what msgpack cannot encode.
MAX_U64 = 2**64 - 1   # ids (vid), `tc.rank`, digest buckets (hashes)
MAX_EPOCH = 2**40 - 1
"""node epochs (sender, records, `ca`, `tc`, publication ids, `tm.prev`): 0 to this, about 1.1 × 10^12 (unix seconds
reach it in the year 36,812); below 2^64 / 10^6, so the envelope epoch made of it never saturates"""
EPOCHS_FOR_RESTARTS = 2**20
"""the top of the epoch range only restarts reach: a node jumps past a newer life of itself only up to
MAX_EPOCH - EPOCHS_FOR_RESTARTS (`MAX_JUMP_EPOCH`), so its own restarts always find a next epoch"""
MAX_JUMP_EPOCH = MAX_EPOCH - EPOCHS_FOR_RESTARTS
MAX_SEQ = 2**63 - 1
"""sequence numbers (records, hellos, publications, `ca`, `tc`, summaries): 0 to this; a node's own counters
stay below it (it jumps to its next epoch rather than take a seq it cannot count past)"""
MAX_TIME = 2.0**40
"""times (`hl.sent_at`, `hb.echo_sent_at`, `hb.replied_at`): finite seconds, 0 to this"""
MAX_COUNT = 2**32 - 1  # dd.count, rd.count: records in a table, topics in a retained store
MAX_DISTANCE = 65535
"""hop distances (records, `ca`, `tc`): 0 to this; a node adding its hop saturates there (`further`)"""
MAX_HOLD = 3600.0     # rb: a longer hold is no pacing but an error (a receiver cuts it further)
MAX_TEXT = 65535


class DecodeError(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def further(distance: int) -> int:
    """A distance one hop further, within its range (a record that travelled 65,535 hops stays there)."""
    return distance + 1 if distance < MAX_DISTANCE else MAX_DISTANCE
