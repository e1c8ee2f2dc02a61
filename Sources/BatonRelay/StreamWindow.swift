// The two halves of one stream direction (docs/protocol.md §5.3), shared by the gateway (the
// device's frames towards the endpoint) and by `baton stream` (stdin towards the device):
//
//   StreamSender    keeps every frame sent and not yet acknowledged, at most the peer's
//                   window, so a frame lost with a broker restart is sent again (go-back-N);
//   StreamReceiver  takes frames in order only and says what to do with the others.
//
// Frame numbers are 32 bits and count from 0; at one 64 KiB frame each that is 256 TiB per
// direction, so they never wrap within a stream.

/// A frame from the peer that breaks §5.3: the stream ends with error `protocol`.
public struct StreamViolation: Error, Sendable, Equatable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

public struct StreamSender: ~Copyable {
    /// Frames and bytes per frame this side keeps: its promise, allocated once.
    public let capacity: Int
    public let capacityMaxData: Int
    let storage: UnsafeMutableRawBufferPointer
    /// False for storage lent by the owner of many senders (the gateway's, taken at start).
    let ownsStorage: Bool
    var counts: [Int]

    /// The peer's window and max data (its open, then its acks), within the capacity.
    public private(set) var window: Int
    public private(set) var maxData: Int
    public private(set) var opened = false
    /// The first frame not acknowledged, and the next new frame's number.
    public private(set) var unacked: UInt32 = 0
    public private(set) var next: UInt32 = 0
    /// One past the last data frame, once this side has said close.
    public private(set) var closeEnd: UInt32?
    /// An ack up to the close arrived after the close was said: the peer has it. Until then
    /// the close is resent like data (an ack sent before the close proves nothing about it).
    public private(set) var closeAcknowledged = false

    public init(capacity: Int, maxData: Int) {
        precondition(capacity > 0 && maxData > 0, "a stream keeps at least one frame of one byte")
        self.capacity = capacity
        self.capacityMaxData = maxData
        storage = .allocate(byteCount: capacity * maxData, alignment: 8)
        ownsStorage = true
        counts = Array(repeating: 0, count: capacity)
        window = 0
        self.maxData = 0
    }

    /// Keeps its frames in `storage` (at least capacity × maxData bytes), which the caller owns
    /// and keeps alive longer than this sender.
    public init(storage: UnsafeMutableRawBufferPointer, capacity: Int, maxData: Int) {
        precondition(capacity > 0 && maxData > 0, "a stream keeps at least one frame of one byte")
        precondition(storage.count >= capacity * maxData, "the lent storage holds capacity × maxData bytes")
        self.capacity = capacity
        self.capacityMaxData = maxData
        self.storage = storage
        ownsStorage = false
        counts = Array(repeating: 0, count: capacity)
        window = 0
        self.maxData = 0
    }

    deinit { if ownsStorage { storage.deallocate() } }

    /// As new, for the next stream of the slot that lent the storage: nothing kept, no peer yet.
    public mutating func reset() {
        window = 0
        maxData = 0
        opened = false
        unacked = 0
        next = 0
        closeEnd = nil
        closeAcknowledged = false
    }

    /// The peer's open: how much it takes. Clamped to what this side keeps.
    public mutating func peerOpened(window: UInt16, maxData: UInt16) {
        self.window = min(Int(window), capacity)
        self.maxData = min(Int(maxData), capacityMaxData)
        opened = true
    }

    /// Frames sent and not acknowledged.
    public var inFlight: Int { Int(next &- unacked) }  // Proof: unacked ≤ next always.
    /// Another frame may go out now.
    public var canSend: Bool { opened && closeEnd == nil && inFlight < window }
    /// Everything sent (the close included, if said) is acknowledged.
    public var allAcknowledged: Bool { unacked == next && (closeEnd == nil || closeAcknowledged) }

    /// Keeps `bytes` (1 … `maxData`) as the next frame and returns its number.
    public mutating func push(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        precondition(canSend && !bytes.isEmpty && bytes.count <= maxData, "push only what the window and max data allow")
        let n = next
        let slot = Int(n % UInt32(capacity))
        UnsafeMutableRawBufferPointer(rebasing: storage[slot * capacityMaxData ..< slot * capacityMaxData + bytes.count])
            .copyMemory(from: bytes)
        counts[slot] = bytes.count
        next &+= 1  // Proof: 2³² frames per direction is never reached (see the top).
        return n
    }

    /// The bytes of frame `n`, kept until acknowledged.
    public func frame(_ n: UInt32) -> UnsafeRawBufferPointer {
        precondition(n &- unacked < next &- unacked, "only unacknowledged frames are kept")
        let slot = Int(n % UInt32(capacity))
        return UnsafeRawBufferPointer(rebasing: storage[slot * capacityMaxData ..< slot * capacityMaxData + counts[slot]])
    }

    /// This side sends no more data: the close frame says `next`.
    public mutating func close() {
        if closeEnd == nil { closeEnd = next }
    }

    /// The peer's ack: every frame before `next` arrived and was consumed. Returns true when it
    /// acknowledged something new; an older ack (a duplicate) changes nothing.
    public mutating func acknowledge(next acked: UInt32, window: UInt16) throws(StreamViolation) -> Bool {
        guard acked &- unacked <= next &- unacked else {
            // Before what was already acknowledged: an old ack the broker delivered again.
            // Beyond what was sent: no peer that keeps §5.3 says that.
            if acked &- next < 0x8000_0000 {
                throw StreamViolation("an ack for frame \(acked) when frames \(unacked)..<\(next) were sent")
            }
            return false
        }
        self.window = min(Int(window), capacity)
        if let closeEnd, acked == closeEnd { closeAcknowledged = true }
        guard acked != unacked else { return false }
        unacked = acked
        return true
    }
}

public struct StreamReceiver: Sendable, Equatable {
    /// The next frame expected: everything before it has arrived.
    public private(set) var next: UInt32 = 0
    /// The peer's close: one past its last data frame.
    public private(set) var closeEnd: UInt32?

    public init() {}

    public enum Arrival: Sendable, Equatable {
        /// The next frame: take it.
        case inOrder
        /// Already taken (a resend): drop it and acknowledge again.
        case duplicate
        /// After a gap (a frame lost on the way): drop it; the sender resends from the gap.
        case gap
    }

    /// Where data frame `n` stands; `.inOrder` advances `next`.
    public mutating func arrive(_ n: UInt32) -> Arrival {
        if n == next {
            next &+= 1  // Proof: see StreamSender, frame numbers never wrap.
            return .inOrder
        }
        return n &- next < 0x8000_0000 ? .gap : .duplicate
    }

    /// The peer's close. A close that contradicts an earlier one, or says fewer frames than
    /// already arrived, breaks §5.3.
    public mutating func closed(end: UInt32) throws(StreamViolation) {
        if let closeEnd, closeEnd != end { throw StreamViolation("close at \(end) after close at \(closeEnd)") }
        guard end &- next < 0x8000_0000 else { throw StreamViolation("close at \(end) after frame \(next &- 1) arrived") }
        closeEnd = end
    }

    /// The peer closed and every frame up to its close arrived.
    public var finished: Bool { closeEnd == next }
}

/// The endpoint's frames the link could not take yet, in order, waiting for the device's
/// credits (an L2CAP channel with none left refuses a send: docs/protocol.md §5.3). The
/// endpoint is told a window of at most `capacity`, so every frame it may have in flight fits:
/// none is dropped for the link being slow, and none waits for the endpoint's resend timer.
/// Storage is lent (taken once at start, like the kept frames); each frame's length is kept in
/// its first four bytes.
public struct LinkQueue: ~Copyable {
    public let capacity: Int
    let frameBytes: Int
    let storage: UnsafeMutableRawBufferPointer
    var head = 0
    public private(set) var count = 0

    /// `storage` holds at least capacity × (4 + maxFrame) bytes and outlives the queue.
    public init(storage: UnsafeMutableRawBufferPointer, capacity: Int, maxFrame: Int) {
        precondition(capacity > 0 && maxFrame > 0 && storage.count >= capacity * (4 + maxFrame),
                     "the lent storage holds capacity × (4 + maxFrame) bytes")
        self.capacity = capacity
        self.frameBytes = 4 + maxFrame
        self.storage = storage
    }

    public static func bytes(capacity: Int, maxFrame: Int) -> Int { capacity * (4 + maxFrame) }

    /// Empty, for the next stream of the slot that lent the storage.
    public mutating func reset() {
        head = 0
        count = 0
    }

    public var isEmpty: Bool { count == 0 }

    /// Appends a copy of `frame`; false when the queue is full or the frame too long.
    public mutating func push(_ frame: UnsafeRawBufferPointer) -> Bool {
        guard count < capacity, frame.count <= frameBytes - 4 else { return false }
        let at = ((head + count) % capacity) * frameBytes
        storage.storeBytes(of: UInt32(frame.count), toByteOffset: at, as: UInt32.self)
        if let base = frame.baseAddress, frame.count > 0 {
            (storage.baseAddress! + at + 4).copyMemory(from: base, byteCount: frame.count)
        }
        count += 1
        return true
    }

    /// The oldest frame, valid until the next `push` or `pop`.
    public var first: UnsafeRawBufferPointer? {
        guard count > 0 else { return nil }
        let at = head * frameBytes
        let n = Int(storage.loadUnaligned(fromByteOffset: at, as: UInt32.self))
        return UnsafeRawBufferPointer(start: storage.baseAddress! + at + 4, count: n)
    }

    public mutating func pop() {
        guard count > 0 else { return }
        head = (head + 1) % capacity
        count -= 1
    }
}
