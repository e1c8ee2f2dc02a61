// A device's GATT server, simulated (docs/esphome.md §11, docs/simulator.md "A sensor to
// connect to"): a table of attributes answering a client's ATT requests (Core 5.4, Vol 3,
// Part F, §3.4), one PDU in, at most one PDU out. `baton sim sensor` serves it on a real
// controller's ATT channel; the tests serve it at the far end of a socket. The table is a
// thermometer: a Battery service (0x180F) with its level (read, notify) and a 128-bit service
// with a long writable value and a temperature (notify, indicate).

/// The server's side: attributes, the agreed MTU, and what each request gets back.
public struct GATTServerModel: Sendable {
    public struct Attribute: Sendable {
        public var handle: UInt16
        /// The attribute type, little-endian as on the air: 2 or 16 bytes.
        public var type: [UInt8]
        public var value: [UInt8]
        public init(handle: UInt16, type: [UInt8], value: [UInt8]) { self.handle = handle; self.type = type; self.value = value }
    }

    public var attributes: [Attribute]
    /// The server's receive MTU (what it answers an Exchange MTU Request with).
    public var mtu: UInt16
    /// The MTU agreed by the exchange (23 until then, §3.4.2).
    public private(set) var agreedMTU: UInt16 = 23

    public static let custom: [UInt8] = Array(0x10 ... 0x1F)  // a 128-bit UUID, little-endian
    public static let longValue: [UInt8] = Array(0 ..< 40)
    /// The handles a client uses: the battery level, the long value, the temperature and its
    /// Client Characteristic Configuration descriptor.
    public static let batteryLevel: UInt16 = 3, long: UInt16 = 7, temperature: UInt16 = 9, temperatureCCCD: UInt16 = 10

    public init(attributes: [Attribute], mtu: UInt16) {
        self.attributes = attributes
        self.mtu = mtu
    }

    /// The thermometer.
    public static func thermometer(mtu: UInt16 = 247) -> GATTServerModel {
        func u16(_ v: UInt16) -> [UInt8] { [UInt8(v & 0xFF), UInt8(v >> 8)] }
        return GATTServerModel(attributes: [
            // Battery service, 1–4 (Vol 3, Part G, §3.1: the declaration's value is its UUID).
            Attribute(handle: 1, type: u16(0x2800), value: u16(0x180F)),
            // §3.3.1: properties (read 0x02 | notify 0x10), value handle, UUID 0x2A19.
            Attribute(handle: 2, type: u16(0x2803), value: [0x12] + u16(3) + u16(0x2A19)),
            Attribute(handle: 3, type: u16(0x2A19), value: [87]),
            Attribute(handle: 4, type: u16(0x2902), value: [0, 0]),
            // A 128-bit service, 5–10.
            Attribute(handle: 5, type: u16(0x2800), value: custom),
            // read 0x02 | write without response 0x04 | write 0x08, 128-bit UUID.
            Attribute(handle: 6, type: u16(0x2803), value: [0x0E] + u16(7) + custom.map { $0 ^ 0xFF }),
            Attribute(handle: 7, type: custom.map { $0 ^ 0xFF }, value: longValue),
            // notify 0x10 | indicate 0x20, the temperature (0x2A6E, 0.01 °C: 0x0834 = 21.00 °C).
            Attribute(handle: 8, type: u16(0x2803), value: [0x30] + u16(9) + u16(0x2A6E)),
            Attribute(handle: 9, type: u16(0x2A6E), value: [0x34, 0x08]),
            Attribute(handle: 10, type: u16(0x2902), value: [0, 0]),
        ], mtu: mtu)
    }

    public func value(_ handle: UInt16) -> [UInt8]? { attributes.first { $0.handle == handle }?.value }

    /// A notification (1B) or indication (1D) of `handle`'s new value, which it keeps.
    public mutating func notification(_ handle: UInt16, _ value: [UInt8], indicate: Bool = false) -> [UInt8] {
        if let i = attributes.firstIndex(where: { $0.handle == handle }) { attributes[i].value = value }
        return [indicate ? 0x1D : 0x1B, UInt8(handle & 0xFF), UInt8(handle >> 8)] + value
    }

    func error(_ request: UInt8, _ handle: UInt16, _ code: UInt8) -> [UInt8] {
        [0x01, request, UInt8(handle & 0xFF), UInt8(handle >> 8), code]
    }

    /// What a request gets back (nil: a command, or a confirmation, which nothing answers).
    public mutating func answer(_ p: [UInt8]) -> [UInt8]? {
        guard let opcode = p.first else { return nil }
        func u16(_ at: Int) -> UInt16 { p.count >= at + 2 ? UInt16(p[at]) | UInt16(p[at + 1]) << 8 : 0 }
        let limit = Int(agreedMTU)
        switch opcode {
        case 0x02:  // Exchange MTU Request → Response with the server's MTU
            agreedMTU = max(23, min(u16(1), mtu))
            return [0x03, UInt8(mtu & 0xFF), UInt8(mtu >> 8)]
        case 0x10:  // Read By Group Type: the primary services in [start, end]
            let start = u16(1), end = u16(3)
            var out: [UInt8] = [0x11, 0]
            var size = 0
            for (i, a) in attributes.enumerated() where a.type == [0x00, 0x28] && a.handle >= start && a.handle <= end {
                let groupEnd = attributes[(i + 1)...].first { $0.type == [0x00, 0x28] }.map { $0.handle - 1 } ?? attributes.last!.handle
                let entry = [UInt8(a.handle & 0xFF), UInt8(a.handle >> 8), UInt8(groupEnd & 0xFF), UInt8(groupEnd >> 8)] + a.value
                if size == 0 { size = entry.count } else if entry.count != size { break }
                if out.count + entry.count > limit { break }
                out += entry
            }
            if size == 0 { return error(0x10, start, 0x0A) }
            out[1] = UInt8(size)
            return out
        case 0x08:  // Read By Type: attributes of the type in [start, end]
            let start = u16(1), end = u16(3), type = p.count > 5 ? Array(p[5...]) : []
            var out: [UInt8] = [0x09, 0]
            var size = 0
            for a in attributes where a.type == type && a.handle >= start && a.handle <= end {
                let entry = [UInt8(a.handle & 0xFF), UInt8(a.handle >> 8)] + a.value
                if size == 0 { size = entry.count } else if entry.count != size { break }
                if out.count + entry.count > limit { break }
                out += entry
            }
            if size == 0 { return error(0x08, start, 0x0A) }
            out[1] = UInt8(size)
            return out
        case 0x04:  // Find Information: handles and types in [start, end], one format per response
            let start = u16(1), end = u16(3)
            var out: [UInt8] = [0x05, 0]
            for a in attributes where a.handle >= start && a.handle <= end {
                let format: UInt8 = a.type.count == 2 ? 1 : 2
                if out[1] == 0 { out[1] = format } else if out[1] != format { break }
                let entry = [UInt8(a.handle & 0xFF), UInt8(a.handle >> 8)] + a.type
                if out.count + entry.count > limit { break }
                out += entry
            }
            if out[1] == 0 { return error(0x04, start, 0x0A) }
            return out
        case 0x0A, 0x0C:  // Read, Read Blob
            let handle = u16(1), offset = opcode == 0x0C ? Int(u16(3)) : 0
            guard let v = value(handle) else { return error(opcode, handle, 0x01) }
            if offset > v.count { return error(opcode, handle, 0x07) }
            if opcode == 0x0C, v.count <= limit - 1 { return error(0x0C, handle, 0x0B) }
            return [opcode + 1] + Array(v[offset ..< min(v.count, offset + limit - 1)])
        case 0x12, 0x52:  // Write Request, Write Command
            let handle = u16(1)
            guard let i = attributes.firstIndex(where: { $0.handle == handle }), p.count >= 3 else {
                return opcode == 0x12 ? error(0x12, handle, 0x01) : nil
            }
            attributes[i].value = Array(p[3...])
            return opcode == 0x12 ? [0x13] : nil
        case 0x1E:  // Handle Value Confirmation
            return nil
        default:
            return opcode & 0x40 != 0 ? nil : error(opcode, 0, 0x06)
        }
    }
}
