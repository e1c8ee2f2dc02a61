// A continuing endpoint's two byte streams (docs/relay.md §7.4, §10): stdin cut into data
// frames, sealed with `--key` (docs/security.md §5.2), and the device's data frames written to
// stdout, acknowledged only once written (a reader that stops stops the device,
// docs/protocol.md §5.3). `baton stream` (through the broker) and `baton continue --stream`
// (over a link) differ in how frames travel, not in this.
import BatonLibc
import BatonKeys
import BatonRelay
import BatonWire
import Glibc

struct StdioFrames: ~Copyable {
    /// Our open: the device's frames we hold for stdout, and the bytes of each.
    let window: Int
    let maxData: Int
    /// With `--key`: seals our frames and opens the device's; the stream nonce is our frame 0's,
    /// set by the caller when it sends it.
    let sealer: SealedEnvelope?
    let deviceID: UInt64
    var streamNonce: InlineArray<12, UInt8>?

    /// Frames taken from the device and not yet written to stdout: frame n in slot n % window,
    /// `maxData` bytes each, its length in `outputCounts`.
    let output: UnsafeMutableRawBufferPointer
    var outputCounts: [Int]
    /// Bytes of frame `written` already on stdout.
    var writtenOfFrame = 0
    /// Frames written whole to stdout: what may be acknowledged.
    var written: UInt32 = 0
    /// One read from stdin, and the same sealed.
    let input: UnsafeMutableRawBufferPointer
    let sealed: UnsafeMutableRawBufferPointer
    var inputEnded = false

    /// The most written to stdout per turn: a pipe that polls writable takes a page without
    /// blocking (pipe(7): PIPE_BUF, 4096 on Linux), so no O_NONBLOCK is set on a descriptor
    /// the shell shares with us.
    static let writeChunk = 4096

    init(window: Int, maxData: Int, sealer: SealedEnvelope?, deviceID: UInt64) {
        self.window = window
        self.maxData = maxData
        self.sealer = sealer
        self.deviceID = deviceID
        output = .allocate(byteCount: window * maxData, alignment: 8)
        outputCounts = Array(repeating: 0, count: window)
        input = .allocate(byteCount: maxData, alignment: 8)
        sealed = .allocate(byteCount: maxData, alignment: 8)
    }

    deinit {
        output.deallocate()
        input.deallocate()
        sealed.deallocate()
    }

    // MARK: the device's frames to stdout

    enum Taken {
        /// In order, and held for stdout.
        case held
        /// Below the next expected: already held or written.
        case duplicate
        /// Above the next expected: one before it is missing.
        case gap
        /// It breaks docs/protocol.md §5.3 (after the close, beyond our window); the text says how.
        case breach(String)
        /// Sealed, it did not open (or came before our frame 0); the text says why.
        case notOpened(String)
    }

    /// A data frame from the device. `acked`: the last ack we sent (the device may have our
    /// window of frames past it in flight, no more).
    mutating func take(frame n: UInt32, bytes: UnsafeRawBufferPointer, acked: UInt32, down: inout StreamReceiver) -> Taken {
        // Distances are wrapping (§5.1's 32-bit numbers): below 2³¹ is at or after.
        if let end = down.closeEnd, n &- end < 0x8000_0000 { return .breach("data frame \(n) after the close at frame \(end)") }
        let ahead = n &- acked
        if ahead < 0x8000_0000, ahead >= UInt32(window) {
            return .breach("data frame \(n) beyond our window (acknowledged up to \(acked), window \(window))")
        }
        switch down.arrive(n) {
        case .inOrder:
            // Proof of room: acked ≤ written ≤ n and n - acked < window (checked above), so the
            // frames held, written ..< n + 1, are at most `window`, each in its own slot; decode
            // bounded the bytes by `maxData`.
            let slot = Int(n % UInt32(window))
            precondition(bytes.count <= maxData && n &- written < UInt32(window), "stdout slots overrun")
            let into = UnsafeMutableRawBufferPointer(rebasing: output[slot * maxData ..< (slot + 1) * maxData])
            guard let sealer else {
                UnsafeMutableRawBufferPointer(rebasing: into[..<bytes.count]).copyMemory(from: bytes)
                outputCounts[slot] = bytes.count
                return .held
            }
            guard let nonce = streamNonce else { return .breach("data frame \(n) before our frame 0 (docs/security.md §5.2)") }
            let context = StreamFrameContext(deviceID: deviceID, streamNonce: nonce, direction: .down, frame: n)
            do throws(SealError) { outputCounts[slot] = try sealer.openFrame(bytes, for: context, into: into) } catch {
                return .notOpened("the device's frame \(n) did not open with this key (another group's key, a stream that is not sealed, or altered on the way): \(error)")
            }
            return .held
        case .duplicate:
            return .duplicate
        case .gap:
            return .gap
        }
    }

    /// Writes what stdout takes now of the frames held, up to `next` (the next expected). The
    /// frames written whole are `written`; nil, or why stdout failed.
    mutating func writeStdout(upTo next: UInt32) -> String? {
        while written != next {
            let slot = Int(written % UInt32(window))
            let count = min(outputCounts[slot] - writtenOfFrame, Self.writeChunk)
            let n = count == 0 ? 0 : Glibc.write(STDOUT_FILENO, output.baseAddress! + slot * maxData + writtenOfFrame, count)
            if n < 0 {
                if Glibc.errno == EINTR { continue }
                if Glibc.errno == EAGAIN { return nil }
                return "writing stdout: \(String(cString: strerror(Glibc.errno)))"
            }
            writtenOfFrame += n
            if writtenOfFrame == outputCounts[slot] {
                writtenOfFrame = 0
                written &+= 1  // Proof: written < next here.
            }
            // More only while stdout still takes it at once.
            var p = pollfd(fd: STDOUT_FILENO, events: Int16(POLLOUT), revents: 0)
            guard Glibc.poll(&p, 1, 0) == 1, p.revents & Int16(POLLOUT) != 0 else { return nil }
        }
        return nil
    }

    // MARK: stdin to our frames

    enum Read {
        /// Nothing now (EINTR, EAGAIN).
        case nothing
        /// The end of stdin: our close is due.
        case ended
        /// One frame's bytes, sealed when sealing; valid until the next read.
        case frame(UnsafeRawBufferPointer)
        /// Reading or sealing failed; the text says why.
        case failed(String)
    }

    /// One read from stdin, as the bytes of data frame `number` (at most `room` bytes sent).
    mutating func readStdin(number: UInt32, room: Int) -> Read {
        // Sealed, each frame carries 29 bytes besides the data (checked at the device's open).
        let data = sealer == nil ? room : room - SealedEnvelope.overhead
        let n = Glibc.read(STDIN_FILENO, input.baseAddress, min(data, input.count))
        if n < 0 {
            if Glibc.errno == EINTR || Glibc.errno == EAGAIN { return .nothing }
            return .failed("reading stdin: \(String(cString: strerror(Glibc.errno)))")
        }
        if n == 0 {
            inputEnded = true
            return .ended
        }
        let bytes = UnsafeRawBufferPointer(rebasing: input[..<n])
        guard let sealer, let nonce = streamNonce else { return .frame(bytes) }
        let context = StreamFrameContext(deviceID: deviceID, streamNonce: nonce, direction: .up, frame: number)
        do throws(SealError) {
            let count = try sealer.sealFrame(bytes, for: context, into: sealed)
            return .frame(UnsafeRawBufferPointer(rebasing: sealed[..<count]))
        } catch {
            return .failed("sealing: \(error)")
        }
    }
}
