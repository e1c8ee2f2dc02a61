// The Attribute Protocol as a GATT client speaks it (Core 5.4, Vol 3, Part F, §3.4), over an
// L2CAP channel on the ATT fixed channel (CID 4) that the kernel opens: the groundwork of the
// ESPHome proxy's active connections (docs/esphome.md, issue 32 item 1; not yet wired to the
// server). One PDU is one L2CAP SDU: opcode (1), then parameters (§3.3).
//
// What a client sends is written by `ATTRequest.encode(into:)`. What a server sends comes from
// a device anyone can build, so `ATTServerPDU.decode` takes borrowed bytes, checks the opcode and
// the fixed part, then the list or value after it, and returns ranges into the input or a
// `WireError` naming the byte; it never traps. Lists (services, characteristics, descriptors)
// are not copied: `ATTList` walks its entries in the input.

extension Malformed {
    /// An Error Response, MTU response or Handle Value PDU whose fixed part is longer or
    /// shorter than §3.4 gives it.
    public static let attLength = Malformed("att-length")
    /// A list response whose entry length is below its fixed part, whose data is not a
    /// whole number of entries, or that holds none (§3.4.3.2, §3.4.4.2, §3.4.4.10).
    public static let attList = Malformed("att-list")
    /// A Find Information Response whose Format is neither 1 (16-bit UUIDs) nor 2 (128-bit).
    public static let attFormat = Malformed("att-format")
    /// A GATT declaration value of a length §3.3 of Vol 3, Part G does not give it.
    public static let gattDeclaration = Malformed("gatt-declaration")
}

public enum ATTOpcode {
    public static let errorResponse: UInt8 = 0x01
    public static let exchangeMTURequest: UInt8 = 0x02
    public static let exchangeMTUResponse: UInt8 = 0x03
    public static let findInformationRequest: UInt8 = 0x04
    public static let findInformationResponse: UInt8 = 0x05
    public static let readByTypeRequest: UInt8 = 0x08
    public static let readByTypeResponse: UInt8 = 0x09
    public static let readRequest: UInt8 = 0x0A
    public static let readResponse: UInt8 = 0x0B
    public static let readBlobRequest: UInt8 = 0x0C
    public static let readBlobResponse: UInt8 = 0x0D
    public static let readByGroupTypeRequest: UInt8 = 0x10
    public static let readByGroupTypeResponse: UInt8 = 0x11
    public static let writeRequest: UInt8 = 0x12
    public static let writeResponse: UInt8 = 0x13
    public static let handleValueNotification: UInt8 = 0x1B
    public static let handleValueIndication: UInt8 = 0x1D
    public static let handleValueConfirmation: UInt8 = 0x1E
    public static let writeCommand: UInt8 = 0x52
    /// §3.3: bit 6 of an opcode marks a command, which is never answered.
    public static let commandFlag: UInt8 = 0x40
}

/// §3.4.1.1 Error Codes that a client sends or acts on.
public enum ATTErrorCode {
    public static let invalidHandle: UInt8 = 0x01
    public static let requestNotSupported: UInt8 = 0x06
    public static let attributeNotFound: UInt8 = 0x0A
    public static let attributeNotLong: UInt8 = 0x0B
    public static let invalidAttributeValueLength: UInt8 = 0x0D
    public static let insufficientResources: UInt8 = 0x11
}

/// GATT's attribute types (Vol 3, Part G, §3: Assigned Numbers, "GATT Declarations").
public enum GATTType {
    public static let primaryService: UInt16 = 0x2800
    public static let characteristic: UInt16 = 0x2803
    /// Client Characteristic Configuration: 1 notifications, 2 indications (§3.3.3.3).
    public static let clientConfiguration: UInt16 = 0x2902
}

/// §3.2.2: ATT_MTU is 23 until an Exchange MTU changes it; then the smaller of the two Rx MTUs,
/// unless either side gave less than 23, which leaves it at 23 (§3.4.2.2).
public enum ATTMTU {
    public static let minimum: UInt16 = 23

    public static func agreed(client: UInt16, server: UInt16) -> UInt16 {
        guard client >= minimum, server >= minimum else { return minimum }
        return min(client, server)
    }
}

/// A UUID as the 128 bits ESPHome's API carries (two uint64, most significant first): a 16-bit
/// one is placed in the Bluetooth Base UUID, 0000xxxx-0000-1000-8000-00805F9B34FB (Vol 3,
/// Part B, §2.5.1).
public struct GATTUUID: Hashable, Sendable {
    public var high: UInt64
    public var low: UInt64

    public static let baseHigh: UInt64 = 0x0000_0000_0000_1000
    public static let baseLow: UInt64 = 0x8000_0080_5F9B_34FB

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    public init(short: UInt16) {
        high = Self.baseHigh | UInt64(short) << 32
        low = Self.baseLow
    }

    /// The 16-bit UUID this is, if it lies in the base UUID.
    public var short: UInt16? {
        guard low == Self.baseLow, high & 0xFFFF_0000_FFFF_FFFF == Self.baseHigh else { return nil }
        return UInt16(truncatingIfNeeded: high >> 32)
    }

    /// From ATT's little-endian 2 or 16 bytes (§3.2.1); nil for any other length.
    public init?(little bytes: UnsafeRawBufferPointer) {
        switch bytes.count {
        case 2:
            self.init(short: UInt16(bytes[0]) | UInt16(bytes[1]) << 8)
        case 16:
            var h: UInt64 = 0, l: UInt64 = 0
            for i in 0..<8 { l |= UInt64(bytes[i]) << (8 * UInt64(i)) }
            for i in 0..<8 { h |= UInt64(bytes[8 + i]) << (8 * UInt64(i)) }
            self.init(high: h, low: l)
        default:
            return nil
        }
    }
}

/// A request or command a GATT client sends (§3.4). Values are borrowed for `encode`.
public enum ATTRequest {
    case exchangeMTU(clientRxMTU: UInt16)
    /// Find Information: the descriptors' handles and types between `start` and `end`.
    case findInformation(start: UInt16, end: UInt16)
    /// Read By Type with a 16-bit type: characteristic declarations (0x2803) in a service.
    case readByType(start: UInt16, end: UInt16, type: UInt16)
    /// Read By Group Type with a 16-bit type: primary services (0x2800).
    case readByGroupType(start: UInt16, end: UInt16, type: UInt16)
    case read(handle: UInt16)
    case readBlob(handle: UInt16, offset: UInt16)
    case write(handle: UInt16, value: UnsafeRawBufferPointer)
    case writeCommand(handle: UInt16, value: UnsafeRawBufferPointer)
    /// The answer to a Handle Value Indication.
    case confirmation
    /// The answer to a request this client does not serve (the peer acting as a client).
    case error(request: UInt8, handle: UInt16, code: UInt8)

    public var opcode: UInt8 {
        switch self {
        case .exchangeMTU: ATTOpcode.exchangeMTURequest
        case .findInformation: ATTOpcode.findInformationRequest
        case .readByType: ATTOpcode.readByTypeRequest
        case .readByGroupType: ATTOpcode.readByGroupTypeRequest
        case .read: ATTOpcode.readRequest
        case .readBlob: ATTOpcode.readBlobRequest
        case .write: ATTOpcode.writeRequest
        case .writeCommand: ATTOpcode.writeCommand
        case .confirmation: ATTOpcode.handleValueConfirmation
        case .error: ATTOpcode.errorResponse
        }
    }

    public var encodedCount: Int {
        switch self {
        case .exchangeMTU: 3
        case .findInformation: 5
        case .readByType, .readByGroupType: 7
        case .read: 3
        case .readBlob: 5
        case .write(_, let v), .writeCommand(_, let v): 3 + v.count
        case .confirmation: 1
        case .error: 5
        }
    }

    /// Writes the whole PDU, or throws `noRoom` and writes nothing. A write longer than
    /// ATT_MTU − 3 is the caller's to split (§3.4.5.1); the encoder does not know the MTU.
    public func encode(into w: inout ByteWriter) throws(WireError) {
        try w.reserve(encodedCount)
        w.write(opcode)
        switch self {
        case .exchangeMTU(let mtu): w.writeU16LE(mtu)
        case .findInformation(let start, let end):
            w.writeU16LE(start); w.writeU16LE(end)
        case .readByType(let start, let end, let type), .readByGroupType(let start, let end, let type):
            w.writeU16LE(start); w.writeU16LE(end); w.writeU16LE(type)
        case .read(let handle): w.writeU16LE(handle)
        case .readBlob(let handle, let offset):
            w.writeU16LE(handle); w.writeU16LE(offset)
        case .write(let handle, let value), .writeCommand(let handle, let value):
            w.writeU16LE(handle); w.write(value)
        case .confirmation: break
        case .error(let request, let handle, let code):
            w.write(request); w.writeU16LE(handle); w.write(code)
        }
    }
}

/// Entries of a list response, in the PDU: `count` entries of `entrySize` bytes from `start`.
public struct ATTList: Equatable, Sendable {
    public let start: Int
    public let entrySize: Int
    public let count: Int

    /// Where entry `i` lies in the PDU.
    public func entry(_ i: Int) -> Range<Int> {
        precondition(i >= 0 && i < count, "ATTList entry \(i) of \(count)")
        let at = start &+ i &* entrySize
        return at ..< at &+ entrySize
    }
}

/// What a GATT server sends a client (§3.4), as ranges into the PDU it was decoded from.
public enum ATTServerPDU: Equatable, Sendable {
    case error(request: UInt8, handle: UInt16, code: UInt8)
    case exchangeMTU(serverRxMTU: UInt16)
    /// Find Information Response: entries of handle (2) and UUID (2 or 16).
    case information(ATTList)
    /// Read By Type Response: entries of handle (2) and value.
    case byType(ATTList)
    case read(value: Range<Int>)
    case readBlob(value: Range<Int>)
    /// Read By Group Type Response: entries of handle (2), end group handle (2) and value.
    case byGroupType(ATTList)
    case written
    case notification(handle: UInt16, value: Range<Int>)
    case indication(handle: UInt16, value: Range<Int>)
    /// A request from the peer acting as a client: answered with Error Response
    /// "Request Not Supported" (§3.4.1.1), the opcode echoed.
    case request(opcode: UInt8)
    /// A command from the peer (bit 6 set): never answered (§3.3), ignored.
    case command(opcode: UInt8)

    public static func decode(_ pdu: UnsafeRawBufferPointer) throws(WireError) -> ATTServerPDU {
        var r = ByteReader(pdu)
        let opcode = try r.readU8()
        switch opcode {
        case ATTOpcode.errorResponse:
            // §3.4.1.1: Request Opcode In Error (1), Attribute Handle In Error (2), Error Code (1).
            let request = try r.readU8(), handle = try r.readU16LE(), code = try r.readU8()
            try exactEnd(r)
            return .error(request: request, handle: handle, code: code)
        case ATTOpcode.exchangeMTUResponse:
            let mtu = try r.readU16LE()
            try exactEnd(r)
            return .exchangeMTU(serverRxMTU: mtu)
        case ATTOpcode.findInformationResponse:
            // §3.4.3.2: Format (1): 0x01 handle + 16-bit UUID, 0x02 handle + 128-bit UUID.
            let format = try r.readU8()
            let size: Int
            switch format {
            case 1: size = 4
            case 2: size = 18
            default: throw .malformed(at: 1, .attFormat)
            }
            return .information(try list(pdu, from: 2, entrySize: size))
        case ATTOpcode.readByTypeResponse:
            // §3.4.4.2: Length (1) of each handle-value pair, at least the handle.
            let size = Int(try r.readU8())
            guard size >= 2 else { throw .malformed(at: 1, .attList) }
            return .byType(try list(pdu, from: 2, entrySize: size))
        case ATTOpcode.readByGroupTypeResponse:
            // §3.4.4.10: Length (1) of each handle, end group handle, value.
            let size = Int(try r.readU8())
            guard size >= 4 else { throw .malformed(at: 1, .attList) }
            return .byGroupType(try list(pdu, from: 2, entrySize: size))
        case ATTOpcode.readResponse:
            return .read(value: 1 ..< pdu.count)
        case ATTOpcode.readBlobResponse:
            return .readBlob(value: 1 ..< pdu.count)
        case ATTOpcode.writeResponse:
            try exactEnd(r)
            return .written
        case ATTOpcode.handleValueNotification, ATTOpcode.handleValueIndication:
            let handle = try r.readU16LE()
            return opcode == ATTOpcode.handleValueNotification
                ? .notification(handle: handle, value: 3 ..< pdu.count)
                : .indication(handle: handle, value: 3 ..< pdu.count)
        default:
            return opcode & ATTOpcode.commandFlag != 0 ? .command(opcode: opcode) : .request(opcode: opcode)
        }
    }

    static func exactEnd(_ r: ByteReader) throws(WireError) {
        guard r.isAtEnd else { throw .malformed(at: r.offset, .attLength) }
    }

    static func list(_ pdu: UnsafeRawBufferPointer, from start: Int, entrySize: Int) throws(WireError) -> ATTList {
        let data = pdu.count &- start
        guard data > 0 else { throw .malformed(at: start, .attList) }
        guard data % entrySize == 0 else { throw .malformed(at: pdu.count &- data % entrySize, .attList) }
        return ATTList(start: start, entrySize: entrySize, count: data / entrySize)
    }
}

/// A primary service from a Read By Group Type Response entry (Vol 3, Part G, §3.1): its
/// handle range and UUID.
public struct GATTService: Equatable, Sendable {
    public var start: UInt16
    public var end: UInt16
    public var uuid: GATTUUID

    public init(start: UInt16, end: UInt16, uuid: GATTUUID) {
        self.start = start; self.end = end; self.uuid = uuid
    }

    /// `entry`: the 6 or 20 bytes of one entry (handle, end group handle, UUID).
    public static func decode(_ entry: UnsafeRawBufferPointer, at offset: Int = 0) throws(WireError) -> GATTService {
        var r = ByteReader(entry)
        let start = try r.readU16LE(), end = try r.readU16LE()
        guard let uuid = GATTUUID(little: r.readRest()) else { throw .malformed(at: offset &+ 4, .gattDeclaration) }
        return GATTService(start: start, end: end, uuid: uuid)
    }
}

/// A characteristic declaration from a Read By Type Response entry (Vol 3, Part G, §3.3.1):
/// the declaration's handle, then its value: properties (1), value handle (2), UUID (2 or 16).
public struct GATTCharacteristic: Equatable, Sendable {
    public var declaration: UInt16
    public var properties: UInt8
    public var valueHandle: UInt16
    public var uuid: GATTUUID

    public init(declaration: UInt16, properties: UInt8, valueHandle: UInt16, uuid: GATTUUID) {
        self.declaration = declaration; self.properties = properties; self.valueHandle = valueHandle; self.uuid = uuid
    }

    /// §3.3.1.1 Characteristic Properties bits.
    public static let read: UInt8 = 0x02, writeWithoutResponse: UInt8 = 0x04, write: UInt8 = 0x08
    public static let notify: UInt8 = 0x10, indicate: UInt8 = 0x20

    /// `entry`: the 7 or 21 bytes of one entry.
    public static func decode(_ entry: UnsafeRawBufferPointer, at offset: Int = 0) throws(WireError) -> GATTCharacteristic {
        var r = ByteReader(entry)
        let declaration = try r.readU16LE(), properties = try r.readU8(), valueHandle = try r.readU16LE()
        guard let uuid = GATTUUID(little: r.readRest()) else { throw .malformed(at: offset &+ 5, .gattDeclaration) }
        return GATTCharacteristic(declaration: declaration, properties: properties, valueHandle: valueHandle, uuid: uuid)
    }
}

/// A descriptor from a Find Information Response entry: handle (2) and type (2 or 16).
public struct GATTDescriptor: Equatable, Sendable {
    public var handle: UInt16
    public var uuid: GATTUUID

    public init(handle: UInt16, uuid: GATTUUID) { self.handle = handle; self.uuid = uuid }

    public static func decode(_ entry: UnsafeRawBufferPointer, at offset: Int = 0) throws(WireError) -> GATTDescriptor {
        var r = ByteReader(entry)
        let handle = try r.readU16LE()
        guard let uuid = GATTUUID(little: r.readRest()) else { throw .malformed(at: offset &+ 2, .gattDeclaration) }
        return GATTDescriptor(handle: handle, uuid: uuid)
    }
}
