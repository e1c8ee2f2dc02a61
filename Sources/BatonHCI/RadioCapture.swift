// Capture replay as a radio source (docs/radio.md "Capture replay"): the gateway and the
// demo run on a recorded capture exactly as on a controller. It owns one copy of the file,
// made at open; replay allocates nothing after that.
//
// Sniffer captures hold link-layer PDUs, not HCI events: each good-CRC advertising PDU is
// delivered as the LE Advertising Report event a controller would have sent for it
// (Core 5.4, Vol 4, Part E, §7.7.65.2), written into one fixed buffer.
import BatonLibc
public import BatonWire

public struct RadioCapture: ~Copyable, RadioSource {
    public enum Pace: Sendable, Equatable {
        /// As fast as the caller's loop takes events.
        case asFastAsPossible
        /// At the capture's own timestamps, scaled (2.0 plays twice as fast).
        case timestamps(speed: Double)
    }

    private let storage: UnsafeMutableRawBufferPointer
    private let count: Int
    private var reader: CaptureReader
    private let pace: Pace
    /// The capture time of the first record and the clock instant it was replayed at.
    private var origin: (capture: Int64, clock: Instant)?
    /// A record read but not yet due (paced replay).
    private var pending: CaptureRecord?
    private var synthesized: InlineArray<257, UInt8> = .init(repeating: 0)
    public private(set) var state: RadioState = .stopped
    /// Records that are not HCI events or advertising PDUs (commands, ACL, notes…): skipped.
    public private(set) var skippedRecords = 0
    /// Records the reader yielded as malformed, and sniffed PDUs with a bad CRC.
    public private(set) var malformedRecords = 0
    /// Where the file stopped being readable, if it did: the records before it were replayed.
    public private(set) var damage: WireError?
    /// Records handed out per `poll` as fast as possible, so a loop with other work
    /// (the broker, a timer) keeps turning.
    public static let batch = 256

    /// Opens a capture held in `bytes` (copied once).
    public init(bytes: UnsafeRawBufferPointer, pace: Pace = .asFastAsPossible) throws(RadioError) {
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(bytes.count, 1), alignment: 8)
        if let base = bytes.baseAddress, bytes.count > 0 { storage.baseAddress!.copyMemory(from: base, byteCount: bytes.count) }
        try self.init(owning: storage, count: bytes.count, pace: pace)
    }

    /// Opens a capture file's contents (copied once).
    public init(file: [UInt8], pace: Pace = .asFastAsPossible) throws(RadioError) {
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(file.count, 1), alignment: 8)
        file.withUnsafeBytes { if let base = $0.baseAddress, $0.count > 0 { storage.baseAddress!.copyMemory(from: base, byteCount: $0.count) } }
        try self.init(owning: storage, count: file.count, pace: pace)
    }

    private init(owning storage: UnsafeMutableRawBufferPointer, count: Int, pace: Pace) throws(RadioError) {
        let view = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(storage)[..<count])
        do throws(WireError) { reader = try CaptureReader(view) } catch {
            storage.deallocate()
            throw .wire(error)
        }
        self.storage = storage
        self.pace = pace
        self.count = count
    }

    deinit { storage.deallocate() }

    public var fd: Int32 { -1 }
    public var wantsWrite: Bool { false }

    public var nextDeadline: Instant? {
        guard state == .scanning else { return nil }
        guard case .timestamps(let speed) = pace, let origin, let pending else { return origin?.clock ?? .now }
        return origin.clock + .microseconds(Double(pending.timestamp &- origin.capture) / speed)
    }

    /// Rewinds to the first record.
    public mutating func start(now: Instant) throws(RadioError) {
        let view = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(storage)[..<count])
        do throws(WireError) { reader = try CaptureReader(view) } catch { throw .wire(error) }
        origin = nil
        pending = nil
        damage = nil
        state = .scanning
    }

    public mutating func poll(now: Instant,
                              _ onEvent: (UnsafeRawBufferPointer) -> Void) throws(RadioError) -> Int {
        guard state == .scanning else { return 0 }
        var delivered = 0
        while delivered < Self.batch {
            let record: CaptureRecord
            if let p = pending { record = p } else {
                do throws(WireError) {
                    guard let r = try reader.next() else { state = .finished; break }
                    record = r
                } catch {
                    damage = error
                    state = .finished
                    break
                }
            }
            if origin == nil { origin = (record.timestamp, now) }
            if case .timestamps(let speed) = pace, let origin {
                let due = origin.clock + .microseconds(Double(record.timestamp &- origin.capture) / speed)
                if due > now { pending = record; break }
            }
            pending = nil
            delivered &+= deliver(record, onEvent)
        }
        return delivered
    }

    private mutating func deliver(_ record: CaptureRecord, _ onEvent: (UnsafeRawBufferPointer) -> Void) -> Int {
        switch record.kind {
        case .hci(let hci) where hci.type == .event:
            onEvent(hci.bytes)
            return 1
        case .linkLayer(let ll) where ll.isAdvertising:
            guard ll.crc != .bad else { malformedRecords &+= 1; return 0 }
            let report: AdvertisingReport?
            do throws(WireError) { report = try ll.advertisingReport() } catch { malformedRecords &+= 1; return 0 }
            guard let report, !report.isExtended, report.data.count <= HCIEvent.legacyMaxData else { skippedRecords &+= 1; return 0 }
            var span = synthesized.mutableSpan
            span.withUnsafeMutableBytes { raw in
                var w = ByteWriter(raw)
                // Proof: 4 + 10 + 31 bytes at most, in a 257-byte buffer.
                do throws(WireError) {
                    try w.reserve(14 &+ report.data.count)
                } catch { preconditionFailure("a legacy report fits one event") }
                w.write(HCIEventCode.leMeta)
                w.write(UInt8(12 &+ report.data.count))
                w.write(LESubevent.advertisingReport)
                w.write(1)
                w.write(report.legacyEventType ?? 0x03)
                w.write(report.addressType)
                for i in 0..<6 { w.write(UInt8(truncatingIfNeeded: report.address >> UInt64(8 * i))) }
                w.write(UInt8(report.data.count))
                w.write(report.data)
                w.write(UInt8(bitPattern: report.rssi))
                onEvent(w.written)
            }
            return 1
        case .malformed:
            malformedRecords &+= 1
            return 0
        default:
            skippedRecords &+= 1
            return 0
        }
    }
}
