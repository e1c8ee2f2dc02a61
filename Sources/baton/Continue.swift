import BatonLibc
import ArgumentParser
import BatonGateway
import BatonHCI
import BatonKeys
import BatonRelay
import BatonWire
import Foundation
import Glibc

/// `baton continue DEVICE`: the continuing device, as a phone app is (docs/relay.md §10). It
/// scans its own adapter for the activity's beacon (docs/protocol.md §2), the device's own or a
/// gateway's re-advertisement (flagged relayed, relay.md §9), connects an L2CAP LE
/// credit-based channel to the beacon's address and PSM, and speaks the device link of
/// protocol.md §5 in the gateway's part: a fetch, or one stream with stdin and stdout as its
/// ends. A re-advertising gateway answers as if it were the device, so the same command
/// continues an activity from the next room or from another floor.
struct ContinueCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "continue",
        abstract: "Be the continuing device: find an activity's beacon over Bluetooth and fetch its payload or open a stream to it.",
        discussion: """
            Scans the adapter for the activity beacon of DEVICE, connects to the PSM it names and \
            prints the payload as JSON (its CBOR bytes with --cbor), or with --stream pipes stdin to \
            the device and its bytes to stdout. One line on stderr says what was found. Needs \
            CAP_NET_RAW (scanning through the raw HCI socket). Exit status: 0 the payload, or a \
            stream whose both directions closed cleanly; 1 refused, aborted or unreachable (the \
            reason on stderr); 3 no such beacon heard, or no answer, within --timeout; 130 \
            interrupted.
            """)

    @Argument(help: "The device id: 12 hex digits, as in <prefix>/activities/<device> (colons allowed).")
    var device: String
    @Option(help: "The Bluetooth adapter to scan and connect with: hciN or its address.")
    var adapter = "hci0"
    @Option(help: "The group secret file (BATON-GROUP-V1:…, docs/security.md §1): the beacon's tag must verify, a rotating id is resolved to DEVICE, the payload or stream is opened.")
    var key: String?
    @Flag(help: "Only a gateway's re-advertisement (the beacon's relayed flag, docs/protocol.md §2.2), not the device's own beacon.")
    var relayed = false
    @Flag(help: "Open a continuation stream instead of fetching: stdin goes to the device, its bytes come to stdout.")
    var stream = false
    @Option(help: "Seconds to find the beacon and get the answer (with --stream: the device's open).")
    var timeout: Double = 10
    @Flag(help: "Write the payload's CBOR bytes to stdout instead of JSON.")
    var cbor = false
    @Option(name: .customLong("company-id"), help: "The company id beacons are sent under (radio.company-id).")
    var companyID = "0xFFFF"

    /// DEVICE as topics spell it: 12 lowercase hex digits.
    var deviceText: String { device.lowercased().filter { $0 != ":" } }

    func validate() throws {
        guard deviceText.count == 12, deviceText.allSatisfy({ $0.isHexDigit }) else {
            throw ValidationError("DEVICE must be 12 hex digits like 5a123456789a, got \"\(device)\"")
        }
        guard timeout > 0, timeout <= 3600 else { throw ValidationError("--timeout must be 0–3600 seconds") }
        guard !(cbor && stream) else {
            throw ValidationError("--cbor is for a fetch's payload; a stream's bytes go to stdout as they are")
        }
        guard let company else { throw ValidationError("--company-id must be 1 to 4 hex digits like 0xFFFF, got \"\(companyID)\"") }
        guard company != 0x004C else {
            throw ValidationError("--company-id 0x004C is Apple's: its data is Continuity, not a beacon (docs/protocol.md §1)")
        }
    }

    var company: UInt16? {
        var t = companyID.lowercased()
        if t.hasPrefix("0x") { t.removeFirst(2) }
        guard !t.isEmpty, t.count <= 4 else { return nil }
        return UInt16(t, radix: 16)
    }

    func run() throws {
        let id = UInt64(deviceText, radix: 16)!  // validate() checked 12 hex digits
        var keys: GroupKeys? = nil
        if let key {
            do { keys = try GroupKeys.derive(secret: GroupSecret.load(path: key)) } catch {
                throw ValidationError("--key \(key): \(error)")
            }
        }
        let match: BeaconMatch
        do throws(CryptoError) { match = try BeaconMatch(device: id, relayedOnly: relayed, keys: keys) } catch {
            say("the group key cannot be used: \(error)")
            throw ExitCode(1)
        }
        // Ctrl-C and SIGTERM as a byte on a pipe the loops poll; SIGPIPE ignored.
        let stop = StopSignals()
        let deadline = Instant.now + .milliseconds(Int64(timeout * 1000))

        let found: FoundBeacon
        switch scan(match, company: company!, until: deadline, stop: stop) {
        case .found(let f): found = f
        case .exit(let status): throw ExitCode(status)
        }
        let via = found.beacon.flags.contains(.relayed) ? "relayed by" : "at"
        say("found \(deviceText) \(via) \(found.address) seq \(found.beacon.sequence)", prefixed: false)

        if stream, !found.beacon.flags.contains(.supportsStreams) {
            say("the activity of \(deviceText) supports no continuation streams (its beacon says so)")
            throw ExitCode(1)
        }
        var sealer: SealedEnvelope? = nil
        do throws(CryptoError) { if let keys { sealer = try SealedEnvelope(key: keys.payloadKey) } } catch {
            say("the group key cannot be used: \(error)")
            throw ExitCode(1)
        }
        // The largest SDU we take, so a payload of any size a device may send fits (§5.1), and
        // the most credits the kernel grants the peer (Linux: MTU / MPS + 1, docs/vm.md).
        let link = L2CAPLink(adapter: adapter, receiveMTU: 65_535)
        var channel: LinkChannel
        do throws(LinkError) { channel = try link.connect(to: found.address) } catch {
            say("\(error)")
            throw ExitCode(1)
        }
        let status: Int32
        if stream {
            var session = LinkStream(device: id, sealer: sealer)
            status = session.run(&channel, until: deadline, stop: stop)
        } else {
            status = fetch(&channel, sequence: found.beacon.sequence, device: id, opener: sealer, until: deadline, stop: stop)
        }
        channel.close()
        if status != 0 { throw ExitCode(status) }
    }

    // MARK: - Finding the beacon

    enum ScanOutcome {
        case found(FoundBeacon)
        case exit(Int32)
    }

    /// Scans until a beacon matches, the deadline, or a stop. The raw socket is closed on return:
    /// the kernel turns the scan off itself to connect (docs/radio.md "The kernel's own scans").
    func scan(_ match: BeaconMatch, company: UInt16, until deadline: Instant,
              stop: borrowing StopSignals) -> ScanOutcome {
        var radio: RadioBlueZ
        do throws(RadioError) { radio = try RadioBlueZ(adapter: adapter) } catch {
            say(Self.radioText(error))
            return .exit(1)
        }
        do throws(RadioError) { try radio.start(now: .now) } catch {
            say(Self.radioText(error))
            return .exit(1)
        }
        var decoder = AdvertisementDecoder(beaconCompanyID: company)
        var seen = BeaconMatch.Seen()
        var found: FoundBeacon?
        var fds = [pollfd](repeating: pollfd(fd: -1, events: 0, revents: 0), count: 2)
        while found == nil {
            let now = Instant.now
            if now >= deadline {
                say("no beacon of \(deviceText)\(relayed ? " relayed by a gateway" : "") heard on \(adapter) within \(timeout) s\(seen.explanation(keyed: match.keyed))")
                return .exit(3)
            }
            var wake = deadline
            if let d = radio.nextDeadline { wake = min(wake, d) }
            fds[0] = pollfd(fd: radio.fd, events: Int16(POLLIN) | (radio.wantsWrite ? Int16(POLLOUT) : 0), revents: 0)
            fds[1] = pollfd(fd: stop.fd, events: Int16(POLLIN), revents: 0)
            _ = Glibc.poll(&fds, 2, Self.milliseconds(until: wake))
            if fds[1].revents != 0 { return .exit(130) }
            do throws(RadioError) {
                _ = try radio.poll(now: .now) { event in
                    decoder.decode(event: event, timestamp: 0) { heard in
                        guard found == nil else { return }
                        found = match.consider(heard, seen: &seen)
                    }
                }
            } catch {
                say(Self.radioText(error))
                return .exit(1)
            }
        }
        return .found(found!)
    }

    static func radioText(_ error: RadioError) -> String {
        switch error {
        case .noBluetoothSupport:
            "this kernel has no Bluetooth support (AF_BLUETOOTH unavailable): run on a machine with BlueZ and a Bluetooth LE adapter"
        default:
            error.description
        }
    }

    // MARK: - Fetching (docs/protocol.md §5.2)

    /// fetch(seq) on the link, then the answer: the payload printed, or the refusal said.
    func fetch(_ channel: inout LinkChannel, sequence: UInt16, device: UInt64, opener: SealedEnvelope?,
               until deadline: Instant, stop: borrowing StopSignals) -> Int32 {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_535, alignment: 8)
        defer { buffer.deallocate() }
        var asked = false
        var answer: FetchAnswer?
        var fds = [pollfd](repeating: pollfd(fd: -1, events: 0, revents: 0), count: 2)
        while answer == nil {
            if case .closed(let error) = channel.state {
                say(error.map { "\($0)" } ?? "the link closed before the answer")
                return 1
            }
            if Instant.now >= deadline {
                say("no answer to the fetch of \(ActivityBeacon.deviceIDText(device)) seq \(sequence) within \(timeout) s")
                return 3
            }
            fds[0] = pollfd(fd: channel.fd, events: Int16(POLLIN) | (channel.wantsWrite ? Int16(POLLOUT) : 0), revents: 0)
            fds[1] = pollfd(fd: stop.fd, events: Int16(POLLIN), revents: 0)
            _ = Glibc.poll(&fds, 2, Self.milliseconds(until: deadline))
            if fds[1].revents != 0 { return 130 }
            channel.ready(readable: fds[0].revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                          writable: fds[0].revents & Int16(POLLOUT) != 0, buffer: buffer)
            while let sdu = channel.next(into: buffer) {
                if answer == nil { answer = FetchAnswer(sdu) }
            }
            if !asked, case .open = channel.state {
                var bytes = [UInt8](repeating: 0, count: LinkMessage.encodedCount(.fetch, bodyCount: 0))
                bytes.withUnsafeMutableBytes { raw in
                    var w = ByteWriter(raw)
                    // Proof: the buffer is exactly a fetch message's length (§5.1).
                    do throws(WireError) { try LinkMessage.encodeFetch(sequence: sequence, into: &w) } catch {
                        preconditionFailure("a fetch message fits its own length: \(error)")
                    }
                }
                // Array.withUnsafeBytes rethrows untyped: the outcome comes out as a value.
                let sent: Result<Bool, LinkError> = bytes.withUnsafeBytes { b in
                    do throws(LinkError) { return .success(try channel.send(b)) } catch { return .failure(error) }
                }
                switch sent {
                case .success(let taken): asked = taken  // false: no room now; POLLOUT, then again
                case .failure(let error):
                    say("\(error)")
                    return 1
                }
            }
        }
        switch answer! {
        case .payload(let answered, let bytes):
            var out = Data(bytes)
            if let opener {
                guard let plain = FetchCommand.open(out, opener, device: device, sequence: answered) else {
                    say("the payload did not open with this key (another group's key, or not sealed, or altered on the way)")
                    return 1
                }
                out = plain
            }
            if !cbor {
                guard let json = FetchCommand.rendered(out) else {
                    say("the payload is not an activity payload v1 (docs/payload.md)")
                    return 1
                }
                out = json
                out.append(UInt8(ascii: "\n"))
            }
            FileHandle.standardOutput.write(out)
            return 0
        case .refused(let reason):
            say("fetch refused: \(reason)")
            return 1
        case .broken(let why):
            say(why)
            return 1
        }
    }

    /// The first message on a fetch link, decoded and copied out of the receive buffer.
    enum FetchAnswer {
        case payload(sequence: UInt16, bytes: [UInt8])
        case refused(String)
        /// Anything else: an error frame or a message that breaks §5.2.
        case broken(String)

        init(_ sdu: UnsafeRawBufferPointer) {
            let m: LinkMessage
            do throws(WireError) { m = try LinkMessage.decode(sdu, payloadMax: 65_535) } catch {
                self = .broken("a malformed answer (docs/protocol.md §5.1): \(error)")
                return
            }
            switch m.type {
            case .payload:
                self = .payload(sequence: UInt16(truncatingIfNeeded: m.number), bytes: Array(UnsafeRawBufferPointer(rebasing: sdu[m.body])))
            case .fetchRefused:
                let why = switch FetchRefusal(rawValue: m.reason) {
                case .notCurrent: "not current (the activity ended, or another replaced it)"
                case .tooLarge: "too large (the payload does not fit one link message)"
                default: "refused (the device, or the gateway relaying it, cannot answer now: try again)"
                }
                self = .refused(why)
            case .error:
                let reason = StreamReason(rawValue: m.reason).map { "\($0.name)" } ?? "\(m.reason)"
                self = .broken("\(reason): \(LinkStream.printable(sdu, m.body))")
            case .reset:
                let reason = StreamReason(rawValue: m.reason).map { "\($0.name)" } ?? "\(m.reason)"
                self = .broken("\(reason): the device, or the gateway relaying it, reset the link")
            default:
                self = .broken("a \(m.type) message answered the fetch (docs/protocol.md §5.2)")
            }
        }
    }

    // MARK: - Helpers

    func say(_ text: String, prefixed: Bool = true) {
        if prefixed { Stderr.say("continue", text) } else { Stderr.line(text) }
    }

    /// poll()'s timeout until `instant`, rounded up, at most a second.
    static func milliseconds(until instant: Instant) -> Int32 {
        (instant - .now).pollMilliseconds(atMost: 1000)
    }
}

// MARK: - Which beacon

/// The beacon `baton continue` looks for, and why the others were passed over.
struct FoundBeacon {
    var beacon: ActivityBeacon
    var address: LinkAddress
}

struct BeaconMatch {
    let device: UInt64
    let relayedOnly: Bool
    /// With a key: tags are checked under the beacon key, and a beacon must be of its group.
    let tagger: BeaconTagger?
    let groupHash: UInt32?
    /// DEVICE is an identity id (`group ‖ n`, docs/security.md §3.1) of the key's group: the
    /// device's own beacons carry ids made with IK_n, which this resolves.
    let identity: DeviceIDResolver?
    var keyed: Bool { tagger != nil }

    init(device: UInt64, relayedOnly: Bool, keys: GroupKeys?) throws(CryptoError) {
        self.device = device
        self.relayedOnly = relayedOnly
        guard let keys else {
            tagger = nil; groupHash = nil; identity = nil
            return
        }
        tagger = try BeaconTagger(key: keys.beaconKey)
        groupHash = keys.groupHash
        identity = device >> 16 == UInt64(keys.groupHash)
            ? try DeviceIDResolver(irk: keys.beaconKey.identityKey(number: UInt16(truncatingIfNeeded: device)))
            : nil
    }

    /// What was heard of DEVICE without a match, for the message at the deadline.
    struct Seen {
        var beacons = 0
        var notRelayed = 0
        var badTag = 0
        var ended = 0
        var noLink = 0

        func explanation(keyed: Bool) -> String {
            var parts: [String] = []
            if notRelayed > 0 { parts.append("\(notRelayed) of its own, not relayed") }
            if badTag > 0 { parts.append("\(badTag) whose tag did not verify under this key (a forgery, or another group's)") }
            if ended > 0 { parts.append("\(ended) saying the activity ended") }
            if noLink > 0 { parts.append("\(noLink) offering no link (PSM 0)") }
            if !parts.isEmpty { return " (heard: \(parts.joined(separator: "; ")))" }
            if beacons == 0 { return " (no activity beacon at all: is the device or a re-advertising gateway in range? docs/relay.md §9)" }
            return keyed ? " (\(beacons) beacons of other devices)"
                : " (\(beacons) beacons of other devices; a keyed group's device rotates its id on air: give --key)"
        }
    }

    /// The beacon, when it is DEVICE's and may be continued; nil otherwise (counted in `seen`).
    func consider(_ heard: HeardAdvertisement, seen: inout Seen) -> FoundBeacon? {
        guard var beacon = heard.content.beacon else { return nil }
        seen.beacons += 1
        if let groupHash, beacon.groupHash != groupHash { return nil }
        let air = beacon.deviceID & 0xFFFF_FFFF_FFFF
        // A relayed beacon names the topic id itself (docs/relay.md §9), as does an open group's
        // device; a keyed device with an identity rotates an id only its IK_n resolves.
        guard air == device || identity?.resolves(air) == true else { return nil }
        if let tagger {
            // Over the bytes as received, the company id before them (docs/security.md §4): a
            // second beacon record in the same advertisement cannot lend its tag.
            guard let value = heard.content.beaconValue, value.count == ActivityBeacon.valueLength, let base = value.baseAddress,
                  tagger.verify(signed: UnsafeRawBufferPointer(start: base - 2, count: ActivityBeacon.signedLength),
                                tag: UnsafeRawBufferPointer(rebasing: value[20..<24]))
            else {
                seen.badTag += 1
                return nil
            }
        }
        if relayedOnly, !beacon.flags.contains(.relayed) {
            seen.notRelayed += 1
            return nil
        }
        if beacon.flags.contains(.invalidated) {
            seen.ended += 1
            return nil
        }
        // Anonymous advertising has no address to connect to (LinkAddress.isRandom).
        guard beacon.psm != 0, heard.report.addressType != 0xFF else {
            seen.noLink += 1
            return nil
        }
        beacon.deviceID = device
        return FoundBeacon(beacon: beacon, address: LinkAddress(address: heard.report.address,
                                                                addressType: heard.report.addressType, psm: beacon.psm))
    }
}

// MARK: - A stream over the link (docs/protocol.md §5.3)

/// One stream on a link, from the continuing end (the part the gateway plays towards a device):
///
///   up    stdin → `StreamSender` → data frames, at most the device's window unacknowledged
///         and its max data each (sealed: docs/security.md §5.2, frame 0 the hello);
///   down  data frames → one slot per frame → stdout, acknowledged once written, so a reader
///         that stops stops the device (§5.3 backpressure).
///
/// A link keeps order and loses nothing while it is up (L2CAP, §5), so nothing is resent: a
/// gap is a protocol error, and a link that drops ends the stream. Memory is allocated once:
/// `window` × `maxData` each way, one read from stdin, one frame to send, one SDU received.
struct LinkStream: ~Copyable {
    /// Our open: frames we hold for stdout, bytes per frame we take. `baton stream`'s defaults.
    static let window = 16
    static let maxData = 1024
    /// After our last frame, how long the link may take to hand it to the controller before we
    /// hang up: closing an L2CAP channel drops the SDUs still waiting for credits (docs/vm.md).
    static let drainLimit: Int32 = 2000

    /// stdin into frames, the device's frames onto stdout (`StdioFrames`).
    var io: StdioFrames
    var sealer: SealedEnvelope? { io.sealer }
    var up: StreamSender
    var down = StreamReceiver()
    /// Up frames handed to the link so far (≤ `up.next`); the close, once handed.
    var transmitted: UInt32 = 0
    var closeTransmitted = false
    var openTransmitted = false
    /// Down frames written to stdout whole, the bytes of the next one written, and the last ack
    /// handed to the link.
    var written: UInt32 { io.written }
    var acked: UInt32 = 0
    /// The stream's end, decided while the channel drained; acted on after (`run`), with what
    /// to tell the device first: error `protocol` when its frame broke §5.3 (`breachDetail`),
    /// reset `cancelled` when this end gave up (stdin, stdout, sealing: `giveUp`).
    var ending: Int32?
    var breachDetail: String?
    var givingUp = false

    let tx: UnsafeMutableRawBufferPointer
    let rx: UnsafeMutableRawBufferPointer

    init(device: UInt64, sealer: SealedEnvelope?) {
        io = StdioFrames(window: Self.window, maxData: Self.maxData, sealer: sealer, deviceID: device)
        up = StreamSender(capacity: Self.window, maxData: Self.maxData)
        tx = .allocate(byteCount: LinkMessage.dataHeaderBytes + Self.maxData, alignment: 8)
        // The largest SDU the link delivers (our receive MTU): anything a peer sends is read
        // whole, and a data frame beyond our max data is then a protocol error, not a cut record.
        rx = .allocate(byteCount: 65_535, alignment: 8)
    }

    deinit {
        tx.deallocate(); rx.deallocate()
    }

    /// Runs the stream to its end; the exit status. `deadline` bounds the wait for the
    /// device's open; after it the stream runs as long as both ends do.
    mutating func run(_ channel: inout LinkChannel, until deadline: Instant,
                      stop: borrowing StopSignals) -> Int32 {
        var fds = [pollfd](repeating: pollfd(fd: -1, events: 0, revents: 0), count: 4)
        while true {
            if let status = ending { return finish(&channel, status) }
            if case .closed(let error) = channel.state {
                say(error.map { "the link ended the stream: \($0)" } ?? "the device hung up before the stream ended")
                return 1
            }
            if !up.opened, Instant.now >= deadline {
                say("the device did not answer the stream's open within the timeout")
                send(&channel, .reset) { w throws(WireError) in try LinkMessage.encodeReset(.cancelled, into: &w) }
                return 3
            }
            let reading = !io.inputEnded && canRead
            let writing = written != down.next
            fds[0] = pollfd(fd: channel.fd, events: Int16(POLLIN) | (channel.wantsWrite ? Int16(POLLOUT) : 0), revents: 0)
            fds[1] = pollfd(fd: stop.fd, events: Int16(POLLIN), revents: 0)
            fds[2] = pollfd(fd: reading ? STDIN_FILENO : -1, events: Int16(POLLIN), revents: 0)
            fds[3] = pollfd(fd: writing ? STDOUT_FILENO : -1, events: Int16(POLLOUT), revents: 0)
            _ = Glibc.poll(&fds, 4, up.opened ? 1000 : ContinueCommand.milliseconds(until: deadline))

            if fds[1].revents != 0 {
                send(&channel, .reset) { w throws(WireError) in try LinkMessage.encodeReset(.cancelled, into: &w) }
                return finish(&channel, 130)
            }
            let rx = self.rx
            channel.ready(readable: fds[0].revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                          writable: fds[0].revents & Int16(POLLOUT) != 0, buffer: rx)
            while let sdu = channel.next(into: rx) {
                if ending == nil { take(sdu) }
            }
            if ending != nil { continue }
            if reading, canRead, fds[2].revents != 0 { readInput() }
            if writing, fds[3].revents != 0 { writeOutput() }
            if ending != nil { continue }
            flush(&channel)
            // §5.3: both directions closed and every frame acknowledged, ours by the device and
            // the device's by us once written. A link loses nothing, so our close needs no ack.
            if closeTransmitted, up.unacked == up.next, down.finished, written == down.next, acked == written {
                return finish(&channel, 0)
            }
        }
    }

    /// stdin may be read: the device's window has room (and, sealed, the hello has gone first).
    var canRead: Bool { up.canSend && (sealer == nil || io.streamNonce != nil) }

    // MARK: frames in

    mutating func take(_ sdu: UnsafeRawBufferPointer) {
        let m: LinkMessage
        do throws(WireError) { m = try LinkMessage.decode(sdu, payloadMax: Self.maxData) } catch {
            return breach("a malformed frame: \(error)")
        }
        switch m.type {
        case .open:
            guard !up.opened else { return breach("a second open") }
            up.peerOpened(window: m.window, maxData: m.maxData)
            guard let sealer else { return }
            guard up.maxData > SealedEnvelope.overhead else {
                return breach("max data \(m.maxData) leaves no room for a sealed frame (docs/security.md §5.2)")
            }
            // docs/security.md §5.2: our frame 0 is an empty envelope whose nonce is the stream's.
            let n: Int
            do throws(SealError) { n = try sealer.sealHello(deviceID: io.deviceID, into: io.sealed) } catch {
                return giveUp("sealing: \(error)")
            }
            let hello = UnsafeRawBufferPointer(rebasing: io.sealed[..<n])
            io.streamNonce = StreamFrameContext.streamNonce(ofFrameZero: hello)
            _ = up.push(hello)
        case .data:
            guard up.opened else { return breach("data before the device's open") }
            take(frame: m.number, bytes: UnsafeRawBufferPointer(rebasing: sdu[m.body]))
        case .ack:
            do throws(StreamViolation) { _ = try up.acknowledge(next: m.number, window: m.window) } catch {
                breach(error.description)
            }
        case .close:
            do throws(StreamViolation) { try down.closed(end: m.number) } catch { breach(error.description) }
        case .reset:
            let reason = StreamReason(rawValue: m.reason).map { "\($0.name)" } ?? "\(m.reason)"
            say("\(reason): the device, or the gateway relaying it, reset the stream")
            ending = 1
        case .error:
            let reason = StreamReason(rawValue: m.reason).map { "\($0.name)" } ?? "\(m.reason)"
            say("\(reason): \(Self.printable(sdu, m.body))")
            ending = 1
        case .fetch, .payload, .fetchRefused, .continued:
            breach("a \(m.type) message on a stream link (docs/protocol.md §5.1)")
        }
    }

    /// A data frame from the device, into its slot.
    mutating func take(frame n: UInt32, bytes: UnsafeRawBufferPointer) {
        switch io.take(frame: n, bytes: bytes, acked: acked, down: &down) {
        case .held:
            break
        case .duplicate:
            // A link does not repeat itself; if it did, the frame is dropped and written once.
            break
        case .gap:
            breach("data frame \(n) when \(down.next) was next (a link keeps order)")
        case .breach(let detail):
            breach(detail)
        case .notOpened(let why):
            say(why)
            breach("frame \(n) did not open", quiet: true)
        }
    }

    // MARK: stdin and stdout

    /// One read from stdin as one frame (sealed, if sealing); its end, as the close.
    mutating func readInput() {
        switch io.readStdin(number: up.next, room: up.maxData) {
        case .nothing: break
        case .ended: up.close()
        case .frame(let bytes): _ = up.push(bytes)
        case .failed(let why): giveUp(why)
        }
    }

    /// Writes what stdout takes now; frames written whole may then be acknowledged (`flush`).
    mutating func writeOutput() {
        if let why = io.writeStdout(upTo: down.next) { giveUp(why) }
    }

    // MARK: frames out

    /// Hands the link what is due, in order, until it takes no more: our open, the frames not
    /// yet sent (within the device's window: `up` holds no more), our close, our ack.
    mutating func flush(_ channel: inout LinkChannel) {
        guard case .open = channel.state else { return }
        if !openTransmitted {
            guard send(&channel, .open, { w throws(WireError) in
                try LinkMessage.encodeOpen(window: UInt16(Self.window), maxData: UInt16(Self.maxData), into: &w)
            }) else { return }
            openTransmitted = true
        }
        while transmitted != up.next {
            let n = transmitted
            let bytes = up.frame(n)
            guard send(&channel, .data, body: bytes.count, { w throws(WireError) in
                try LinkMessage.encodeData(frame: n, bytes: bytes, into: &w)
            }) else { return }
            transmitted &+= 1  // Proof: transmitted < up.next here.
        }
        if let end = up.closeEnd, !closeTransmitted {
            guard send(&channel, .close, { w throws(WireError) in try LinkMessage.encodeClose(end: end, into: &w) }) else { return }
            closeTransmitted = true
        }
        if acked != written {
            let next = written
            guard send(&channel, .ack, { w throws(WireError) in
                try LinkMessage.encodeAck(next: next, window: UInt16(Self.window), into: &w)
            }) else { return }
            acked = next
        }
    }

    /// One message of `type` (its body `body` bytes long), measured (§5.1), written by
    /// `encode` into `tx` and handed to the link; false when the link takes nothing now (it asks
    /// for POLLOUT) or broke (its state says why).
    @discardableResult
    func send(_ channel: inout LinkChannel, _ type: LinkMessageType, body: Int = 0,
              _ encode: (inout ByteWriter) throws(WireError) -> Void) -> Bool {
        let count = LinkMessage.encodedCount(type, bodyCount: body)
        let bytes = UnsafeMutableRawBufferPointer(rebasing: tx[..<count])
        var w = ByteWriter(bytes)
        // Proof: tx holds a data frame of our max data, the largest message sent, and every
        // field was checked before (window, max data, a frame's bytes ≤ the device's max data,
        // an error's detail ≤ 100 bytes).
        do throws(WireError) { try encode(&w) } catch { preconditionFailure("a \(type) message did not fit its own length: \(error)") }
        do throws(LinkError) { return try channel.send(UnsafeRawBufferPointer(bytes)) } catch {
            return false
        }
    }

    /// A frame that breaks §5.3 ends the stream with error `protocol`, both ways.
    mutating func breach(_ detail: String, quiet: Bool = false) {
        if !quiet { say("protocol: \(detail) (docs/protocol.md §5.3)") }
        breachDetail = detail
        ending = 1
    }

    /// This end cannot go on: the device is told reset `cancelled` (§5.4).
    mutating func giveUp(_ why: String) {
        say(why)
        givingUp = true
        ending = 1
    }

    /// Says why (if it must) to the device, lets the link hand over what it holds, hangs up.
    mutating func finish(_ channel: inout LinkChannel, _ status: Int32) -> Int32 {
        if givingUp {
            send(&channel, .reset) { w throws(WireError) in try LinkMessage.encodeReset(.cancelled, into: &w) }
            givingUp = false
        }
        if let detail = breachDetail {
            var text = Substring(detail)
            while text.utf8.count > LinkMessage.maxDetailBytes { text = text.dropLast() }
            let cut = text
            send(&channel, .error, body: cut.utf8.count) { w throws(WireError) in
                try LinkMessage.encodeError(.protocolError, detail: cut, into: &w)
            }
            breachDetail = nil
        }
        // The device leaves the hang-up to us after its close (docs/vm.md); what we sent last is
        // on the link once it is writable again (Linux suspends the socket while SDUs wait for
        // credits and resumes it when they have gone).
        if channel.fd >= 0 {
            var p = pollfd(fd: channel.fd, events: Int16(POLLOUT), revents: 0)
            _ = Glibc.poll(&p, 1, Self.drainLimit)
        }
        channel.close()
        return status
    }

    func say(_ text: String) {
        Stderr.say("continue", text)
    }

    /// Someone else's UTF-8 (decode checked it) without control characters, for the terminal.
    static func printable(_ sdu: UnsafeRawBufferPointer, _ body: Range<Int>) -> String {
        let text = String(decoding: UnsafeRawBufferPointer(rebasing: sdu[body]), as: UTF8.self)
        return String(text.map { $0.unicodeScalars.contains { $0.properties.generalCategory == .control } ? "?" : $0 })
    }
}
