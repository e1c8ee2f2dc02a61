// Writes into a caller-owned buffer (architecture.md §5.4): an encoder computes its length,
// calls `reserve(_:)` once (which throws `.noRoom`), then writes. Writing past what it
// reserved is the encoder's bug, so the write verbs `precondition` instead of throwing.

public struct ByteWriter {
    public let buffer: UnsafeMutableRawBufferPointer
    /// Bytes written so far.
    @inlinable public var count: Int { _count }
    @usableFromInline var _count: Int
    @usableFromInline var reserved: Int

    @inlinable
    public init(_ buffer: UnsafeMutableRawBufferPointer) {
        self.buffer = buffer
        self._count = 0
        self.reserved = 0
    }

    @inlinable public var capacity: Int { buffer.count }
    @inlinable public var available: Int { buffer.count &- count }
    /// What has been written, borrowed.
    @inlinable public var written: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: buffer[..<count]) }

    /// Promises that `need` more bytes will be written; throws if the buffer lacks room.
    @inlinable
    public mutating func reserve(_ need: Int) throws(WireError) {
        guard need >= 0, need <= available else { throw .noRoom(need: count &+ need, have: capacity) }
        reserved = count &+ need
    }

    @inlinable
    public mutating func write(_ v: UInt8) {
        precondition(count < reserved, "encoder wrote past the length it computed")
        buffer[count] = v
        _count &+= 1
    }

    @inlinable
    public mutating func writeU16LE(_ v: UInt16) { write(UInt8(truncatingIfNeeded: v)); write(UInt8(truncatingIfNeeded: v >> 8)) }
    @inlinable
    public mutating func writeU16BE(_ v: UInt16) { write(UInt8(truncatingIfNeeded: v >> 8)); write(UInt8(truncatingIfNeeded: v)) }
    @inlinable
    public mutating func writeU24LE(_ v: UInt32) {
        write(UInt8(truncatingIfNeeded: v)); write(UInt8(truncatingIfNeeded: v >> 8)); write(UInt8(truncatingIfNeeded: v >> 16))
    }
    @inlinable
    public mutating func writeU32LE(_ v: UInt32) { writeU16LE(UInt16(truncatingIfNeeded: v)); writeU16LE(UInt16(truncatingIfNeeded: v >> 16)) }
    @inlinable
    public mutating func writeU32BE(_ v: UInt32) { writeU16BE(UInt16(truncatingIfNeeded: v >> 16)); writeU16BE(UInt16(truncatingIfNeeded: v)) }
    @inlinable
    public mutating func writeU64LE(_ v: UInt64) { writeU32LE(UInt32(truncatingIfNeeded: v)); writeU32LE(UInt32(truncatingIfNeeded: v >> 32)) }
    @inlinable
    public mutating func writeU64BE(_ v: UInt64) { writeU32BE(UInt32(truncatingIfNeeded: v >> 32)); writeU32BE(UInt32(truncatingIfNeeded: v)) }

    @inlinable
    public mutating func write(_ bytes: UnsafeRawBufferPointer) {
        precondition(bytes.count <= reserved &- count, "encoder wrote past the length it computed")
        if let base = bytes.baseAddress, bytes.count > 0 {
            (buffer.baseAddress! + count).copyMemory(from: base, byteCount: bytes.count)
        }
        _count &+= bytes.count
    }

    @inlinable
    public mutating func write<let N: Int>(_ bytes: InlineArray<N, UInt8>) {
        for i in bytes.indices { write(bytes[i]) }
    }

    /// Overwrites a byte already written, e.g. a length known only afterwards.
    @inlinable
    public mutating func patch(_ v: UInt8, at index: Int) {
        precondition(index >= 0 && index < count, "patch outside what was written")
        buffer[index] = v
    }
}
