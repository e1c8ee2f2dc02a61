// A batch of sightings (docs/protocol.md §6, docs/rooms.md §8): one message per tick carrying
// every sighting a gateway owes at that tick, instead of one JSON message per device. Binary,
// little-endian like the rest of protocol.md, fixed-size records:
//
//   offset size
//        0    1  version: 01
//        1    8  since: unix ms at which the sending gateway's run started (0 … 2⁶³ − 1)
//        9    8  n: the run's sighting counter of the first record; record i carries n + i
//       17    2  count: records that follow, 1 … 4096
//       19  7×c  records: device id (6, least significant byte first) | rssi (1, signed dBm,
//                −127 … +20; 7F: no longer heard)
//
// Each record is exactly what one `Sighting` carries today (rssi, since, n) plus the device id
// its topic carried, so a receiver takes a batch in as `count` sightings in order, under the
// same rule (BatonCore.RoomOwnership.batch).
//
// The decoder checks the fixed part (version, header, since, count, n's range), then the tail
// (exactly count × 7 bytes), then every record's RSSI, over borrowed bytes; it allocates
// nothing and returns a view whose records are read from those bytes. The writer fills a
// caller-owned buffer one record at a time and patches the count last.

extension Malformed {
    /// `since` above 2⁶³ − 1: a unix time in ms is an Int64 ≥ 0, as in a JSON sighting.
    public static let batchSince = Malformed("batch-since")
    /// `n + count − 1` past 2⁶⁴ − 1: the last record's counter would wrap.
    public static let batchCounter = Malformed("batch-n")
    /// A record's RSSI outside −127…+20 dBm and not 7F ("no longer heard"): 80 (−128) or
    /// 15…7E (+21…+126). Named apart, as `sighting-rssi` is: it points at a broken radio.
    public static let batchRSSI = Malformed("batch-rssi")
}

/// One record of a batch: a device and how this gateway hears it.
public struct BatchedSighting: Sendable, Equatable {
    /// The 48-bit device id (docs/mqtt.md: 12 hex digits in topics).
    public var device: UInt64
    /// Smoothed RSSI in dBm, −127…+20; nil: no longer heard.
    public var rssi: Int8?
    public init(device: UInt64, rssi: Int8?) { self.device = device; self.rssi = rssi }
}

/// A decoded batch. It borrows the bytes it was decoded from: use it only while they live.
public struct SightingBatch {
    public static let version: UInt8 = 1
    /// version (1) + since (8) + n (8) + count (2).
    public static let headerCount = 19
    /// device (6) + rssi (1).
    public static let recordCount = 7
    /// The most records a batch may carry: 28,691 bytes, well inside mosquitto's
    /// `message_size_limit` of board/mosquitto-building.conf (65,536).
    public static let maxRecords = 4096
    /// The RSSI byte that says "no longer heard": HCI's "not available" (Core 5.4, Vol 4,
    /// Part E, §7.7.65.2), never a measured value.
    public static let notHeard: UInt8 = 0x7F
    /// Device ids are 48 bits, as topics print them (12 hex digits).
    public static let deviceMask: UInt64 = 0xFFFF_FFFF_FFFF

    /// The bytes a batch of `records` records takes: for sizing a buffer.
    public static func encodedCount(records: Int) -> Int { headerCount + recordCount * records }

    /// Unix ms at which the sender's run started.
    public let since: Int64
    /// The first record's counter; record i's is n + i (never wraps: checked by `decode`).
    public let n: UInt64
    /// Records, 1…`maxRecords`.
    public let count: Int
    /// The records' bytes, `count × recordCount`, borrowed from the decoded input.
    public let records: UnsafeRawBufferPointer

    /// Decodes one batch. Never traps; garbage is a `WireError`:
    /// empty or a header cut short `truncated`; a version other than 01 `unsupported` (at 0);
    /// `since` ≥ 2⁶³ `batch-since` (at 1); a count of 0 or above `maxRecords` `badLength`
    /// (at 17); `n + count − 1` past 2⁶⁴ − 1 `batch-n` (at 9); fewer record bytes than the
    /// count says `truncated` (at 19), more `trailing-bytes`; a record's RSSI outside
    /// −127…+20 and not 7F `batch-rssi` (at that byte).
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(WireError) -> SightingBatch {
        var r = ByteReader(bytes)
        // The fixed part.
        let version = try r.readU8()
        guard version == Self.version else { throw .unsupported(at: 0, value: UInt64(version)) }
        try r.require(headerCount - 1)
        let since = try r.readU64LE()
        guard since <= UInt64(Int64.max) else { throw .malformed(at: 1, .batchSince) }
        let n = try r.readU64LE()
        let count = Int(try r.readU16LE())
        guard count >= 1 && count <= maxRecords else { throw .badLength(at: 17, length: count) }
        // Proof: count ≥ 1, so count − 1 cannot wrap.
        guard n.addingReportingOverflow(UInt64(count - 1)).overflow == false else {
            throw .malformed(at: 9, .batchCounter)
        }
        // The tail: exactly count records.
        let need = recordCount * count
        try r.require(need)
        let records = try r.readBytes(need)
        try r.requireEnd()
        // The records: only the RSSI byte has a rule (any 48-bit device id is one).
        for i in 0 ..< count {
            let at = i &* recordCount &+ 6
            guard validRSSIByte(records[at]) else { throw .malformed(at: headerCount &+ at, .batchRSSI) }
        }
        return SightingBatch(since: Int64(since), n: n, count: count, records: records)
    }

    /// Record `i` (0 ≤ i < count; outside is the caller's bug).
    public subscript(i: Int) -> BatchedSighting {
        precondition(i >= 0 && i < count, "batch record \(i) outside 0..<\(count)")
        let base = i &* Self.recordCount
        var device: UInt64 = 0
        for k in 0 ..< 6 { device |= UInt64(records[base &+ k]) << (8 &* UInt64(k)) }
        let byte = records[base &+ 6]
        return BatchedSighting(device: device, rssi: byte == Self.notHeard ? nil : Int8(bitPattern: byte))
    }

    /// Record `i` as the `Sighting` a JSON message would have carried: its RSSI, the batch's
    /// `since`, and counter n + i.
    public func sighting(_ i: Int) -> Sighting {
        Sighting(rssi: self[i].rssi, since: since, n: n &+ UInt64(i))
    }

    /// −127…+20 as a signed byte, or 7F.
    @inline(__always)
    static func validRSSIByte(_ b: UInt8) -> Bool {
        b == notHeard || Sighting.rssiRange.contains(Int8(bitPattern: b))
    }
}

/// Writes a batch into a caller-owned buffer, one record at a time; allocates nothing.
/// `init` writes the header (count 0), `append` a record, `finish` patches the count and
/// returns the bytes.
public struct SightingBatchWriter {
    private var w: ByteWriter
    public let since: Int64
    public let n: UInt64
    /// Records appended so far.
    public private(set) var count = 0

    /// A batch of `since`'s run whose first record carries counter `n`. Throws `.noRoom` when
    /// the buffer cannot hold the header and one record. A negative `since` is the caller's bug.
    public init(_ buffer: UnsafeMutableRawBufferPointer, since: Int64, n: UInt64) throws(WireError) {
        precondition(since >= 0, "a batch's since is a unix time in ms, never negative")
        w = ByteWriter(buffer)
        self.since = since
        self.n = n
        try w.reserve(SightingBatch.encodedCount(records: 1))
        w.write(SightingBatch.version)
        w.writeU64LE(UInt64(since))
        w.writeU64LE(n)
        w.writeU16LE(0)
    }

    /// No room for another record: the buffer is full or the batch holds `maxRecords`, or the
    /// next record's counter would wrap.
    public var isFull: Bool {
        count == SightingBatch.maxRecords || w.available < SightingBatch.recordCount
            || n.addingReportingOverflow(UInt64(count)).overflow
    }

    /// Appends a record; throws `.noRoom` when `isFull`. A device id past 48 bits or an RSSI
    /// outside −127…+20 is the caller's bug (a precondition): the decoder would refuse it.
    public mutating func append(device: UInt64, rssi: Int8?) throws(WireError) {
        precondition(device <= SightingBatch.deviceMask, "device id past 48 bits")
        if let rssi { precondition(Sighting.rssiRange.contains(rssi), "sighting RSSI \(rssi) outside −127…20") }
        guard !isFull else { throw .noRoom(need: w.count &+ SightingBatch.recordCount, have: w.capacity) }
        // `init` reserved the first record's room already.
        if count > 0 { try w.reserve(SightingBatch.recordCount) }
        for k in 0 ..< 6 { w.write(UInt8(truncatingIfNeeded: device >> (8 &* UInt64(k)))) }
        w.write(rssi.map { UInt8(bitPattern: $0) } ?? SightingBatch.notHeard)
        count &+= 1
    }

    /// The batch's bytes, count patched in. At least one record must have been appended (an
    /// empty batch is not sent: the decoder refuses it).
    public mutating func finish() -> UnsafeRawBufferPointer {
        precondition(count >= 1, "an empty batch is never sent")
        w.patch(UInt8(truncatingIfNeeded: count), at: 17)
        w.patch(UInt8(truncatingIfNeeded: count >> 8), at: 18)
        return w.written
    }
}
