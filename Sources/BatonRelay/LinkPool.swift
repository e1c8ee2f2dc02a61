// The link slots of a relay (docs/relay.md §5): the fetch relay's links to devices, the stream
// relay's streams, the phones' links to re-advertised activities. Each is a fixed number of
// slots, taken at start (architecture.md §5); a slot holds an open (or opening) channel
// and the relay's state for it. The pool keeps what the three share: which slots are taken,
// each link's serial, and which descriptor handed to poll(2) belongs to which link.
//
// Why serials: a request handled between poll() and the readiness it returned may close a link
// and open another in the same slot, which may get the same descriptor number (and, were the
// state made anew, the same object address). The readiness of the old link must not be read as
// the new one's, so each descriptor handed out is remembered with its link's serial.

import BatonLibc
import CLibc

/// A fixed number of link slots. `Entry` is the relay's state for one link, a class made once
/// per slot at start and handed out again for every link the slot holds (the relay resets it
/// when it takes the slot): taking a slot allocates nothing.
@usableFromInline  // Embedded Swift destroys it in the modules that hold a relay.
struct LinkPool<Entry: AnyObject>: ~Copyable {
    let capacity: Int
    /// One per slot, made at start.
    private let entries: [Entry]
    /// Initialised exactly while the slot is taken.
    private let channels: UnsafeMutablePointer<LinkChannel>
    /// The serial of the link in each slot; 0: the slot is free.
    private var serials: [UInt64]
    private var lastSerial: UInt64
    /// Slot and serial of each descriptor `pollDescriptors` handed out, in order.
    private var polled: [(slot: Int, serial: UInt64)]
    private(set) var count = 0

    /// `firstSerial`: the serial before the first link's (a random one makes an earlier run's
    /// serials, which a late answer may still name, match no link of this one).
    init(capacity: Int, firstSerial: UInt64 = 0, make: (Int) -> Entry) {
        precondition(capacity >= 0, "a pool of \(capacity) links")
        self.capacity = capacity
        var entries: [Entry] = []
        entries.reserveCapacity(capacity)
        for slot in 0..<capacity { entries.append(make(slot)) }
        self.entries = entries
        channels = .allocate(capacity: max(1, capacity))
        serials = Array(repeating: 0, count: capacity)
        lastSerial = firstSerial
        polled = []
        polled.reserveCapacity(capacity)
    }

    deinit {
        for slot in 0..<capacity where serials[slot] != 0 { (channels + slot).deinitialize(count: 1) }
        channels.deallocate()
    }

    var indices: Range<Int> { 0..<capacity }
    var isFull: Bool { count == capacity }

    /// The entry of the link in `slot`; nil when the slot is free.
    subscript(slot: Int) -> Entry? { serials[slot] != 0 ? entries[slot] : nil }

    /// The channel of the link in `slot`, in place. A free slot is our bug.
    subscript(channel slot: Int) -> LinkChannel {
        unsafeAddress {
            precondition(serials[slot] != 0, "the channel of a free link slot")
            return UnsafePointer(channels + slot)
        }
        unsafeMutableAddress {
            precondition(serials[slot] != 0, "the channel of a free link slot")
            return channels + slot
        }
    }

    /// The serial of the link in `slot`; nil when the slot is free.
    func serial(_ slot: Int) -> UInt64? { serials[slot] != 0 ? serials[slot] : nil }

    /// The slot of the link with `serial`, if it is still open.
    func slot(serial: UInt64) -> Int? {
        guard serial != 0 else { return nil }
        return serials.firstIndex(of: serial)
    }

    /// The first taken slot whose entry satisfies `match`.
    func first(where match: (Entry) -> Bool) -> Int? {
        for slot in 0..<capacity where serials[slot] != 0 && match(entries[slot]) { return slot }
        return nil
    }

    /// Puts `channel` in the first free slot and returns the slot and its entry (for the caller
    /// to reset). The caller checked `isFull`.
    mutating func add(_ channel: consuming LinkChannel) -> (slot: Int, entry: Entry) {
        // Proof of a free slot: the caller checked `isFull`.
        let slot = serials.firstIndex(of: 0)!
        lastSerial &+= 1  // Proof: 2⁶⁴ links are never opened (from a random start: skip 0).
        if lastSerial == 0 { lastSerial = 1 }
        serials[slot] = lastSerial
        (channels + slot).initialize(to: channel)
        count += 1
        return (slot, entries[slot])
    }

    /// Frees `slot` and hands its channel back, still open: to close, or to give to another
    /// relay (a phone's stream link).
    mutating func remove(_ slot: Int) -> LinkChannel {
        precondition(serials[slot] != 0, "remove of a free link slot")
        serials[slot] = 0
        count -= 1
        return (channels + slot).move()
    }

    /// Closes the channel of `slot` and frees it (nothing for a free slot).
    mutating func close(_ slot: Int) {
        guard serials[slot] != 0 else { return }
        var channel = remove(slot)
        channel.close()
    }

    /// Appends each open descriptor with POLLIN, and POLLOUT while its channel or `wantsWrite`
    /// of its entry asks for it; `ready` takes them back in the same order.
    mutating func pollDescriptors(into fds: inout [pollfd], wantsWrite: (Entry) -> Bool = { _ in false }) {
        polled.removeAll(keepingCapacity: true)
        for slot in 0..<capacity where serials[slot] != 0 {
            let fd = channels[slot].fd
            guard fd >= 0 else { continue }
            var events = Int16(POLLIN)
            if channels[slot].wantsWrite || wantsWrite(entries[slot]) { events |= Int16(POLLOUT) }
            fds.append(pollfd(fd: fd, events: events, revents: 0))
            polled.append((slot, serials[slot]))
        }
    }

    /// The slot whose link the `k`th descriptor of `pollDescriptors` was, when poll(2) said
    /// something of it and that link is still in its slot.
    func ready(_ k: Int, _ fd: pollfd) -> Int? {
        guard fd.revents != 0, k < polled.count else { return nil }
        let (slot, serial) = polled[k]
        return serials[slot] == serial ? slot : nil
    }

    /// The same link is still in `slot`.
    func holds(_ slot: Int, serial: UInt64) -> Bool { serials[slot] == serial }
}

/// What poll(2) said of a link's descriptor.
struct LinkReadiness {
    var readable: Bool
    var writable: Bool
    init(_ fd: pollfd) {
        readable = fd.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0
        writable = fd.revents & Int16(POLLOUT) != 0
    }
}
