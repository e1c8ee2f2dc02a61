// AD structures: Core 5.4, Vol 3, Part C, §11 ("Advertising and Scan Response data format").
// Each structure is Length (1) | AD Type (1) | AD Data (Length - 1). The significant part
// may be followed by a non-significant part that "shall contain all-zero octets": a zero
// length followed only by zeros ends the data cleanly; a zero length followed by anything
// else, or a length running past the end, is a typed error.

/// AD types Baton reads. Assigned Numbers §2.3.
public enum ADType {
    public static let flags: UInt8 = 0x01
    public static let incomplete16BitUUIDs: UInt8 = 0x02
    public static let complete16BitUUIDs: UInt8 = 0x03
    public static let shortenedLocalName: UInt8 = 0x08
    public static let completeLocalName: UInt8 = 0x09
    public static let txPowerLevel: UInt8 = 0x0A
    public static let serviceData16: UInt8 = 0x16
    public static let manufacturerSpecificData: UInt8 = 0xFF
}

/// One AD structure, borrowed from the advertisement it came from.
public struct ADStructure {
    /// Offset of the Length byte within the advertising data.
    public let offset: Int
    public let type: UInt8
    public let data: UnsafeRawBufferPointer

    @inlinable
    public init(offset: Int, type: UInt8, data: UnsafeRawBufferPointer) {
        self.offset = offset; self.type = type; self.data = data
    }
}

extension Malformed {
    /// A zero Length byte followed by non-zero bytes.
    public static let adZeroLength = Malformed("ad-zero-length")
    /// A Length byte running past the end of the advertising data.
    public static let adOverlong = Malformed("ad-overlong")
}

/// Walks AD structures, yielding only complete ones (after BTstack's `ad_parser.c`).
/// After an error, `next()` returns nil: no endless loop on any input.
public struct ADIterator {
    @usableFromInline var reader: ByteReader
    @usableFromInline var failed = false

    @inlinable
    public init(_ data: UnsafeRawBufferPointer) { reader = ByteReader(data) }

    // Always inlined, for the reason AdvertisementContent.decode is: a returned ADStructure
    // read back whole stalled on the stores that built it.
    @inlinable @inline(__always)
    public mutating func next() throws(WireError) -> ADStructure? {
        guard !failed, !reader.isAtEnd else { return nil }
        let start = reader.offset
        // Proof: not at end, so one byte remains.
        let length = Int(try reader.peekU8())
        if length == 0 {
            // §11: the non-significant part is all zeros. Anything else is malformed.
            let rest = reader.readRest()
            for i in rest.indices where rest[i] != 0 {
                failed = true
                throw .malformed(at: start &+ i, .adZeroLength)
            }
            return nil
        }
        guard length < reader.remaining else {
            failed = true
            throw .malformed(at: start, .adOverlong)
        }
        _ = try reader.readU8()
        let type = try reader.readU8()
        let data = try reader.readBytes(length &- 1)
        return ADStructure(offset: start, type: type, data: data)
    }

    /// Proves every structure fits, without keeping any (the "fixed part, then tail" walk).
    @inlinable
    public static func validate(_ data: UnsafeRawBufferPointer) throws(WireError) -> Int {
        var it = ADIterator(data)
        var n = 0
        while try it.next() != nil { n &+= 1 }
        return n
    }
}

extension ADStructure {
    /// For manufacturer-specific data (type 0xFF): the company identifier, little-endian,
    /// and the bytes after it. Nil for other types or a value shorter than two bytes.
    @inlinable
    public var manufacturer: (companyID: UInt16, value: UnsafeRawBufferPointer)? {
        guard type == ADType.manufacturerSpecificData, data.count >= 2 else { return nil }
        let id = UInt16(data[0]) | UInt16(data[1]) << 8
        return (id, UnsafeRawBufferPointer(rebasing: data[2...]))
    }
}
