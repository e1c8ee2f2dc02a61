// Sealed envelopes: docs/security.md §5.
import BatonTestSupport
import Testing
@testable import BatonKeys

private let context = PayloadContext(deviceID: 0x5A12_3456_789A, sequence: 258)

private func seal(_ plain: [UInt8], _ ctx: PayloadContext = context, key: PayloadKey = vectorKeys.payloadKey) throws -> [UInt8] {
    let s = try SealedEnvelope(key: key)
    var out = [UInt8](repeating: 0, count: SealedEnvelope.sealedLength(plaintextCount: plain.count))
    let n = try plain.withUnsafeBytes { p in try out.withUnsafeMutableBytes { o in try s.sealPayload(p, for: ctx, into: o) } }
    return Array(out[..<n])
}

/// Opens into a buffer prefilled with 0xEE; returns the plaintext, or throws with the buffer
/// so a test can check nothing was left in it.
private func open(_ env: [UInt8], _ ctx: PayloadContext = context, key: PayloadKey = vectorKeys.payloadKey,
                  capacity: Int? = nil, leftover: inout [UInt8]) throws -> [UInt8] {
    let s = try SealedEnvelope(key: key)
    var out = [UInt8](repeating: 0xEE, count: capacity ?? max(0, env.count - SealedEnvelope.overhead))
    defer { leftover = out }
    let n = try env.withUnsafeBytes { e in try out.withUnsafeMutableBytes { o in try s.openPayload(e, for: ctx, into: o) } }
    return Array(out[..<n])
}

private func open(_ env: [UInt8], _ ctx: PayloadContext = context, key: PayloadKey = vectorKeys.payloadKey,
                  capacity: Int? = nil) throws -> [UInt8] {
    var ignored: [UInt8] = []
    return try open(env, ctx, key: key, capacity: capacity, leftover: &ignored)
}

@Suite struct SealedEnvelopeTests {
    @Test func sealThenOpenGivesThePlaintextBack() throws {
        for count in [0, 1, 15, 16, 17, 116, 3072] {
            let plain = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let env = try seal(plain)
            #expect(env.count == count + 29)
            #expect(env[0] == 1)
            #expect(try open(env) == plain)
        }
    }

    @Test func everySealHasAFreshNonce() throws {
        let a = try seal(payloadVector), b = try seal(payloadVector)
        #expect(a[1..<13] != b[1..<13])
        #expect(a[13...] != b[13...])
    }

    @Test func aFlippedBitAnywhereFailsOpening() throws {
        let env = try seal(Array(payloadVector[..<40]))
        for byte in 0..<env.count {
            for bit in 0..<8 {
                var forged = env
                forged[byte] ^= 1 << bit
                let expected: SealError = byte == 0 ? .unsupportedVersion(forged[0]) : .authenticationFailed
                var left: [UInt8] = []
                #expect(throws: expected, "byte \(byte) bit \(bit)") { try open(forged, leftover: &left) }
                #expect(left.allSatisfy { $0 == 0 || $0 == 0xEE }, "no unauthenticated plaintext is left behind")
            }
        }
    }

    @Test func truncatedEnvelopesFail() throws {
        let env = try seal(Array(payloadVector[..<40]))
        #expect(throws: SealError.tooShort(count: 0, need: 29)) { try open([]) }
        for count in 1..<29 {
            #expect(throws: SealError.tooShort(count: count, need: 29)) { try open(Array(env[..<count]), capacity: 64) }
        }
        // From 29 bytes on the cut cannot be told from tampering: the tag decides.
        for count in 29..<env.count {
            #expect(throws: SealError.authenticationFailed) { try open(Array(env[..<count])) }
        }
    }

    @Test func anotherActivityOrSaveOrKeyCannotOpenIt() throws {
        let env = try seal(payloadVector)
        #expect(throws: SealError.authenticationFailed) { try open(env, PayloadContext(deviceID: 0x5A12_3456_789B, sequence: 258)) }
        #expect(throws: SealError.authenticationFailed) { try open(env, PayloadContext(deviceID: 0x5A12_3456_789A, sequence: 257)) }
        let other = try GroupKeys.derive(secret: GroupSecret(bytes: hx("ffeeddccbbaa99887766554433221100")))
        #expect(throws: SealError.authenticationFailed) { try open(env, key: other.payloadKey) }
    }

    @Test func buffersOneByteTooSmallAreRefused() throws {
        let plain = Array(payloadVector[..<40])
        let s = try SealedEnvelope(key: vectorKeys.payloadKey)
        var out = [UInt8](repeating: 0, count: 40 + 29 - 1)
        #expect(throws: SealError.noRoom(need: 69, capacity: 68)) {
            try plain.withUnsafeBytes { p in try out.withUnsafeMutableBytes { o in try s.sealPayload(p, for: context, into: o) } }
        }
        let env = try seal(plain)
        #expect(throws: SealError.noRoom(need: 40, capacity: 39)) { try open(env, capacity: 39) }
    }

    @Test func plaintextCapacityPlusOneIsRefused() throws {
        let s = try SealedEnvelope(key: vectorKeys.payloadKey)
        let max = SealedEnvelope.maxPlaintext
        let plain = [UInt8](repeating: 0x41, count: max + 1)
        var out = [UInt8](repeating: 0, count: max + 1 + 29)
        #expect(throws: SealError.plaintextTooLong(count: max + 1, max: max)) {
            try plain.withUnsafeBytes { p in try out.withUnsafeMutableBytes { o in try s.sealPayload(p, for: context, into: o) } }
        }
        let n = try plain.withUnsafeBytes { p in
            try out.withUnsafeMutableBytes { o in try s.sealPayload(UnsafeRawBufferPointer(rebasing: p[..<max]), for: context, into: o) }
        }
        #expect(n == max + 29, "exactly the capacity seals")
    }

    @Test func errorsSayWhoseFault() {
        #expect(SealError.authenticationFailed.description.contains("another group's key"))
        #expect(SealError.tooShort(count: 3, need: 29).description.contains("cut short"))
        #expect(SealError.unsupportedVersion(2).description.contains("version 2"))
    }
}

/// docs/security.md §5.2, stream frames: a frame opens only in its own stream, direction and
/// place; frame 0 is the endpoint's hello and its nonce is the stream nonce.
@Suite struct SealedStreamFrameTests {
    let device: UInt64 = 0x7CEC_7226_0003

    func sealFrame(_ s: SealedEnvelope, _ plain: [UInt8], _ c: StreamFrameContext) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plain.count + SealedEnvelope.overhead)
        let n = try plain.withUnsafeBytes { p in try out.withUnsafeMutableBytes { o in try s.sealFrame(p, for: c, into: o) } }
        return Array(out[..<n])
    }

    func openFrame(_ s: SealedEnvelope, _ env: [UInt8], _ c: StreamFrameContext) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: env.count)
        let n = try env.withUnsafeBytes { e in try out.withUnsafeMutableBytes { o in try s.openFrame(e, for: c, into: o) } }
        return Array(out[..<n])
    }

    @Test func aFrameOpensOnlyInItsOwnStreamDirectionAndPlace() throws {
        let s = try SealedEnvelope(key: vectorKeys.payloadKey)
        var hello = [UInt8](repeating: 0, count: SealedEnvelope.overhead)
        let n = try hello.withUnsafeMutableBytes { try s.sealHello(deviceID: device, into: $0) }
        #expect(n == 29)
        let nonce = try #require(hello.withUnsafeBytes { StreamFrameContext.streamNonce(ofFrameZero: $0) })
        #expect((0..<12).allSatisfy { nonce[$0] == hello[1 + $0] }, "the stream nonce is frame 0's own nonce")
        let zero = StreamFrameContext(deviceID: device, streamNonce: nonce, direction: .up, frame: 0)
        #expect(try openFrame(s, hello, zero) == [], "the device opens the hello with the nonce it carries")

        let up5 = StreamFrameContext(deviceID: device, streamNonce: nonce, direction: .up, frame: 5)
        let env = try sealFrame(s, Array("chapter 3, page 12".utf8), up5)
        #expect(try openFrame(s, env, up5) == Array("chapter 3, page 12".utf8))
        var other = nonce; other[0] ^= 1
        for wrong in [StreamFrameContext(deviceID: device, streamNonce: nonce, direction: .down, frame: 5),
                      StreamFrameContext(deviceID: device, streamNonce: nonce, direction: .up, frame: 6),
                      StreamFrameContext(deviceID: device, streamNonce: other, direction: .up, frame: 5),
                      StreamFrameContext(deviceID: device ^ 1, streamNonce: nonce, direction: .up, frame: 5)] {
            #expect(throws: SealError.authenticationFailed) { try openFrame(s, env, wrong) }
        }
        // A payload envelope is not a stream frame, and the other way round (kind 01 vs 02).
        var payload = [UInt8](repeating: 0, count: 64)
        let p = try [UInt8](repeating: 7, count: 10).withUnsafeBytes { plain in
            try payload.withUnsafeMutableBytes { try s.sealPayload(plain, for: PayloadContext(deviceID: device, sequence: 5), into: $0) }
        }
        #expect(throws: SealError.authenticationFailed) { try openFrame(s, Array(payload[..<p]), up5) }
    }

    @Test func twoHellosNeverShareAStreamNonce() throws {
        let s = try SealedEnvelope(key: vectorKeys.payloadKey)
        var seen = Set<[UInt8]>()
        for _ in 0..<100 {
            var hello = [UInt8](repeating: 0, count: 29)
            _ = try hello.withUnsafeMutableBytes { try s.sealHello(deviceID: device, into: $0) }
            seen.insert(Array(hello[1..<13]))
        }
        #expect(seen.count == 100)
    }
}
