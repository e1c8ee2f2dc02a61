// H4 framing: Core 5.4, Vol 4, Part A, §2 (packet indicators) and Vol 4, Part E, §5.4
// (packet headers). Framers are drip-fed byte by byte between guard bytes and fed in every
// possible two- and three-way split (architecture.md §5.8).
import Testing
import BatonTestSupport
import BatonHCI

/// Feeds chunks to a framer and collects every frame (indicator included) it delivers.
struct FramerRun {
    var frames: [[UInt8]] = []
    var types: [H4PacketType] = []
    var stats = H4FramerStats()
    var pending = 0

    init(maxDataPayload: Int = H4Framer.defaultMaxDataPayload, chunks: [[UInt8]]) {
        var framer = H4Framer(maxDataPayload: maxDataPayload)
        for chunk in chunks {
            chunk.withUnsafeBytes { buf in
                framer.push(buf) { packet in
                    #expect(packet.frame.count == packet.bytes.count + 1)
                    #expect(packet.frame[0] == packet.type.rawValue)
                    frames.append(Array(packet.frame))
                    types.append(packet.type)
                }
            }
        }
        stats = framer.stats
        pending = framer.pendingBytes
    }
}

@Suite struct H4FramerTests {
    // One packet of each kind (Vol 4, Part E, §5.4.1–§5.4.5).
    static let command = hx("01 0c20 02 0100")            // LE Set Scan Enable (0x200C)
    static let acl = hx("02 4020 0700 0300 0400 0a0100")  // handle 0x040, PB 2, ATT read req
    static let sco = hx("03 0100 03 aabbcc")
    static let event = hx("04 0e 04 01 0c20 00")          // Command Complete, LE Set Scan Enable, success
    static let emptyEvent = hx("04 ff 00")               // vendor event, no parameters
    // ISO: the length field's top two bits are RFU (§5.4.5): 0xC005 means 5 bytes.
    static let iso = hx("05 6000 05c0 0102030405")

    static var all: [UInt8] { command + acl + sco + event + emptyEvent + iso }
    static let expected = [command, acl, sco, event, emptyEvent, iso]
    // Guard bytes: none is a valid indicator (0x01…0x05).
    static let before = hx("00 ff 06 80 7f")
    static let after = hx("00 ee")

    @Test func eachPacketTypeInOneChunk() {
        let run = FramerRun(chunks: [Self.all])
        #expect(run.frames == Self.expected)
        #expect(run.types == [.command, .acl, .sco, .event, .event, .iso])
        #expect(run.stats.packets == 6)
        #expect(run.stats.garbageBytes == 0)
        #expect(run.pending == 0)
    }

    @Test func dripFedByteByByteBetweenGuardBytes() {
        let stream = Self.before + Self.all + Self.after
        let run = FramerRun(chunks: stream.map { [$0] })
        #expect(run.frames == Self.expected)
        #expect(run.stats.garbageBytes == Self.before.count + Self.after.count)
        // Every byte is accounted for: delivered + skipped + pending.
        #expect(run.frames.reduce(0) { $0 + $1.count } + run.stats.garbageBytes + run.pending == stream.count)
    }

    @Test func everyTwoWaySplit() {
        let stream = Self.before + Self.all + Self.after
        for i in 0 ... stream.count {
            let run = FramerRun(chunks: [Array(stream[..<i]), Array(stream[i...])])
            #expect(run.frames == Self.expected, "split at \(i)")
            #expect(run.stats.garbageBytes == Self.before.count + Self.after.count, "split at \(i)")
        }
    }

    @Test func everyThreeWaySplit() {
        let stream = Self.before + Self.command + Self.event + Self.acl + Self.after
        for i in 0 ... stream.count {
            for j in i ... stream.count {
                let run = FramerRun(chunks: [Array(stream[..<i]), Array(stream[i ..< j]), Array(stream[j...])])
                #expect(run.frames == [Self.command, Self.event, Self.acl], "split at \(i), \(j)")
            }
        }
    }

    @Test func partialPacketStaysPendingUntilComplete() {
        var framer = H4Framer()
        var delivered = 0
        Self.acl.withUnsafeBytes { buf in
            framer.push(UnsafeRawBufferPointer(rebasing: buf[..<7])) { _ in delivered += 1 }
        }
        let pending = framer.pendingBytes, idle = framer.isIdle
        #expect(delivered == 0)
        #expect(pending == 7)
        #expect(!idle)
        Self.acl.withUnsafeBytes { buf in
            framer.push(UnsafeRawBufferPointer(rebasing: buf[7...])) { p in
                delivered += 1
                #expect(Array(p.bytes) == Array(Self.acl.dropFirst()))
            }
        }
        let idleAfter = framer.isIdle
        #expect(delivered == 1)
        #expect(idleAfter)
    }

    @Test func resetForgetsAPartialPacket() {
        var framer = H4Framer()
        var frames: [[UInt8]] = []
        Self.acl.withUnsafeBytes { framer.push(UnsafeRawBufferPointer(rebasing: $0[..<5])) { _ in } }
        framer.reset()
        let idle = framer.isIdle
        #expect(idle)
        Self.event.withUnsafeBytes { framer.push($0) { frames.append(Array($0.frame)) } }
        #expect(frames == [Self.event])
    }

    @Test func largestEventFits() {
        // Parameter_Total_Length 255 is the most an 8-bit length allows (§5.4.4).
        let big = [0x04, 0xFF, 0xFF] + [UInt8](repeating: 0xA5, count: 255)
        let run = FramerRun(maxDataPayload: 0, chunks: [big])
        #expect(run.frames == [big])
        #expect(run.stats.oversizePackets == 0)
    }

    @Test func capacityIsIndicatorPlusHeaderPlusLargestPayload() {
        let small = H4Framer(maxDataPayload: 27).capacity
        let large = H4Framer(maxDataPayload: 1024).capacity
        #expect(small == 1 + 4 + 255)
        #expect(large == 1 + 4 + 1024)
    }

    @Test func aclAtTheLimitIsDeliveredOnePastIsOversize() {
        let atLimit = hx("02 4020 0500 aabbccddee")
        let run = FramerRun(maxDataPayload: 5, chunks: [atLimit])
        #expect(run.frames == [atLimit])
        #expect(run.stats.oversizePackets == 0)
        // None of the bytes after the indicator is 0x01…0x05, so the re-scan finds nothing.
        let onePast = hx("02 4020 0600 aabbccddeeff")
        let run2 = FramerRun(maxDataPayload: 5, chunks: [onePast + Self.event])
        #expect(run2.stats.oversizePackets == 1)
        #expect(run2.frames == [Self.event])
        // The indicator, its 4 header bytes and the 6 payload bytes are skipped as garbage.
        #expect(run2.stats.garbageBytes == 11)
    }

    @Test func oversizeRescansTheHeaderBytes() {
        // A stray 0x02 makes "04 0e 04 01" look like an ACL header of length 0x0104 = 260,
        // over the limit of 27: the real event starting inside it must still come out.
        let stream = [0x02] + Self.event
        for chunking in [[stream], stream.map { [$0] }] {
            let run = FramerRun(maxDataPayload: 27, chunks: chunking)
            #expect(run.frames == [Self.event])
            #expect(run.stats.oversizePackets == 1)
            #expect(run.stats.garbageBytes == 1)
        }
    }

    @Test func oversizeISOUsesFourteenBitLength() {
        // Length field 0xFFFF → 0x3FFF = 16383 > 1024: oversize, then the hunt resumes.
        let stream = hx("05 0000 ffff") + Self.command
        let run = FramerRun(chunks: [stream])
        #expect(run.stats.oversizePackets == 1)
        #expect(run.frames == [Self.command])
        #expect(run.stats.garbageBytes == 5)
    }

    @Test func garbageOnlyDeliversNothing() {
        let junk = [UInt8](repeating: 0x00, count: 100) + [0x06, 0xFF, 0x80]
        let run = FramerRun(chunks: [junk])
        #expect(run.frames.isEmpty)
        #expect(run.stats.garbageBytes == junk.count)
        #expect(run.pending == 0)
    }

    @Test func emptyPushDoesNothing() {
        let run = FramerRun(chunks: [[], Self.event, []])
        #expect(run.frames == [Self.event])
    }
}
