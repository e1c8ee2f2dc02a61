// The two halves of one stream direction (docs/protocol.md §5.3): `StreamSender` keeps what
// it sent until the peer acknowledges it, within the peer's window and its own capacity;
// `StreamReceiver` takes frames in order only. Each test reads like a rule of §5.3.
//
// `#expect(s.canSend == true)` rather than `#expect(s.canSend)`: #expect takes a bare property
// access apart to print its base, which needs a copy, and a `StreamSender` is ~Copyable.

import Testing
import BatonRelay

/// Pushes `bytes` as the next frame; returns its number.
private func push(_ sender: inout StreamSender, _ bytes: [UInt8]) -> UInt32 {
    bytes.withUnsafeBytes { sender.push($0) }
}

/// The bytes the sender keeps for frame `n`, copied out.
private func kept(_ sender: borrowing StreamSender, _ n: UInt32) -> [UInt8] {
    Array(sender.frame(n))
}

/// Frame `n`'s bytes in these tests: its length and content both depend on `n`, so a frame
/// read from the wrong slot or with the wrong count cannot pass for the right one.
private func bytes(of n: UInt32, maxData: Int) -> [UInt8] {
    let count = 1 + Int(n) % maxData
    return (0..<count).map { UInt8(truncatingIfNeeded: Int(n) &* 31 &+ $0) }
}

@Suite("Stream windows (docs/protocol.md §5.3)")
struct StreamWindowTests {

    // MARK: - Open

    @Test("§5.3 open: the peer's window and max data, clamped to what this side keeps")
    func peerOpenedClampsToCapacity() {
        var s = StreamSender(capacity: 4, maxData: 100)
        #expect(s.opened == false)
        s.peerOpened(window: 1024, maxData: 65535)
        #expect(s.opened == true)
        #expect(s.window == 4 && s.maxData == 100)
        // A smaller peer is taken as it is; a repeated open (the broker lost ours) is fine.
        s.peerOpened(window: 2, maxData: 50)
        #expect(s.window == 2 && s.maxData == 50)
        // Exactly the capacity: taken as it is.
        s.peerOpened(window: 4, maxData: 100)
        #expect(s.window == 4 && s.maxData == 100)
    }

    @Test("No data before the peer's open, none past its window, none after close")
    func canSend() throws {
        var s = StreamSender(capacity: 8, maxData: 16)
        #expect(s.canSend == false, "before the peer's open nothing may go out")
        s.peerOpened(window: 2, maxData: 16)
        #expect(s.canSend == true)
        #expect(push(&s, [1]) == 0)
        #expect(s.canSend == true)
        #expect(push(&s, [2]) == 1)
        #expect(s.inFlight == 2)
        #expect(s.canSend == false, "two frames in flight fill a window of 2")
        #expect(try s.acknowledge(next: 1, window: 2))
        #expect(s.canSend == true, "the ack freed one frame of the window")
        s.close()
        #expect(s.canSend == false, "after close no more data, whatever the window")
    }

    @Test("Capacity + 1: a peer window larger than the capacity lets exactly capacity frames out")
    func capacityPlusOne() throws {
        var s = StreamSender(capacity: 3, maxData: 4)
        s.peerOpened(window: 4, maxData: 4)
        for n in 0..<3 {
            #expect(s.canSend == true)
            #expect(push(&s, [UInt8(n)]) == UInt32(n))
        }
        #expect(s.canSend == false, "the 4th frame would overwrite the 1st, still unacknowledged")
        #expect(kept(s, 0) == [0], "frame 0 is still kept for resending")
    }

    @Test("Our bugs are preconditions: a push past the window or max data, a frame already acknowledged")
    func preconditions() async {
        await #expect(processExitsWith: .failure) {
            var s = StreamSender(capacity: 2, maxData: 4)
            _ = [UInt8(1)].withUnsafeBytes { s.push($0) }  // not opened
        }
        await #expect(processExitsWith: .failure) {
            var s = StreamSender(capacity: 2, maxData: 4)
            s.peerOpened(window: 2, maxData: 2)
            _ = [UInt8](repeating: 0, count: 3).withUnsafeBytes { s.push($0) }  // over the peer's max data
        }
        await #expect(processExitsWith: .failure) {
            var s = StreamSender(capacity: 2, maxData: 4)
            s.peerOpened(window: 2, maxData: 4)
            _ = [UInt8(1)].withUnsafeBytes { s.push($0) }
            _ = try? s.acknowledge(next: 1, window: 2)
            _ = s.frame(0)  // acknowledged: no longer kept
        }
    }

    // MARK: - Keeping frames for go-back-N

    @Test("Every unacknowledged frame keeps its exact bytes as the ring wraps (capacity 3, 10 frames)")
    func framesSurviveRingWrap() throws {
        let maxData = 5
        var s = StreamSender(capacity: 3, maxData: maxData)
        s.peerOpened(window: 3, maxData: UInt16(maxData))
        var pushed: UInt32 = 0
        // Acks of 1 or 2 frames at a time, so the unacknowledged run starts at every slot.
        var ackStep: UInt32 = 1
        while pushed < 10 {
            while s.canSend, pushed < 10 {
                #expect(push(&s, bytes(of: pushed, maxData: maxData)) == pushed)
                pushed += 1
            }
            for n in s.unacked..<s.next {
                #expect(kept(s, n) == bytes(of: n, maxData: maxData), "frame \(n) after \(pushed) pushed")
            }
            let to = min(s.unacked + ackStep, s.next)
            #expect(try s.acknowledge(next: to, window: 3))
            ackStep = ackStep == 1 ? 2 : 1
            // What is still unacknowledged is untouched by the ack.
            for n in s.unacked..<s.next {
                #expect(kept(s, n) == bytes(of: n, maxData: maxData), "frame \(n) after the ack to \(to)")
            }
        }
        #expect(s.next == 10)
    }

    // MARK: - Acks

    @Test("§5.3 ack: cumulative; new ground is progress, an old or equal ack is not, one past what was sent is a violation")
    func acknowledge() throws {
        var s = StreamSender(capacity: 3, maxData: 2)
        s.peerOpened(window: 3, maxData: 2)
        for n in 0..<3 { _ = push(&s, [UInt8(n)]) }

        #expect(try s.acknowledge(next: 2, window: 3), "frames 0 and 1 acknowledged")
        #expect(s.unacked == 2 && s.inFlight == 1)
        #expect(try !s.acknowledge(next: 2, window: 3), "the same ack again moves nothing")
        #expect(try !s.acknowledge(next: 1, window: 3), "an older ack (delivered again) moves nothing")
        #expect(s.unacked == 2)

        // One past the frames sent: no peer keeping §5.3 says that. Nothing changes.
        #expect(throws: StreamViolation.self) { try s.acknowledge(next: 4, window: 1) }
        #expect(s.unacked == 2 && s.window == 3)
        // Everything sent, exactly: fine.
        #expect(try s.acknowledge(next: 3, window: 3))
        #expect(s.allAcknowledged == true)
    }

    @Test("An old ack after the ring wrapped is still old, not an ack beyond what was sent")
    func oldAckAfterWrap() throws {
        var s = StreamSender(capacity: 3, maxData: 1)
        s.peerOpened(window: 3, maxData: 1)
        for n in 0..<8 {
            _ = push(&s, [UInt8(n)])
            #expect(try s.acknowledge(next: UInt32(n + 1), window: 3))
        }
        _ = push(&s, [8])
        // Frame 2 lived in the slot frame 8 lives in now.
        #expect(try !s.acknowledge(next: 2, window: 1))
        #expect(try !s.acknowledge(next: 0, window: 1))
        #expect(s.unacked == 8 && s.next == 9)
        #expect(s.window == 3, "a stale ack does not set the window either")
        #expect(kept(s, 8) == [8])
    }

    @Test("§5.3 ack: the window it carries replaces the peer's, within the capacity")
    func ackSetsWindow() throws {
        var s = StreamSender(capacity: 4, maxData: 2)
        s.peerOpened(window: 4, maxData: 2)
        _ = push(&s, [0])
        _ = push(&s, [1])
        // No new frames acknowledged, but a smaller window: the reader fell behind.
        #expect(try !s.acknowledge(next: 0, window: 1))
        #expect(s.window == 1)
        #expect(s.canSend == false, "2 in flight, window 1")
        #expect(try s.acknowledge(next: 2, window: 1))
        #expect(s.canSend == true)
        _ = push(&s, [2])
        #expect(s.canSend == false)
        // The window opens again, up to what this side keeps.
        #expect(try !s.acknowledge(next: 2, window: 500))
        #expect(s.window == 4)
        #expect(s.canSend == true)
    }

    // MARK: - Close

    @Test("§5.3 close: says one past the last frame and is acknowledged with it")
    func close() throws {
        var s = StreamSender(capacity: 4, maxData: 2)
        s.peerOpened(window: 4, maxData: 2)
        _ = push(&s, [0])
        _ = push(&s, [1])
        #expect(s.closeEnd == nil)
        s.close()
        #expect(s.closeEnd == 2)
        s.close()
        #expect(s.closeEnd == 2, "saying close again changes nothing")
        #expect(s.allAcknowledged == false, "frames 0 and 1 are not acknowledged yet")
        #expect(try s.acknowledge(next: 1, window: 4))
        #expect(s.allAcknowledged == false)
        // The frames before the close are still kept for resending.
        #expect(kept(s, 1) == [1])
        #expect(try s.acknowledge(next: 2, window: 4))
        #expect(s.allAcknowledged == true)
        // Nothing past the close was sent: an ack beyond it is a violation.
        #expect(throws: StreamViolation.self) { try s.acknowledge(next: 3, window: 4) }
    }

    // MARK: - Receiver

    @Test("§5.3 data: the next frame is taken, an older one is a duplicate, a later one is after a gap")
    func arrive() {
        var r = StreamReceiver()
        #expect(r.arrive(1) == .gap, "frame 0 was lost")
        #expect(r.next == 0)
        #expect(r.arrive(0) == .inOrder)
        #expect(r.arrive(1) == .inOrder)
        #expect(r.arrive(0) == .duplicate)
        #expect(r.arrive(1) == .duplicate)
        #expect(r.arrive(3) == .gap)
        #expect(r.next == 2)
        #expect(r.arrive(2) == .inOrder)
        #expect(r.next == 3)
    }

    @Test("§5.3 close: the same close twice is fine; another end, or fewer frames than arrived, is a violation")
    func closedEnd() throws {
        var r = StreamReceiver()
        for n: UInt32 in 0..<3 { #expect(r.arrive(n) == .inOrder) }
        #expect(throws: StreamViolation.self) { try r.closed(end: 2) }
        #expect(r.closeEnd == nil, "a refused close is not kept")

        try r.closed(end: 5)
        #expect(r.closeEnd == 5)
        try r.closed(end: 5)  // resent by the peer: fine
        #expect(throws: StreamViolation.self) { try r.closed(end: 4) }
        #expect(throws: StreamViolation.self) { try r.closed(end: 6) }
        #expect(r.closeEnd == 5)
    }

    @Test("Finished once the peer closed and every frame up to its close arrived")
    func finished() throws {
        var r = StreamReceiver()
        #expect(!r.finished)
        #expect(r.arrive(0) == .inOrder)
        try r.closed(end: 3)  // the close overtook frames 1 and 2
        #expect(!r.finished)
        #expect(r.arrive(2) == .gap)
        #expect(r.arrive(1) == .inOrder)
        #expect(!r.finished)
        #expect(r.arrive(2) == .inOrder)
        #expect(r.finished)

        var empty = StreamReceiver()
        try empty.closed(end: 0)
        #expect(empty.finished, "a direction closed before any data is finished at once")
    }
}

@Suite("The queue of endpoint frames waiting for the link (docs/relay.md §7.3)")
struct LinkQueueTests {
    @Test("Capacity + 1: capacity frames wait, in order, each with its own length; one more, or one too long, is refused")
    func capacityAndOrder() {
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: LinkQueue.bytes(capacity: 3, maxFrame: 5), alignment: 8)
        defer { storage.deallocate() }
        var q = LinkQueue(storage: storage, capacity: 3, maxFrame: 5)
        #expect(q.isEmpty && q.first == nil)
        let frames: [[UInt8]] = [[1], [2, 2, 2, 2, 2], []]
        for f in frames { #expect(f.withUnsafeBytes { q.push($0) }) }
        #expect(![UInt8](repeating: 9, count: 1).withUnsafeBytes { q.push($0) }, "capacity + 1")
        var out: [[UInt8]] = []
        if let f = q.first { out.append(Array(f)) }
        q.pop()
        #expect([UInt8](repeating: 6, count: 6).withUnsafeBytes { !q.push($0) }, "longer than maxFrame")
        #expect([UInt8]([7, 7]).withUnsafeBytes { q.push($0) }, "a freed place takes the next, behind the others (it wraps)")
        while let f = q.first { out.append(Array(f)); q.pop() }
        #expect(out == frames + [[7, 7]])
        #expect(q.count == 0)
    }
}
