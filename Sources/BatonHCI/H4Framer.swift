// H4 framing: Core 5.4, Vol 4, Part A, §2 ("UART Transport Layer", HCI packet indicators) and
// the packet headers of Vol 4, Part E, §5.4.1–§5.4.5. One fixed buffer, a state machine after
// BTstack's src/hci_transport_h4.c (W4_PACKET_TYPE → W4_<kind>_HEADER → W4_PAYLOAD), fed in
// chunks of any size.
//
// H4 has no sync pattern, so after garbage the rule is the only one a receiver can apply:
//   * Hunting: skip bytes until one of the five valid indicators 0x01…0x05. Each skipped byte
//     is counted in `stats.garbageBytes`.
//   * Oversize: a header whose length field exceeds what this framer accepts (ACL or ISO
//     payload > `maxDataPayload`) is taken as proof that its indicator was garbage, not as a
//     packet to skip: the indicator is dropped (counted in `stats.oversizePackets` and
//     `stats.garbageBytes`) and the header bytes after it are hunted through again, so a real
//     packet starting inside them is not lost. BTstack resets and loses those header bytes;
//     we re-scan them because they are already in our buffer.
// Invariant (tests check it): bytes pushed == bytes delivered (with their indicators)
//                                           + garbageBytes + pendingBytes.

/// HCI packet indicators, Core 5.4, Vol 4, Part A, §2, Table 2.1.
public enum H4PacketType: UInt8, Sendable, CaseIterable {
    case command = 0x01
    case acl = 0x02
    case sco = 0x03
    case event = 0x04
    case iso = 0x05

    /// Bytes of the packet header after the indicator (Vol 4, Part E, §5.4).
    @inlinable
    public var headerSize: Int {
        switch self {
        case .command: 3  // opcode (2), parameter total length (1)           §5.4.1
        case .acl: 4      // handle + flags (2), data total length (2)        §5.4.2
        case .sco: 3      // handle + flags (2), data total length (1)        §5.4.3
        case .event: 2    // event code (1), parameter total length (1)       §5.4.4
        case .iso: 4      // handle + flags (2), ISO data load length (14 bits) §5.4.5
        }
    }

    /// The payload length announced by a complete header (`header` excludes the indicator).
    @inlinable
    func payloadLength(header: UnsafeRawBufferPointer) -> Int {
        // Proof: callers pass exactly `headerSize` bytes.
        switch self {
        case .command, .sco: Int(header[2])
        case .event: Int(header[1])
        case .acl: Int(header[2]) | Int(header[3]) << 8
        // §5.4.5: the top two bits of the length field are RFU.
        case .iso: (Int(header[2]) | Int(header[3]) << 8) & 0x3FFF
        }
    }
}

/// One complete packet, borrowed from the framer's buffer: valid only inside the callback.
public struct H4Packet {
    public let type: H4PacketType
    /// The packet after its indicator: header, then payload. An event here is what
    /// `HCIEvent.forEachAdvertisingReport(inEvent:_:)` takes.
    public let bytes: UnsafeRawBufferPointer
    /// The same packet with its indicator byte in front, as it crossed the wire.
    public let frame: UnsafeRawBufferPointer

    @inlinable
    public init(type: H4PacketType, frame: UnsafeRawBufferPointer) {
        precondition(frame.count >= 1, "an H4 frame has at least its indicator")
        self.type = type
        self.frame = frame
        self.bytes = UnsafeRawBufferPointer(rebasing: frame[1...])
    }
}

/// What the framer has seen, for the stats topic.
public struct H4FramerStats: Sendable, Equatable {
    /// Complete packets delivered.
    public var packets: Int = 0
    /// Bytes skipped while hunting for an indicator (including dropped oversize indicators).
    public var garbageBytes: Int = 0
    /// Headers whose length exceeded the configured maximum (each dropped, then re-scanned).
    public var oversizePackets: Int = 0

    public init() {}
}

/// Splits an H4 byte stream into packets, in one buffer allocated at init.
public struct H4Framer: ~Copyable {
    /// The largest ACL or ISO payload accepted; larger is an oversize drop. Command, SCO and
    /// event payloads are at most 255 by their 8-bit length fields and always fit.
    public let maxDataPayload: Int
    public private(set) var stats = H4FramerStats()

    @usableFromInline let buffer: UnsafeMutableRawBufferPointer
    /// Bytes of the current packet held in `buffer` (indicator first).
    @usableFromInline var filled = 0
    /// Bytes `filled` must reach before the next decision (0 while hunting).
    @usableFromInline var need = 0
    @usableFromInline var type: H4PacketType? = nil
    @usableFromInline var inPayload = false

    /// The largest ACL payload a Core 5.4 controller may announce is 65535; LE controllers
    /// report far less (LE_ACL_Data_Packet_Length, typically 27 or 251). 1024 leaves room for
    /// BR/EDR and ISO SDUs a gateway never expects while keeping the buffer small.
    public static let defaultMaxDataPayload = 1024

    public init(maxDataPayload: Int = H4Framer.defaultMaxDataPayload) {
        precondition(maxDataPayload >= 0 && maxDataPayload <= 65535, "maxDataPayload outside 0...65535")
        self.maxDataPayload = maxDataPayload
        let capacity = 1 + 4 + max(255, maxDataPayload)
        buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 8)
    }

    deinit { buffer.deallocate() }

    /// The capacity of the one buffer: indicator + the largest header + the largest payload.
    public var capacity: Int { buffer.count }
    /// Bytes held for a packet not yet complete.
    public var pendingBytes: Int { filled }
    /// True between packets (nothing buffered).
    public var isIdle: Bool { filled == 0 }

    /// Forgets a partial packet, e.g. after the transport was reopened.
    public mutating func reset() {
        filled = 0; need = 0; type = nil; inPayload = false
    }

    /// Feeds `bytes`; calls `onPacket` once per complete packet, in order. The packet's bytes
    /// are valid only during the call.
    public mutating func push(_ bytes: UnsafeRawBufferPointer, _ onPacket: (H4Packet) -> Void) {
        var i = 0
        let n = bytes.count
        while i < n {
            guard let t = type else {
                // Hunting (W4_PACKET_TYPE): skip until a valid indicator.
                let b = bytes[i]
                i &+= 1
                if let found = H4PacketType(rawValue: b) {
                    buffer[0] = b
                    filled = 1
                    type = found
                    need = 1 &+ found.headerSize
                    inPayload = false
                } else {
                    stats.garbageBytes &+= 1
                }
                continue
            }
            // W4_HEADER / W4_PAYLOAD: copy as much as this phase still needs.
            // Proof: need <= capacity (checked when `need` was set), filled < need here.
            let take = min(need &- filled, n &- i)
            UnsafeMutableRawBufferPointer(rebasing: buffer[filled ..< filled &+ take])
                .copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[i ..< i &+ take]))
            filled &+= take
            i &+= take
            if filled < need { continue }
            if inPayload {
                deliver(t, onPacket)
                continue
            }
            // Header complete: decide the payload.
            let header = UnsafeRawBufferPointer(rebasing: buffer[1 ..< filled])
            let payload = t.payloadLength(header: header)
            let limit = (t == .acl || t == .iso) ? maxDataPayload : 255
            if payload > limit {
                oversize(onPacket)
                continue
            }
            if payload == 0 {
                deliver(t, onPacket)
            } else {
                need = filled &+ payload
                inPayload = true
            }
        }
    }

    @usableFromInline
    mutating func deliver(_ t: H4PacketType, _ onPacket: (H4Packet) -> Void) {
        let count = filled
        // Reset before the callback, as BTstack does: the packet stays in `buffer` until the
        // next push writes over it.
        reset()
        stats.packets &+= 1
        onPacket(H4Packet(type: t, frame: UnsafeRawBufferPointer(rebasing: buffer[..<count])))
    }

    /// Drops the indicator of an impossible header and hunts through the header bytes again.
    @usableFromInline
    mutating func oversize(_ onPacket: (H4Packet) -> Void) {
        stats.oversizePackets &+= 1
        stats.garbageBytes &+= 1
        // At most 4 header bytes; copy them out before the buffer is reused.
        var replay: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        let count = filled &- 1
        withUnsafeMutableBytes(of: &replay) { r in
            r.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[1 ..< filled]))
        }
        reset()
        // Recursion depth is bounded: each level replays strictly fewer bytes.
        withUnsafeBytes(of: &replay) { r in
            push(UnsafeRawBufferPointer(rebasing: r[..<count]), onPacket)
        }
    }
}
