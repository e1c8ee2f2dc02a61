// The protobuf wire format, as much of it as ESPHome's native API uses (protobuf.dev,
// "Encoding"): varints, zigzag for sint32, length-delimited fields; fixed32/fixed64 only to be
// skipped. Reads go through ByteReader over borrowed bytes and never trap; writes go through
// ByteWriter into the caller's buffer after the length is computed (architecture.md §5.1, §5.4).
import BatonWire

extension Malformed {
    /// A varint of more than 10 bytes, or a 10th byte above 1: more than 64 bits.
    public static let varintTooLong = Malformed("protobuf varint longer than 64 bits")
    /// Wire types 3 and 4 (groups, which proto3 and ESPHome never use), 6 and 7 (undefined).
    public static let wireType = Malformed("protobuf wire type that ESPHome does not use")
    /// Field number 0 is reserved (protobuf.dev "Encoding": field numbers start at 1).
    public static let fieldZero = Malformed("protobuf field number 0")
}

public enum Protobuf {
    /// The wire types of a field's tag (the tag's low 3 bits).
    public static let varint: UInt8 = 0
    public static let fixed64: UInt8 = 1
    public static let lengthDelimited: UInt8 = 2
    public static let fixed32: UInt8 = 5

    /// Reads a varint: 7 bits a byte, least significant first, high bit "more follows".
    /// Leaves the reader where it was on failure.
    @inlinable
    public static func readVarint(_ r: inout ByteReader) throws(WireError) -> UInt64 {
        var value: UInt64 = 0
        var i = 0
        while true {
            let b = try r.peekU8(at: i)
            if i == 9, b > 1 { throw .malformed(at: r.offset &+ i, .varintTooLong) }
            value |= UInt64(b & 0x7F) << UInt64(7 &* i)
            i &+= 1
            if b & 0x80 == 0 { break }
            if i == 10 { throw .malformed(at: r.offset &+ 9, .varintTooLong) }
        }
        // Proof: the loop peeked i bytes, so i <= remaining.
        try! r.skip(i)
        return value
    }

    /// Bytes a varint of `v` takes: 1 to 10.
    @inlinable
    public static func varintSize(_ v: UInt64) -> Int {
        // (64 - leading zeros + 6) / 7, at least 1.
        let bits = 64 &- v.leadingZeroBitCount
        return bits == 0 ? 1 : (bits &+ 6) / 7
    }

    @inlinable
    public static func writeVarint(_ v: UInt64, _ w: inout ByteWriter) {
        var v = v
        while v >= 0x80 {
            w.write(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        w.write(UInt8(truncatingIfNeeded: v))
    }

    /// sint32's zigzag: 0, -1, 1, -2 … → 0, 1, 2, 3 …
    @inlinable public static func zigzag(_ v: Int32) -> UInt32 { UInt32(bitPattern: (v << 1) ^ (v >> 31)) }
    @inlinable public static func unzigzag(_ v: UInt32) -> Int32 { Int32(bitPattern: v >> 1) ^ -Int32(bitPattern: v & 1) }

    // MARK: Field sizes and writes (proto3: a field equal to its default is not written)

    @inlinable public static func tagSize(_ field: UInt32) -> Int { varintSize(UInt64(field) << 3) }

    /// Size of a varint field, 0 when `v` is 0 (the default, not written).
    @inlinable public static func varintFieldSize(_ field: UInt32, _ v: UInt64) -> Int {
        v == 0 ? 0 : tagSize(field) &+ varintSize(v)
    }

    /// Size of a length-delimited field of `count` bytes, 0 when empty.
    @inlinable public static func bytesFieldSize(_ field: UInt32, _ count: Int) -> Int {
        count == 0 ? 0 : tagSize(field) &+ varintSize(UInt64(count)) &+ count
    }

    @inlinable public static func writeTag(_ field: UInt32, _ wireType: UInt8, _ w: inout ByteWriter) {
        writeVarint(UInt64(field) << 3 | UInt64(wireType), &w)
    }

    @inlinable public static func writeVarintField(_ field: UInt32, _ v: UInt64, _ w: inout ByteWriter) {
        guard v != 0 else { return }
        writeTag(field, varint, &w)
        writeVarint(v, &w)
    }

    @inlinable public static func writeBytesField(_ field: UInt32, _ bytes: UnsafeRawBufferPointer, _ w: inout ByteWriter) {
        guard bytes.count != 0 else { return }
        writeTag(field, lengthDelimited, &w)
        writeVarint(UInt64(bytes.count), &w)
        w.write(bytes)
    }
}

/// One field of a message: its number, wire type and value; a length-delimited value is
/// borrowed from the message's bytes.
public struct ProtoField {
    public let number: UInt32
    public let wireType: UInt8
    /// A varint's value, or a fixed32/fixed64's bits; 0 for a length-delimited field.
    public let value: UInt64
    /// A length-delimited field's bytes; empty otherwise.
    public let bytes: UnsafeRawBufferPointer
    /// Where the field's tag starts, for errors.
    public let at: Int
}

/// Walks a message's fields in order. Every field is read whole (an unknown one is skipped by
/// its wire type: protobuf.dev "Encoding", "Unknown fields"), so a message either walks to its
/// exact end or throws where it breaks.
public struct ProtoFieldReader {
    public var reader: ByteReader

    public init(_ bytes: UnsafeRawBufferPointer) { reader = ByteReader(bytes) }

    public mutating func next() throws(WireError) -> ProtoField? {
        guard !reader.isAtEnd else { return nil }
        let start = reader.offset
        var r = reader
        let tag = try Protobuf.readVarint(&r)
        let wireType = UInt8(truncatingIfNeeded: tag & 7)
        let number = tag >> 3
        guard number != 0 else { throw .malformed(at: start, .fieldZero) }
        // Field numbers are at most 2^29 - 1; a larger one is as unknown as any other and
        // skipped, but it must still fit the UInt32 we report it in.
        let field = UInt32(truncatingIfNeeded: min(number, UInt64(UInt32.max)))
        var value: UInt64 = 0
        var bytes = UnsafeRawBufferPointer(start: nil, count: 0)
        switch wireType {
        case Protobuf.varint:
            value = try Protobuf.readVarint(&r)
        case Protobuf.fixed64:
            value = try r.readU64LE()
        case Protobuf.fixed32:
            value = UInt64(try r.readU32LE())
        case Protobuf.lengthDelimited:
            let lengthAt = r.offset
            let length = try Protobuf.readVarint(&r)
            guard length <= UInt64(r.remaining) else { throw .badLength(at: lengthAt, length: Int(clamping: length)) }
            bytes = try r.readBytes(Int(length))
        default:
            throw .malformed(at: start, .wireType)
        }
        reader = r
        return ProtoField(number: field, wireType: wireType, value: value, bytes: bytes, at: start)
    }
}
