// ESPHome's two framings (docs/esphome.md §2), as aioesphomeapi's _frame_helper reads them:
//   plaintext: 0x00, varint body length, varint message type, body;
//   Noise:     0x01, body length as 2 bytes big-endian, body. After the handshake a body is
//              a ChaCha20-Poly1305 ciphertext of: type (2 bytes BE), length (2 bytes BE), body.
// The decoders work on whatever a receive buffer holds: a frame not yet whole is `.needMore`
// (never an error), a frame that can never be valid throws at once, before its body arrives.
import BatonWire

extension Malformed {
    /// The first byte of a frame is neither the framing this server speaks nor the other one.
    public static let indicator = Malformed("frame indicator is not the one this server speaks")
    /// A Noise transport message whose inner length disagrees with the bytes decrypted.
    public static let innerLength = Malformed("Noise message length disagrees with its frame")
}

/// What a receive buffer starts with.
public enum FrameResult: Equatable {
    /// Not a whole frame yet: receive more.
    case needMore
    /// One frame of `length` bytes from the start; `payload` is where its body (plaintext) or
    /// its ciphertext (Noise) sits, `type` its message type (plaintext only; 0 for Noise).
    case frame(type: UInt32, payload: Range<Int>, length: Int)
}

public enum PlaintextFrame {
    public static let indicator: UInt8 = 0x00

    /// Decodes the frame at the start of `bytes`. A body over `maxBody` throws `.badLength`
    /// as soon as its length is read. A message type is at most 32 bits (ESPHome's are ≤ 16).
    public static func decode(_ bytes: UnsafeRawBufferPointer, maxBody: Int) throws(WireError) -> FrameResult {
        guard !bytes.isEmpty else { return .needMore }
        guard bytes[0] == indicator else { throw .malformed(at: 0, .indicator) }
        var r = ByteReader(bytes, offset: 1)
        guard let length = try partialVarint(&r) else { return .needMore }
        guard length <= UInt64(maxBody) else { throw .badLength(at: 1, length: Int(clamping: length)) }
        let typeAt = r.offset
        guard let type = try partialVarint(&r) else { return .needMore }
        guard type <= UInt64(UInt32.max) else { throw .unsupported(at: typeAt, value: type) }
        let body = Int(length)
        guard body <= r.remaining else { return .needMore }
        return .frame(type: UInt32(type), payload: r.offset..<r.offset &+ body, length: r.offset &+ body)
    }

    /// A varint that may be cut short by the end of what has arrived: nil then.
    static func partialVarint(_ r: inout ByteReader) throws(WireError) -> UInt64? {
        var i = 0
        while i < r.remaining, i < 10 {
            // Proof: i < remaining.
            if try! r.peekU8(at: i) & 0x80 == 0 { return try Protobuf.readVarint(&r) }
            i &+= 1
        }
        if i == 10 { throw .malformed(at: r.offset &+ 9, .varintTooLong) }
        return nil
    }

    public static func headerSize(type: UInt32, bodySize: Int) -> Int {
        1 &+ Protobuf.varintSize(UInt64(bodySize)) &+ Protobuf.varintSize(UInt64(type))
    }

    /// Writes a whole frame: header, then the message's body. Throws `.noRoom` before writing.
    public static func write<M: ServerMessage>(type: UInt32, _ message: M, to w: inout ByteWriter) throws(WireError) {
        let size = message.bodySize
        try w.reserve(headerSize(type: type, bodySize: size) &+ size)
        w.write(indicator)
        Protobuf.writeVarint(UInt64(size), &w)
        Protobuf.writeVarint(UInt64(type), &w)
        message.writeBody(&w)
    }
}

public enum NoiseFrame {
    public static let indicator: UInt8 = 0x01
    public static let headerSize = 3
    /// ChaCha20-Poly1305's tag, after every transport ciphertext.
    public static let tagSize = 16
    /// The type and length before a transport message's body.
    public static let innerHeaderSize = 4
    /// The largest frame body: the 2-byte length's range.
    public static let maxBody = 0xFFFF

    /// Decodes the frame at the start of `bytes`; a body over `maxBody` bytes (the receive
    /// buffer's room) throws `.badLength` once the header is in.
    public static func decode(_ bytes: UnsafeRawBufferPointer, maxBody: Int) throws(WireError) -> FrameResult {
        guard !bytes.isEmpty else { return .needMore }
        guard bytes[0] == indicator else { throw .malformed(at: 0, .indicator) }
        guard bytes.count >= headerSize else { return .needMore }
        let length = Int(bytes[1]) << 8 | Int(bytes[2])
        guard length <= maxBody else { throw .badLength(at: 1, length: length) }
        guard length <= bytes.count &- headerSize else { return .needMore }
        return .frame(type: 0, payload: headerSize..<headerSize &+ length, length: headerSize &+ length)
    }

    /// A decrypted transport message: type (2 bytes BE), length (2 bytes BE), then exactly
    /// that many bytes of body. Returns the type and where the body is.
    public static func decodeMessage(_ plaintext: UnsafeRawBufferPointer) throws(WireError) -> (type: UInt32, body: Range<Int>) {
        var r = ByteReader(plaintext)
        let type = try r.readU16BE()
        let length = Int(try r.readU16BE())
        guard length == r.remaining else { throw .malformed(at: 2, .innerLength) }
        return (UInt32(type), innerHeaderSize..<innerHeaderSize &+ length)
    }
}
