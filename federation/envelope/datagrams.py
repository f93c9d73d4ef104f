"""The datagram envelope: framing, authentication, replay protection, encryption, batching, fragmentation.

Theory of operation: the node speaks in protocol packets (federation.protocol.wire);
the envelope sits between those packets and the UDP socket, sans-I/O like
the node (bytes and time in, bytes out). Outbound, `send(packet, to)` queues
the node's packets; `datagrams_to_send(now)` turns each destination's queue
into as few datagrams as fit `max_datagram` bytes: several small packets are
batched into one datagram, a packet too big for one datagram is split into
fragments. Every datagram gets a header naming the sender (its announced
address), the sender's *envelope epoch* (strictly greater at each restart),
a sequence number (+1 per datagram) and the *receiver epoch* (the
destination's envelope epoch as last learned from its own datagrams, 0
before that), and then, depending on the mode:

- `open` (no key): nothing more. Anyone who can send UDP to a wrapper can
  inject anything; meant for a lab, and the daemon says so loudly.
- `mac` (a federation key): a 16-byte keyed BLAKE2b tag over the whole
  datagram. A receiver with the key drops anything whose tag does not verify.
- `aead` (a key and `encryption: chacha20-poly1305`): the items are
  encrypted with ChaCha20-Poly1305 under a key derived per (sender, epoch);
  the header is authenticated as associated data.

Inbound, `receive_datagram` checks in order: the frame is well formed, its
kind matches our configuration (a keyed wrapper refuses open frames, an
unkeyed one cannot check keyed frames), the key id is one of ours, the tag
verifies, the (sender, epoch, sequence) is new (federation.envelope.replay), and the
receiver epoch is ours: only this life of ours is ever accepted, so nothing
captured before a restart is, though the replay windows start empty (what
the header teaches, the sender's epoch, is learned even from a datagram
refused for that); then it parses the items and reassembles fragments
(federation.envelope.reassembly). Each
refusal is counted by reason and reported as a `packet_dropped` event (at
most EVENT_BURST per reason per second, the rest counted in `suppressed`:
a flood of forgeries must not become a flood of log lines). Nothing a peer
sends makes it raise.

Bulk transfers: a packet above `bulk_threshold` (a large publication) is
not fragmented as above, where one lost datagram loses it, but handed to
federation.envelope.transfer: data and acknowledgement items in datagrams
sealed like any other, a window from the receiver, retransmission of the
lost fragments, bounded memory with fair shares. `transfer_timer` says
when it needs `handle_timer`, unlike reassembly's timer, on time.

Keys: the configured list signs with its first key and accepts all of them,
so a key is rotated without downtime (add the new key second everywhere,
then first everywhere, then remove the old one). Each key is identified on
the wire by a 4-byte id derived from it, so a receiver picks the key at
once and tells an unknown key from a forgery. The exact format is in
docs/protocol.md ("Envelope"), the threat model in docs/security.md.
"""

from __future__ import annotations

import hmac
import math
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from federation.envelope.config import ENCRYPTION_CHACHA, ENCRYPTION_NONE, EnvelopeConfig, EnvelopeConfigError
from federation.envelope.keys import TAG_SIZE, key_table, nonce
from federation.envelope.reassembly import Reassembler
from federation.envelope.replay import FirstContact, PeerEpochs, SenderTable
from federation.envelope.transfer import (
    DATA_ITEM,
    ITEM_ACK,
    ITEM_DATA,
    TRANSFER_REASONS,
    TransferConfig,
    TransferDrop,
    Transfers,
    parse_ack,
)
from federation.protocol import events, wire
from federation.protocol.types import Address, Event

if TYPE_CHECKING:
    pass

MAGIC = 0xFE
ENVELOPE_VERSION = 2
KIND_OPEN = 0
KIND_MAC = 1
KIND_AEAD = 2
MODES = {KIND_OPEN: "open", KIND_MAC: "mac", KIND_AEAD: "aead"}

HEADER = struct.Struct(">BBBIQQQB")
"""magic, version, kind, key id, epoch, sequence, receiver epoch, sender length; then the sender (UTF-8)"""
MAX_EPOCH = (wire.MAX_EPOCH + 1) * 1_000_000 - 1
"""envelope epochs are 1 to this (the microseconds of the node's epoch range: `envelope_epoch` never passes it);
a receiver epoch of 0 means: not known yet. A header naming more is refused (`envelope_malformed`)"""
ITEM_PACKET = 1
ITEM_FRAGMENT = 2
ITEM_EPOCH = 5
"""an epoch announcement: the kind byte alone. It carries nothing but the header it is in, which teaches the
receiver our epoch: the answer to a datagram refused for naming another epoch of ours (`receiver_epoch`)"""
ANNOUNCE_GAP = 1.0
"""seconds: at most one epoch announcement per address in this time"""
PACKET_ITEM = struct.Struct(">BH")
"""item kind 1, packet length; then the packet"""
FRAGMENT_ITEM = struct.Struct(">BIHHIH")
"""item kind 2, message id, index, count, total length, fragment length; then the fragment"""
MAX_SENDER = 255

EVENT_BURST = 10
"""`packet_dropped` events per drop reason per second; further drops are only counted"""

# Drop reasons (counted in `drops`, written in `packet_dropped` events).
NOT_ENVELOPE = "not_envelope"
ENVELOPE_VERSION_MISMATCH = "envelope_version"
ENVELOPE_MALFORMED = "envelope_malformed"
UNAUTHENTICATED = "unauthenticated"
NO_KEY = "no_key"
UNKNOWN_KEY = "unknown_key"
BAD_MAC = "bad_mac"
RECEIVER_EPOCH = "receiver_epoch"
TOO_LARGE_TO_SEND = "too_large_to_send"
DATAGRAM_REASONS = (NOT_ENVELOPE, ENVELOPE_VERSION_MISMATCH, ENVELOPE_MALFORMED, UNAUTHENTICATED, NO_KEY,
                    UNKNOWN_KEY, BAD_MAC, "stale_epoch", "replayed", "too_old", RECEIVER_EPOCH)
"""reasons that refuse a whole received datagram (each received datagram is accepted or gets one of these)"""
MESSAGE_REASONS = ("fragment_invalid", "reassembly_timeout", "reassembly_evicted", *TRANSFER_REASONS)
"""reasons that give up a fragmented packet or a bulk transfer (counted once per packet)"""
DROP_REASONS = (*DATAGRAM_REASONS, *MESSAGE_REASONS, TOO_LARGE_TO_SEND)


class Envelope:
    """One wrapper's envelope: `send` + `datagrams_to_send` outbound, `receive_datagram` inbound."""

    def __init__(self, sender: Address, epoch: int, config: EnvelopeConfig | None = None,
                 drop_sink: Callable[[str], None] | None = None) -> None:
        """`sender`: our announced address; `epoch`: see `envelope_epoch`; `drop_sink(reason)` is called
        for every drop too (the daemon passes `Node.drop`, so drops show with the node's)."""
        config = config if config is not None else EnvelopeConfig()
        config.validate()
        self.config = config
        self.address = sender
        self.sender = str(sender).encode("utf-8")
        if not 0 < len(self.sender) <= MAX_SENDER:
            raise EnvelopeConfigError(f"sender address {sender} is longer than {MAX_SENDER} bytes")
        if not 0 < epoch <= MAX_EPOCH:
            raise EnvelopeConfigError(f"epoch must be 1 to {MAX_EPOCH} (0 means unknown on the wire), got {epoch}")
        self.epoch = epoch
        self.keys, self._keys_by_id = key_table(config.keys)
        if not self.keys:
            self.kind = KIND_OPEN
        else:
            self.kind = KIND_AEAD if config.encryption == ENCRYPTION_CHACHA else KIND_MAC
        self.mode = MODES[self.kind]
        self._signing = self.keys[0] if self.keys else None
        self._cipher = self._signing.cipher(self.sender, epoch) if self._signing and self.kind == KIND_AEAD else None
        overhead = HEADER.size + len(self.sender) + (TAG_SIZE if self.kind != KIND_OPEN else 0)
        self.capacity = config.max_datagram - overhead
        """bytes of items one datagram carries"""
        self.fragment_size = self.capacity - FRAGMENT_ITEM.size
        if self.fragment_size < 64:
            raise EnvelopeConfigError(f"max_datagram {config.max_datagram} leaves no room for fragments")
        if math.ceil(config.max_fragmented / self.fragment_size) > 0xFFFF:
            raise EnvelopeConfigError(f"max_packet {config.max_packet} needs more than 65535 fragments of "
                                      f"{self.fragment_size} bytes; lower it or raise max_datagram")
        self.seq = 0
        self.message_id = 0
        self.senders = SenderTable(config.max_senders, config.replay_window)
        self.peers = PeerEpochs(config.max_senders)
        self.first_contact = FirstContact(config.max_senders, config.resend_window)
        self._announced: dict[Address, float] = {}
        """address -> when we last announced our epoch to it (at most max_senders, the oldest forgotten)"""
        self._announce: dict[Address, None] = {}
        """addresses to announce our epoch to in the next datagrams_to_send"""
        self.reassembler = Reassembler(config.max_fragmented, config.reassembly_memory, config.reassembly_timeout)
        self.transfers = Transfers(TransferConfig(config.max_packet, config.transfer_memory, config.receive_window,
                                                  config.transfer_timeout),
                                   self.capacity - DATA_ITEM.size) if config.bulk_threshold else None
        self._bulk_above = max(config.bulk_threshold, self.capacity - DATA_ITEM.size)
        """bytes: a packet above it goes as a bulk transfer (at least two fragments of one)"""
        self.counters: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()
        self._drop_sink = drop_sink
        self._queue: dict[Address, list[bytes]] = {}
        self._events: list[Event] = []
        self._event_slots: dict[str, list[float]] = {}  # reason -> [window start, emitted, suppressed]

    # ------------------------------------------------------------ outbound

    def send(self, packet: bytes, to: Address, now: float = 0.0) -> None:
        """Queue one protocol packet for `to`; refused (counted) if above max_packet."""
        if len(packet) > self.config.max_packet:
            self._drop(TOO_LARGE_TO_SEND, f"{len(packet)} bytes to {to} > max_packet {self.config.max_packet}",
                       self.address, len(packet), now)
            return
        if self.transfers is not None and len(packet) > self._bulk_above:
            self._transfer_drop(self.transfers.offer(packet, to, now), now)
            return
        queue = self._queue.get(to)
        if queue is None:
            self._queue[to] = [packet]
        else:
            queue.append(packet)

    def datagrams_to_send(self, now: float = 0.0) -> list[tuple[bytes, Address]]:
        """Every queued packet, batched and fragmented into sealed datagrams, in order per destination."""
        out: list[tuple[bytes, Address]] = []
        queue, self._queue = self._queue, {}
        for to, packets in queue.items():
            if not self.peers.stamp(to, self.senders):
                self.first_contact.keep(to, packets, now)
            self._frame(packets, to, out)
        if self.transfers is not None:
            self._transfer_datagrams(self.transfers, out, now)
        announce, self._announce = self._announce, {}
        for to in announce:
            if to not in queue:  # any datagram teaches our epoch; one that carries nothing else, if need be
                out.append((self._seal([bytes([ITEM_EPOCH])], 1, self.peers.stamp(to, self.senders)), to))
                self.counters["epoch_announcements_sent"] += 1
        return out

    def set_peer_epoch(self, to: Address, epoch: int) -> None:
        """Stamp `epoch` as the receiver epoch of what is sent to `to` until `to` is heard from. The daemon never
        needs it (the peer's own datagrams teach it); for tools and tests that play a peer without listening."""
        if not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be 0 to {MAX_EPOCH}, got {epoch}")
        self.peers.set(to, epoch)

    def _transfer_datagrams(self, transfers: Transfers, out: list[tuple[bytes, Address]], now: float) -> None:
        """Bulk transfers' acknowledgements (batched per destination) and the fragments their windows allow."""
        acks: dict[Address, list[bytes]] = {}
        for to, item in transfers.acks_to_send():
            acks.setdefault(to, []).append(item)
        for to, items in acks.items():
            batch: list[bytes] = []
            used = 0
            for item in items:
                if batch and used + len(item) > self.capacity:
                    out.append((self._seal(batch, len(batch), self.peers.stamp(to, self.senders)), to))
                    batch, used = [], 0
                batch.append(item)
                used += len(item)
            out.append((self._seal(batch, len(batch), self.peers.stamp(to, self.senders)), to))
        for to, header, piece in transfers.data_to_send(now):
            out.append((self._seal([header, piece], 1, self.peers.stamp(to, self.senders)), to))

    def set_receive_window(self, size: int) -> None:
        """Bytes of the socket's receive buffer bulk transfers may fill (the daemon: half of what the kernel
        gave, the other half for everything else)."""
        if self.transfers is not None and size > 0:
            self.transfers.config = replace(self.transfers.config, receive_window=size)

    def _frame(self, packets: list[bytes], to: Address, out: list[tuple[bytes, Address]]) -> None:
        stamp = self.peers.stamp(to, self.senders)
        capacity = self.capacity
        items: list[bytes] = []
        used = 0
        count = 0
        for packet in packets:
            need = PACKET_ITEM.size + len(packet)
            if need <= capacity:
                if used + need > capacity:
                    out.append((self._seal(items, count, stamp), to))
                    items, used, count = [], 0, 0
                items.append(PACKET_ITEM.pack(ITEM_PACKET, len(packet)))
                items.append(packet)
                used += need
                count += 1
                continue
            if items:
                out.append((self._seal(items, count, stamp), to))
            self.message_id = (self.message_id + 1) & 0xFFFFFFFF
            size = self.fragment_size
            fragments = math.ceil(len(packet) / size)
            for index in range(fragments):
                piece = packet[index * size:(index + 1) * size]
                items = [FRAGMENT_ITEM.pack(ITEM_FRAGMENT, self.message_id, index, fragments, len(packet), len(piece)),
                         piece]
                used = FRAGMENT_ITEM.size + len(piece)
                count = 1
                if index + 1 < fragments:
                    out.append((self._seal(items, count, stamp), to))
            self.counters["fragments_sent"] += fragments
            self.counters["packets_fragmented"] += 1
        if items:
            out.append((self._seal(items, count, stamp), to))
        self.counters["packets_sent"] += len(packets)

    def seal_body(self, body: bytes, to: Address | None = None) -> bytes:
        """Seal an already-built item body as the next datagram for `to` (None: receiver epoch 0); for tests and
        fuzzers that play a key holder."""
        return self._seal([body], 1, 0 if to is None else self.peers.stamp(to, self.senders))

    def _seal(self, items: list[bytes], count: int, receiver_epoch: int) -> bytes:
        self.seq += 1
        key_id = self._signing.key_id if self._signing is not None else 0
        header = HEADER.pack(MAGIC, ENVELOPE_VERSION, self.kind, key_id, self.epoch, self.seq, receiver_epoch,
                             len(self.sender)) + self.sender
        body = b"".join(items)
        if self.kind == KIND_OPEN:
            datagram = header + body
        elif self.kind == KIND_MAC:
            assert self._signing is not None
            signed = header + body
            datagram = signed + self._signing.mac(signed)
        else:
            assert self._cipher is not None
            datagram = header + self._cipher.encrypt(nonce(self.seq), body, header)
        self.counters["datagrams_sent"] += 1
        self.counters["bytes_sent"] += len(datagram)
        if count > 1:
            self.counters["datagrams_batched"] += 1
        return datagram

    # ------------------------------------------------------------ inbound

    def receive_datagram(self, data: bytes, source: Address, now: float) -> list[bytes]:
        """The protocol packets a datagram carries (after reassembly), or [] with the drop counted."""
        size = len(data)
        self.counters["datagrams_received"] += 1
        self.counters["bytes_received"] += size
        if size < HEADER.size + 1 or data[0] != MAGIC:
            hint = ("an unframed protocol packet: the sender runs a wrapper without the envelope; upgrade it"
                    if size and 0x90 <= data[0] <= 0x9F else f"{size} bytes, first byte {data[:1].hex() or '-'}")
            return self._drop(NOT_ENVELOPE, hint, source, size, now)
        _, version, kind, key_id, epoch, seq, receiver_epoch, sender_size = HEADER.unpack_from(data)
        if version != ENVELOPE_VERSION:
            return self._drop(ENVELOPE_VERSION_MISMATCH, f"envelope version {version}, this wrapper speaks "
                                                         f"{ENVELOPE_VERSION}", source, size, now)
        if not (0 < epoch <= MAX_EPOCH and seq and receiver_epoch <= MAX_EPOCH):
            return self._drop(ENVELOPE_MALFORMED, f"epoch {epoch}, seq {seq}, receiver epoch {receiver_epoch}: "
                                                  f"out of range (epochs 1 to {MAX_EPOCH}, seq from 1)",
                              source, size, now)
        body_start = HEADER.size + sender_size
        tag_size = 0 if kind == KIND_OPEN else TAG_SIZE
        if kind not in MODES or sender_size == 0 or body_start + tag_size >= size:
            return self._drop(ENVELOPE_MALFORMED, f"kind {kind}, sender of {sender_size} bytes, {size} bytes",
                              source, size, now)
        sender_bytes = data[HEADER.size:body_start]
        try:
            sender = sender_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return self._drop(ENVELOPE_MALFORMED, "sender is not UTF-8", source, size, now)
        cipher: Any = None
        if kind == KIND_OPEN:
            if self.keys:
                return self._drop(UNAUTHENTICATED, f"an open (unsigned) frame from {sender}; this wrapper "
                                                   f"requires the federation key", source, size, now)
            body = data[body_start:]
        else:
            if not self.keys:
                return self._drop(NO_KEY, f"a {MODES[kind]} frame from {sender}; this wrapper has no federation "
                                          f"key to check it (give it --key-file)", source, size, now)
            key = self._keys_by_id.get(key_id)
            if key is None:
                return self._drop(UNKNOWN_KEY, f"key id {key_id:08x} from {sender} is none of ours "
                                               f"({', '.join(self.key_ids())})", source, size, now)
            if kind == KIND_MAC:
                if not hmac.compare_digest(key.mac(data[:-TAG_SIZE]), data[-TAG_SIZE:]):
                    return self._drop(BAD_MAC, f"claims to be {sender}", source, size, now)
                body = data[body_start:-TAG_SIZE]
            else:
                state = self.senders.get(sender)
                if state is not None and state.cipher_epoch == epoch and state.cipher_key_id == key_id:
                    cipher = state.cipher
                else:
                    cipher = key.cipher(sender_bytes, epoch)
                from cryptography.exceptions import InvalidTag  # loaded with the cipher (see `cipher`)

                try:
                    body = cipher.decrypt(nonce(seq), data[body_start:], data[:body_start])
                except InvalidTag:
                    return self._drop(BAD_MAC, f"claims to be {sender}", source, size, now)
        refused = self.senders.check(sender, epoch, seq)
        if refused is not None:
            return self._drop(refused, f"{sender} epoch {epoch} seq {seq}", source, size, now)
        evictions = self.senders.evictions
        state = self.senders.commit(sender, epoch, seq)
        if self.senders.evictions != evictions:
            self.counters["senders_evicted"] += 1
        if kind == KIND_AEAD and state.cipher_epoch != epoch:
            state.cipher, state.cipher_epoch, state.cipher_key_id = cipher, epoch, key_id
        anchored = receiver_epoch == self.epoch
        self.peers.heard(source, sender, epoch, anchored)
        if source in self.first_contact:
            self._resend_first_contact(source, now)
        if not anchored:
            self._announce_to(source, now)
            return self._drop(RECEIVER_EPOCH, f"{sender} epoch {epoch} seq {seq} names receiver epoch "
                                              f"{receiver_epoch}, ours is {self.epoch} (sent before we started, "
                                              f"or before it heard us)", source, size, now)
        return self._open_items(body, sender, epoch, source, size, now)

    def _announce_to(self, to: Address, now: float) -> None:
        """Answer a datagram refused for naming another epoch of ours with one that names its sender's and teaches
        ours: a peer that only answers (a dynamic neighbour waiting for our hello, or one we restarted under) would
        otherwise never learn it. At most one per ANNOUNCE_GAP per address: a flood of replays makes a trickle."""
        announced = self._announced
        last = announced.get(to)
        if last is not None and 0 <= now - last < ANNOUNCE_GAP:
            return
        announced.pop(to, None)
        announced[to] = now
        if len(announced) > self.config.max_senders:
            del announced[next(iter(announced))]
        self._announce[to] = None

    def _resend_first_contact(self, to: Address, now: float) -> None:
        """`to` just taught its epoch: what went there stamped 0 (refused) goes again, before what is queued."""
        if not self.peers.stamp(to, self.senders):
            return
        packets = self.first_contact.release(to, now)
        if packets:
            self.counters["packets_resent"] += len(packets)
            self._queue[to] = packets + self._queue.get(to, [])

    def _open_items(self, body: bytes, sender: str, epoch: int, source: Address, size: int,
                    now: float) -> list[bytes]:
        """Parse every item first (a malformed frame delivers nothing), then deliver in order."""
        items: list[tuple[Any, ...]] = []
        position, end = 0, len(body)
        while position < end:
            kind = body[position]
            if kind == ITEM_PACKET and position + PACKET_ITEM.size <= end:
                _, length = PACKET_ITEM.unpack_from(body, position)
                start = position + PACKET_ITEM.size
                position = start + length
                if length == 0 or position > end:
                    break
                items.append((body[start:position],))
            elif kind == ITEM_EPOCH:
                position += 1
                items.append(())
            elif kind == ITEM_FRAGMENT and position + FRAGMENT_ITEM.size <= end:
                _, message, index, count, total, length = FRAGMENT_ITEM.unpack_from(body, position)
                start = position + FRAGMENT_ITEM.size
                position = start + length
                if length == 0 or position > end:
                    break
                items.append((body[start:position], message, index, count, total))
            elif kind == ITEM_DATA and position + DATA_ITEM.size <= end:
                _, transfer_id, index, total, fragment, length = DATA_ITEM.unpack_from(body, position)
                start = position + DATA_ITEM.size
                position = start + length
                if length == 0 or position > end:
                    break
                items.append((ITEM_DATA, body[start:position], transfer_id, index, total, fragment))
            elif kind == ITEM_ACK:
                try:
                    ack, position = parse_ack(body, position, end)
                except ValueError:
                    break
                items.append((ITEM_ACK, *ack))
            else:
                break
        else:
            if items:
                return self._deliver(items, sender, epoch, source, now)
        return self._drop(ENVELOPE_MALFORMED, f"items of an authentic frame from {sender} do not parse at byte "
                                              f"{position} of {end}", source, size, now)

    def _deliver(self, items: list[tuple[Any, ...]], sender: str, epoch: int, source: Address,
                 now: float) -> list[bytes]:
        self.counters["datagrams_accepted"] += 1
        packets: list[bytes] = []
        for item in items:
            if len(item) == 1:
                packets.append(item[0])
                continue
            if not item:  # an epoch announcement: its header taught what it had to
                self.counters["epoch_announcements_received"] += 1
                continue
            if item[0] == ITEM_DATA or item[0] == ITEM_ACK:
                packet = self._on_transfer_item(item, sender, epoch, source, now)
                if packet is not None:
                    packets.append(packet)
                continue
            piece, message, index, count, total = item
            self.counters["fragments_received"] += 1
            whole, dropped = self.reassembler.add((sender, epoch, message), index, count, total, piece, source, now)
            for gone in dropped:
                self._drop(gone.reason, gone.detail, gone.source, gone.size, now)
            if whole is not None:
                self.counters["packets_reassembled"] += 1
                packets.append(whole)
        self.counters["packets_received"] += len(packets)
        return packets

    def _on_transfer_item(self, item: tuple[Any, ...], sender: str, epoch: int, source: Address,
                          now: float) -> bytes | None:
        transfers = self.transfers
        if transfers is None:  # we send no bulk transfers, so we take none (nor answer for any)
            self._drop("transfer_invalid", f"a bulk transfer item from {sender}; this wrapper has bulk_threshold 0",
                       source, 0, now)
            return None
        if item[0] == ITEM_ACK:
            _, transfer_id, status, cumulative, window, ranges = item
            self._transfer_drop(transfers.on_ack(source, epoch, transfer_id, status, cumulative, window, ranges, now),
                                now)
            return None
        _, piece, transfer_id, index, total, fragment = item
        self.counters["fragments_received"] += 1
        packet, dropped = transfers.on_data((sender, epoch, transfer_id), source, index, total, fragment, piece, now)
        self._transfer_drop(dropped, now)
        if packet is not None:
            self.counters["packets_reassembled"] += 1
        return packet

    def _transfer_drop(self, dropped: TransferDrop | None, now: float) -> None:
        if dropped is not None:
            self._drop(dropped.reason, dropped.detail, dropped.source, dropped.size, now)

    # ------------------------------------------------------------ timers, events, status

    def get_timer(self) -> float | None:
        """When the oldest partial message times out (call `handle_timer` then), or None."""
        return self.reassembler.next_deadline()

    def transfer_timer(self) -> float | None:
        """When a bulk transfer needs `handle_timer` (a retransmission, a probe, a give-up), or None; unlike
        `get_timer` it must not be late."""
        return self.transfers.next_deadline() if self.transfers is not None else None

    def handle_timer(self, now: float) -> None:
        for gone in self.reassembler.expire(now):
            self._drop(gone.reason, gone.detail, gone.source, gone.size, now)
        if self.transfers is not None:
            for dropped in self.transfers.on_timer(now):
                self._transfer_drop(dropped, now)

    def events_emitted(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def _drop(self, reason: str, detail: str, source: Address, size: int, now: float) -> list[bytes]:
        self.drops[reason] += 1
        if self._drop_sink is not None:
            self._drop_sink(reason)
        slot = self._event_slots.get(reason)
        carried = 0
        if slot is None or now - slot[0] >= 1.0 or now < slot[0]:
            carried = int(slot[2]) if slot is not None else 0
            slot = [now, 0, 0]
            self._event_slots[reason] = slot
        if slot[1] < EVENT_BURST:
            slot[1] += 1
            fields: dict[str, Any] = {"reason": reason, "detail": detail, "source": str(source), "size": size}
            if carried:
                fields["suppressed"] = carried
            self._events.append(Event(now, str(self.address), events.PACKET_DROPPED, fields))
        else:
            slot[2] += 1
        return []

    def key_ids(self) -> list[str]:
        return [f"{key.key_id:08x}" for key in self.keys]

    def replace_keys(self, secrets: Sequence[bytes]) -> None:
        """Rotate the federation keys while running (the daemon's SIGHUP): the first signs from now on, all are
        accepted. EnvelopeConfigError, the old keys kept, for no key or a repeated one; an envelope started open
        stays open (its frame kind and capacity are chosen at start: restart it with a key instead)."""
        if not self.keys:
            raise EnvelopeConfigError("the overlay was started open (no key file): it cannot take keys while it "
                                      "runs; restart the wrapper with key_file")
        if not secrets:
            raise EnvelopeConfigError("no key: a keyed overlay cannot become open while it runs")
        keys, keys_by_id = key_table(secrets)
        self.keys, self._keys_by_id = keys, keys_by_id
        self._signing = keys[0]
        self._cipher = self._signing.cipher(self.sender, self.epoch) if self.kind == KIND_AEAD else None
        self.config = replace(self.config, keys=tuple(secrets))

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "encryption": self.config.encryption if self.keys else ENCRYPTION_NONE,
            "key_ids": self.key_ids(), "epoch": self.epoch, "seq": self.seq,
            "max_datagram": self.config.max_datagram, "max_packet": self.config.max_packet,
            "senders": len(self.senders), "peers": len(self.peers), "partial_messages": len(self.reassembler),
            "reassembly_bytes": self.reassembler.used, "reassembly_memory": self.config.reassembly_memory,
            "reassembly_senders": self.reassembler.senders(), "reassembly_evictions": self.reassembler.evictions,
            "counters": dict(sorted(self.counters.items())), "drops": dict(sorted(self.drops.items())),
            "transfers": self.transfers.status() if self.transfers is not None else None,
        }


def envelope_epoch(boot_epoch: int, unix_time: float) -> int:
    """The envelope epoch of a wrapper: strictly greater at every restart.

    `max(boot_epoch * 10^6, unix time in microseconds)`: the boot epoch (persisted,
    never going backwards) makes it grow across restarts with a state directory;
    the microseconds make two restarts in the same second differ without one.
    A boot epoch is at most wire.MAX_EPOCH (docs/protocol.md, "Ranges"), so this
    stays within MAX_EPOCH; it saturates there only for a unix time past the year
    36,812.
    """
    return min(max(boot_epoch * 1_000_000, int(unix_time * 1_000_000), 1), MAX_EPOCH)
