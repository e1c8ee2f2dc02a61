// Extended advertisements that arrive in fragments (Core 5.4, Vol 4, Part E, §7.7.65.13).
//
// An LE Extended Advertising Report carries at most 229 bytes of Data; a longer advertisement
// (up to 1,650 bytes, §7.8.57 Max_Advertising_Data_Length) comes as several reports from the
// same advertiser, each but the last with Data_Status 1 ("incomplete, more data to come"), the
// last with 0 ("complete") or 2 ("incomplete, data truncated, no more to come"). Reports from
// other advertisers may come in between. Zephyr's subsys/bluetooth/host/scan.c reassembles in
// one fixed buffer and discards what does not fit; this does the same with a pool of them.
//
// The rules (docs/radio.md "Advertisements in fragments"), in the order `take` applies them:
//
//   * A chain is keyed by (address, address type, Advertising_SID, scan response or not): the
//     advertising data and the scan response of one advertiser are two chains.
//   * A report with Data_Status 0 that continues no chain is a whole advertisement in one
//     report: decoded from the event, not copied (the common case costs one pool look-up, and
//     nothing while no chain is open).
//   * Data_Status 1 opens a chain in a free buffer, or appends to the open one.
//   * Data_Status 0 ends the chain: the assembled advertisement is decoded, the buffer freed.
//   * Data_Status 2 ends the chain truncated: counted `ext-adv-truncated` (the controller lost
//     the rest, not the peer's fault), and the AD structures that are whole before the cut are
//     decoded as the advertisement; the cut one and everything after it are not.
//   * Data_Status 3 is reserved: the report is dropped (`ext-adv-data-status-reserved`) and a
//     chain it continues is abandoned.
//   * Deadline: a chain whose last fragment is older than `deadline` is discarded
//     (`ext-adv-chain-expired`) when the pool is next looked at; a late fragment of it, and
//     the rest of its chain, are discarded with it. 2.5 s is just above the
//     largest gap the link layer allows between two PDUs of a chain: AuxPtr's Aux Offset is at
//     most 8191 units of 300 µs = 2.4573 s (Core 5.4, Vol 6, Part B, §2.3.4.5).
//   * Full pool: a chain that finds no free buffer is refused (`ext-adv-pool-full`) and its
//     fragments are discarded up to and including its last one; the chains already open keep
//     their buffers (first come, first kept, as Zephyr's one buffer does).
//   * A chain longer than 1,650 bytes is discarded the same way (`ext-adv-chain-too-long`).
//   * A discarded chain (refused, too long, status 3) is remembered by key until its last
//     fragment, so that fragment is not mistaken for a whole advertisement and blamed on the
//     peer. The pool keeps as many such marks as buffers; when they are all taken, the oldest
//     mark is reused.
//
// Memory: `capacity` buffers of 1,650 bytes and two tables of `capacity` entries, allocated by
// `init` and never again: taking a fragment allocates nothing.
public import BatonWire

extension Malformed {
    /// A chain ended with Data_Status 2: the controller lost the rest (§7.7.65.13).
    public static let extAdvTruncated = Malformed("ext-adv-truncated")
    /// Data_Status 3 (reserved, §7.7.65.13).
    public static let extAdvDataStatusReserved = Malformed("ext-adv-data-status-reserved")
    /// A chain found no free reassembly buffer (`radio.reassembly`).
    public static let extAdvPoolFull = Malformed("ext-adv-pool-full")
    /// A chain's next fragment did not come within the deadline.
    public static let extAdvChainExpired = Malformed("ext-adv-chain-expired")
    /// A chain ran past 1,650 bytes (§7.8.57).
    public static let extAdvChainTooLong = Malformed("ext-adv-chain-too-long")
}

/// The buffers, owned once: a class so the decoder holding them stays a plain value that the
/// gateway passes `inout` (a copy of the decoder shares them; only one copy may decode).
final class ReassemblyBuffers {
    let bytes: UnsafeMutableRawBufferPointer
    init(byteCount: Int) { bytes = .allocate(byteCount: max(byteCount, 1), alignment: 8) }
    deinit { bytes.deallocate() }
}

public struct AdvertisementReassembly {
    /// §7.8.57: Max_Advertising_Data_Length is at most 1,650.
    public static let maxLength = 1_650
    /// Microseconds; see the rules above.
    public static let defaultDeadline: Int64 = 2_500_000
    public static let defaultCapacity = 8

    /// Who a chain belongs to.
    public struct Key: Equatable, Sendable {
        public var address: UInt64
        /// Address type, SID and the scan response bit, packed: `type << 16 | sid << 8 | scanResponse`.
        public var rest: UInt32

        public init(address: UInt64, rest: UInt32) { self.address = address; self.rest = rest }

        @inlinable
        public init(_ r: AdvertisingReport) {
            address = r.address
            rest = UInt32(r.addressType) << 16 | UInt32(r.sid) << 8 | (r.isScanResponse ? 1 : 0)
        }
    }

    struct Chain {
        var key: Key
        var length: Int
        /// The last fragment's timestamp (µs).
        var lastAt: Int64
        var open: Bool
    }

    struct Mark {
        var key: Key
        var lastAt: Int64
        var used: Bool
    }

    /// What `take` made of one report.
    public enum Outcome: Equatable {
        /// A whole advertisement in this one report: decode the report as it is.
        case whole
        /// Stored; nothing to decode yet.
        case held
        /// The chain in buffer `slot` is complete (`truncated`: ended by Data_Status 2; only
        /// `wholePrefix` of it is to be decoded): read it with `bytes(slot)`, then `release`.
        case assembled(slot: Int, truncated: Bool)
        /// A single report with Data_Status 2 and no chain: its own data, truncated.
        case truncatedReport
        /// Dropped: counted by the caller under `reason`.
        case dropped(Malformed)
        /// Part of a discarded chain: dropped, already counted when the chain was discarded.
        case discarded
    }

    public let capacity: Int
    public let deadline: Int64
    let buffers: ReassemblyBuffers
    var chains: [Chain]
    var marks: [Mark]
    /// Open chains plus marks in use: zero makes the common case free.
    public private(set) var inUse = 0
    /// The fewest buffers free since start (a pool's low-water mark, architecture.md §5.5).
    public private(set) var lowWater: Int

    public init(capacity: Int = defaultCapacity, deadline: Int64 = defaultDeadline) {
        precondition(capacity >= 0, "a reassembly pool cannot have a negative capacity")
        self.capacity = capacity
        self.deadline = deadline
        buffers = ReassemblyBuffers(byteCount: capacity * Self.maxLength)
        let noKey = Key(address: 0, rest: 0)
        chains = Array(repeating: Chain(key: noKey, length: 0, lastAt: 0, open: false), count: capacity)
        marks = Array(repeating: Mark(key: noKey, lastAt: 0, used: false), count: capacity)
        lowWater = capacity
    }

    /// Buffers holding a chain now.
    public var openChains: Int { chains.reduce(0) { $0 &+ ($1.open ? 1 : 0) } }

    /// The assembled bytes of buffer `slot` (valid until the next `take`).
    public func bytes(_ slot: Int) -> UnsafeRawBufferPointer {
        precondition(slot >= 0 && slot < capacity && chains[slot].open, "not an open chain")
        // Proof: slot < capacity and length ≤ maxLength, so the range is inside the buffers.
        return UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(buffers.bytes)[slot &* Self.maxLength ..< slot &* Self.maxLength &+ chains[slot].length])
    }

    /// Frees buffer `slot` after its `.assembled` outcome was decoded.
    public mutating func release(_ slot: Int) {
        precondition(slot >= 0 && slot < capacity && chains[slot].open, "not an open chain")
        chains[slot].open = false
        inUse &-= 1
    }

    /// Takes one extended, non-legacy report. `expired` is called once per chain that passed
    /// its deadline (each is one drop, `ext-adv-chain-expired`).
    public mutating func take(_ report: AdvertisingReport, timestamp: Int64, expired: () -> Void) -> Outcome {
        let status = report.dataStatus
        if inUse == 0 {
            // Nothing open: a complete report is whole, a truncated one is cut on its own.
            if status == 0 { return .whole }
            if status == 2 { return .truncatedReport }
        }
        let key = Key(report)
        var found = -1
        var free = -1
        var late = false
        for i in chains.indices {
            guard chains[i].open else { if free < 0 { free = i }; continue }
            // Wrapping: a capture's timestamps may go backwards (never expires) or be anything.
            if timestamp &- chains[i].lastAt > deadline {
                chains[i].open = false
                inUse &-= 1
                expired()
                if free < 0 { free = i }
                if chains[i].key == key { late = true }
                continue
            }
            if chains[i].key == key { found = i }
        }
        if late {
            // This report continues the chain that just expired: it and the rest of that
            // chain are discarded, not taken for a new advertisement (they start mid-structure).
            if status == 1 { discard(key, timestamp: timestamp) }
            return .discarded
        }
        var mark = -1
        for i in marks.indices where marks[i].used {
            if timestamp &- marks[i].lastAt > deadline {
                marks[i].used = false
                inUse &-= 1
            } else if marks[i].key == key {
                mark = i
            }
        }
        if mark >= 0 {
            // A discarded chain: its fragments go, its last one ends the mark.
            if status == 1 {
                marks[mark].lastAt = timestamp
            } else {
                marks[mark].used = false
                inUse &-= 1
            }
            return .discarded
        }
        switch status {
        case 0, 2:
            guard found >= 0 else { return status == 0 ? .whole : .truncatedReport }
            guard append(report.data, to: found, timestamp: timestamp) else {
                release(found)
                return .dropped(.extAdvChainTooLong)
            }
            return .assembled(slot: found, truncated: status == 2)
        case 1:
            if found >= 0 {
                guard append(report.data, to: found, timestamp: timestamp) else {
                    release(found)
                    discard(key, timestamp: timestamp)
                    return .dropped(.extAdvChainTooLong)
                }
                return .held
            }
            guard free >= 0 else {
                discard(key, timestamp: timestamp)
                return .dropped(.extAdvPoolFull)
            }
            chains[free] = Chain(key: key, length: 0, lastAt: timestamp, open: true)
            inUse &+= 1
            let left = capacity &- openChains
            if left < lowWater { lowWater = left }
            // Proof: a report's data is at most 229 bytes (HCIEvent checked), < maxLength.
            _ = append(report.data, to: free, timestamp: timestamp)
            return .held
        default:
            if found >= 0 { release(found) }
            return .dropped(.extAdvDataStatusReserved)
        }
    }

    /// Appends to an open chain; false if it would pass `maxLength` (nothing is written then).
    mutating func append(_ data: UnsafeRawBufferPointer, to slot: Int, timestamp: Int64) -> Bool {
        let length = chains[slot].length
        guard data.count <= Self.maxLength &- length else { return false }
        if let source = data.baseAddress, data.count > 0 {
            // Proof: slot < capacity and length + count ≤ maxLength (checked above).
            (buffers.bytes.baseAddress! + (slot &* Self.maxLength &+ length)).copyMemory(from: source, byteCount: data.count)
        }
        chains[slot].length = length &+ data.count
        chains[slot].lastAt = timestamp
        return true
    }

    /// Remembers a discarded chain until its last fragment; the oldest mark goes when all are taken.
    mutating func discard(_ key: Key, timestamp: Int64) {
        guard capacity > 0 else { return }
        var slot = -1
        var oldest = 0
        for i in marks.indices {
            if !marks[i].used { slot = i; break }
            if marks[i].lastAt < marks[oldest].lastAt { oldest = i }
        }
        if slot < 0 {
            slot = oldest
        } else {
            inUse &+= 1
        }
        marks[slot] = Mark(key: key, lastAt: timestamp, used: true)
    }

    /// How many leading bytes of `data` are whole AD structures (Core 5.4, Vol 3, Part C, §11):
    /// the walk stops before the first structure the end cuts, and at a zero Length (the
    /// non-significant part begins there). Never reads past `data`.
    public static func wholePrefix(_ data: UnsafeRawBufferPointer) -> Int {
        var at = 0
        while at < data.count {
            let length = Int(data[at])
            if length == 0 { break }
            // Proof: at < count, and length ≤ 255, so neither side can wrap.
            guard length < data.count &- at else { break }
            at &+= 1 &+ length
        }
        return at
    }
}
