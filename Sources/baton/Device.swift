import BatonLibc
import ArgumentParser
import BatonHCI
import BatonKeys
import BatonRelay
import BatonDevice
import BatonWire
import Foundation
import Glibc

/// `baton device`: the originating side on Linux (docs/radio.md "baton device"). Advertises the current
/// activity's beacon (docs/protocol.md §2) through BlueZ's management interface, bumps the
/// sequence on every save, sets the invalidated flag when the activity ends, and serves payload
/// fetches and continuation streams on its L2CAP LE credit-based channel (§5) with the same
/// device logic as the simulator (BatonDevice's `DeviceLinkServer`). Also the reference phone
/// and ESP32 makers read next to docs/protocol.md.
struct DeviceCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device",
        abstract: "Be the device: advertise an activity beacon through BlueZ and serve its payload and streams.",
        discussion: """
            While it runs, each line on stdin is a command: `save` (or an empty line) saves the \
            activity: --user-info is read again and the sequence bumped; `end` ends it (the beacon \
            says invalidated). SIGHUP saves as well; SIGTERM, Ctrl-C and `end` end the activity, keep \
            advertising the ended beacon for --linger seconds so gateways hear it, then stop. Needs \
            CAP_NET_ADMIN (advertising through the kernel's management interface). Exit status: 0 \
            after an end; 1 when the adapter cannot advertise (the reason on stderr).
            """)

    @Option(help: "The Bluetooth adapter to advertise on: hciN or its address.")
    var adapter = "hci0"
    @Option(name: .customLong("type"), help: "The activity type, reverse DNS (com.example.reader.article).")
    var activityType: String
    @Option(help: "The activity's title.")
    var title: String?
    @Option(help: "The webpage URL a browser continues at (http or https).")
    var url: String?
    @Option(name: .customLong("user-info"), help: "A JSON object file: the activity's userInfo, read at start and on every save.")
    var userInfoFile: String?
    @Option(help: "The beacon's device id, 12 hex digits (default: the adapter's address).")
    var id: String?
    @Option(help: "The group hash, 8 hex digits (docs/protocol.md §2.3; the open group has no key).")
    var group = "00000000"
    @Option(name: .customLong("company-id"), help: "The company id beacons are sent under; gateways must agree (radio.company-id).")
    var companyID = "0xFFFF"
    @Option(help: "The L2CAP PSM to serve on, 0x80–0xFF, or 0: one the kernel picks.")
    var psm = "0"
    @Option(help: "The first sequence number (default: the clock's seconds mod 65536, so a restarted device is newer).")
    var sequence: Int?
    @Option(help: "The group secret file (BATON-GROUP-V1:…, docs/security.md §1): tag every beacon, rotate the id, seal payloads and streams. Replaces --id and --group.")
    var key: String?
    @Option(help: "With --key: this device's number in its group, for one stable identity across rotation (docs/security.md §3.1).")
    var identity: Int?
    @Option(help: "With --key: seconds between id rotations (default 900, BLE privacy's 15 minutes; 0: never).")
    var rotate: Double?
    @Flag(name: .customLong("no-streams"), help: "Say the activity supports no continuation streams.")
    var noStreams = false
    @Option(help: "Seconds the ended beacon stays on the air before the device stops.")
    var linger: Double = 3
    @Flag(name: .customLong("print-payload"),
          help: "Print the payload a fetch gets (deterministic CBOR, hex) and the beacon's advertising data, then exit; needs no Bluetooth.")
    var printPayload = false

    func run() throws {
        let settings = try parseSettings()
        if printPayload {
            // What a fetch returns and what goes on the air, for makers comparing their own
            // device's bytes (docs/radio.md "baton device"): the id is --id, or zero without one.
            let activity = try DeviceActivity(settings: settings, id: settings.id ?? 0, psm: settings.psm)
            let hex = { (b: [UInt8]) in b.map { String(format: "%02x", $0) }.joined() }
            FileHandle.standardOutput.write(Data("payload \(hex(activity.payload))\nadvertisement \(hex(activity.advertisement()))\n".utf8))
            return
        }
        var device: DeviceRunner
        do {
            device = try DeviceRunner(settings: settings)
        } catch {
            Stderr.say("device", "\(error)")
            throw ExitCode(1)
        }
        let status = device.run()
        if status != 0 { throw ExitCode(status) }
    }

    func parseSettings() throws -> DeviceSettings {
        func hex(_ text: String, digits: Int, _ flag: String) throws -> UInt64 {
            var t = text.lowercased().filter { $0 != ":" }
            if t.hasPrefix("0x") { t.removeFirst(2) }
            guard !t.isEmpty, t.count <= digits, let v = UInt64(t, radix: 16) else {
                throw ValidationError("\(flag) must be at most \(digits) hex digits, got \"\(text)\"")
            }
            return v
        }
        let company = try hex(companyID, digits: 4, "--company-id")
        guard company != 0x004C else {
            throw ValidationError("--company-id 0x004C is Apple's: gateways read it as Continuity, not as a beacon (docs/protocol.md §1)")
        }
        let psmValue: UInt64 = psm.lowercased().hasPrefix("0x") ? try hex(psm, digits: 4, "--psm") : UInt64(psm) ?? .max
        guard psmValue == 0 || (0x80...0xFF).contains(psmValue) else {
            throw ValidationError("--psm must be 0 (any) or a dynamic LE PSM 0x80–0xFF (128–255), got \(psm)")
        }
        guard linger >= 0, linger <= 600 else { throw ValidationError("--linger must be 0–600 seconds") }
        if let sequence, !(0...0xFFFF).contains(sequence) { throw ValidationError("--sequence must be 0–65535") }
        var keys: GroupKeys? = nil
        if let key {
            guard id == nil else { throw ValidationError("--id and --key do not go together: a keyed device's ids are drawn from its key (docs/security.md §3)") }
            guard group == "00000000" else { throw ValidationError("--group and --key do not go together: the key gives the group hash (docs/security.md §2.2)") }
            do { keys = try GroupKeys.derive(secret: GroupSecret.load(path: key)) } catch {
                throw ValidationError("--key \(key): \(error)")
            }
        } else if identity != nil || rotate != nil {
            throw ValidationError("--identity and --rotate need --key: only a keyed group's ids rotate and resolve")
        }
        if let identity, !(0...0xFFFF).contains(identity) { throw ValidationError("--identity must be 0–65535") }
        // An identity's sequence must never go back (docs/security.md §3.1): gateways remember
        // it. Without --sequence, the last one this machine used is kept in a file.
        var sequenceFile: String? = nil
        var first = sequence.map { UInt16(truncatingIfNeeded: $0) }
        if let keys, let identity {
            let home = ProcessInfo.processInfo.environment["HOME"] ?? "/tmp"
            let dir = ProcessInfo.processInfo.environment["XDG_STATE_HOME"] ?? home + "/.local/state"
            sequenceFile = dir + "/baton/device-" + String(format: "%08x-%d", keys.groupHash, identity) + ".sequence"
            if first == nil, let text = try? String(contentsOfFile: sequenceFile!, encoding: .utf8),
               let last = UInt16(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
                first = last &+ 1
            }
        }
        if let rotate, !(0...86_400).contains(rotate) { throw ValidationError("--rotate must be 0–86400 seconds") }
        let settings = DeviceSettings(
            adapter: adapter, activityType: activityType, title: title, url: url, userInfoFile: userInfoFile,
            id: try id.map { try hex($0, digits: 12, "--id") }, group: UInt32(try hex(group, digits: 8, "--group")),
            companyID: UInt16(company), psm: UInt16(psmValue),
            sequence: first ?? UInt16(truncatingIfNeeded: Int(time(nil))), streams: !noStreams,
            linger: .milliseconds(Int64(linger * 1000)), keys: keys, identity: identity.map { UInt16($0) },
            rotate: keys == nil ? .zero : .milliseconds(Int64((rotate ?? 900) * 1000)), sequenceFile: sequenceFile)
        // The payload must be valid before anything goes on the air.
        do {
            _ = try DeviceActivity.content(settings)
        } catch let error as DeviceError {
            throw ValidationError(error.description)
        }
        return settings
    }
}

/// What `baton device` was asked to be.
struct DeviceSettings {
    var adapter: String
    var activityType: String
    var title: String?
    var url: String?
    var userInfoFile: String?
    /// nil: the adapter's address.
    var id: UInt64?
    var group: UInt32
    var companyID: UInt16
    var psm: UInt16
    var sequence: UInt16
    var streams: Bool
    var linger: Duration
    /// A keyed group's device (docs/security.md): its keys, its identity number, how often its
    /// id rotates (zero: never). nil keys: the open group.
    var keys: GroupKeys? = nil
    var identity: UInt16? = nil
    var rotate: Duration = .zero
    /// Where an identity's last sequence is kept between runs (`~/.local/state/baton/…`).
    var sequenceFile: String? = nil
}

/// Errors of the device's own making: a bad activity or user-info file.
struct DeviceError: Error, CustomStringConvertible {
    var description: String
}

/// The device's one activity: the beacon it advertises and the payload it answers fetches with.
final class DeviceActivity: LinkDeviceModel {
    let settings: DeviceSettings
    /// The id fetches and streams name the device by (topics' `<device>`): a keyed device's
    /// identity id (security.md §3.1), or the id on air.
    private(set) var id: UInt64
    private(set) var beacon: ActivityBeacon
    /// A keyed group's device: tags its beacons, makes its rotating ids, seals (security.md).
    let tagger: BeaconTagger?
    let idMaker: DeviceIDResolver?
    let sealer: SealedEnvelope?
    private(set) var payload: [UInt8]
    /// The sequence the activity began at: a fetch for an older one is refused (§5.2).
    let activityStart: UInt16
    /// Payloads up to what one link message carries (docs/protocol.md §5.1: 3 + 65532 fits the
    /// largest relay.payload-max); a gateway refuses what is over its own payload-max.
    static let limits = PayloadLimits(maxBytes: 65_532)

    init(settings: DeviceSettings, id: UInt64, psm: UInt16) throws {
        self.settings = settings
        self.id = id
        var flags: BeaconFlags = []
        if settings.streams { flags.insert(.supportsStreams) }
        if settings.url != nil { flags.insert(.hasWebURL) }
        if let keys = settings.keys {
            tagger = try BeaconTagger(key: keys.beaconKey)
            let irk = try settings.identity.map { try keys.beaconKey.identityKey(number: $0) }
            idMaker = try irk.map { try DeviceIDResolver(irk: $0) } ?? DeviceIDResolver(key: keys.beaconKey)
            sealer = try SealedEnvelope(key: keys.payloadKey)
        } else {
            tagger = nil; idMaker = nil; sealer = nil
        }
        beacon = ActivityBeacon(flags: flags, sequence: settings.sequence,
                                activityTypeHash: activityTypeHash(settings.activityType.utf8),
                                groupHash: settings.keys?.groupHash ?? settings.group, deviceID: id, psm: psm)
        activityStart = settings.sequence
        payload = try Self.content(settings).encoded(limits: Self.limits)
        try rotate()
    }

    /// A keyed device draws a new id (docs/security.md §3; the adapter's own address rotates
    /// with the kernel's privacy setting, not here). Nothing for an open group's device.
    func rotate() throws {
        guard let idMaker, let keys = settings.keys else { return }
        beacon.deviceID = try idMaker.newDeviceID()
        id = settings.identity.map { DeviceIdentity.id(groupHash: keys.groupHash, number: $0) } ?? beacon.deviceID
    }

    /// The payload content from the flags and the user-info file as it is now.
    static func content(_ s: DeviceSettings) throws -> ActivityPayloadContent {
        var userInfo: [String: UserInfoValue] = [:]
        if let path = s.userInfoFile {
            let data: Data
            do throws(Errno) { data = Data(try readFile(path)) } catch {
                throw DeviceError(description: "--user-info \(path): cannot read the file: \(error.message)")
            }
            do {
                let value = try JSONDecoder().decode(JSONUserInfo.self, from: data)
                guard case .dictionary(let d) = value.value else {
                    throw DeviceError(description: "--user-info \(path): the file must hold a JSON object (userInfo is a dictionary)")
                }
                userInfo = d
            } catch let e as DeviceError {
                throw e
            } catch {
                throw DeviceError(description: "--user-info \(path): not JSON: \(error)")
            }
        }
        let content = ActivityPayloadContent(activityType: s.activityType, title: s.title, webpageURL: s.url, userInfo: userInfo)
        do {
            _ = try content.encoded(limits: limits)
        } catch {
            throw DeviceError(description: "the activity is not a valid payload (docs/payload.md): \(error)")
        }
        return content
    }

    /// A save (NSUserActivity needsSave → saved): the user info is read again, the sequence
    /// bumped (docs/protocol.md §2.3; it wraps, compared by serial arithmetic).
    func save() throws {
        let bytes = try Self.content(settings).encoded(limits: Self.limits)
        payload = bytes
        beacon.sequence &+= 1
    }

    /// The activity ended (NSUserActivity invalidate): the same sequence, flag set (§2.2).
    func end() { beacon.flags.insert(.invalidated) }
    var ended: Bool { beacon.flags.contains(.invalidated) }

    /// The 31-byte advertisement (§2.1).
    func advertisement() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
        bytes.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            // Proof: the buffer is exactly advertisementLength bytes.
            do throws(WireError) {
                if let tagger {
                    try beacon.encodeAdvertisement(companyID: settings.companyID, authenticator: tagger, into: &w)
                } else {
                    try beacon.encodeAdvertisement(companyID: settings.companyID, authenticator: OpenGroup(), into: &w)
                }
            } catch { preconditionFailure("31 bytes fit: \(error)") }
        }
        return bytes
    }

    // MARK: LinkDeviceModel

    func fetchAnswer(device: Int, asked: UInt16) -> LinkFetchAnswer {
        // Gone: ended, or the fetch names a sequence before this activity began (§5.2 `01`).
        if ended || Int16(bitPattern: asked &- activityStart) < 0 { return .refused(.notCurrent) }
        guard let sealer else { return .payload(sequence: beacon.sequence, bytes: payload) }
        // Sealed for (the id it is fetched under, the sequence): security.md §5.2.
        var sealed = [UInt8](repeating: 0, count: SealedEnvelope.sealedLength(plaintextCount: payload.count))
        let context = PayloadContext(deviceID: id, sequence: beacon.sequence)
        let n = payload.withUnsafeBytes { p in sealed.withUnsafeMutableBytes { try? sealer.sealPayload(p, for: context, into: $0) } }
        guard let n else { return .refused(.notCurrent) }
        return .payload(sequence: beacon.sequence, bytes: Array(sealed[..<n]))
    }
    func offersStreams(device: Int) -> Bool { settings.streams }
    func linkDeviceID(_ device: Int) -> UInt64 { id }
    func linkDeviceName(_ device: Int) -> String { ActivityBeacon.deviceIDText(id) }
    /// A keyed group's device seals its streams (security.md §5.2); an open group's does not.
    func streamSealer(device: Int) -> SealedEnvelope? { sealer }
}

/// A JSON value as userInfo (docs/radio.md "baton device", userInfo): objects, arrays, strings, numbers
/// (whole numbers as integers), booleans and null. JSON has no data, date, URL or set.
struct JSONUserInfo: Decodable {
    var value: UserInfoValue
    init(from decoder: any Decoder) throws {
        if var array = try? decoder.unkeyedContainer() {
            var items: [UserInfoValue] = []
            while !array.isAtEnd { items.append(try array.decode(JSONUserInfo.self).value) }
            value = .array(items)
            return
        }
        if let object = try? decoder.container(keyedBy: AnyKey.self) {
            var d: [String: UserInfoValue] = [:]
            for key in object.allKeys { d[key.stringValue] = try object.decode(JSONUserInfo.self, forKey: key).value }
            value = .dictionary(d)
            return
        }
        let single = try decoder.singleValueContainer()
        if single.decodeNil() { value = .null }
        else if let b = try? single.decode(Bool.self) { value = .bool(b) }
        else if let i = try? single.decode(Int64.self) { value = .int(i) }
        else if let x = try? single.decode(Double.self) { value = .double(x) }
        else { value = .string(try single.decode(String.self)) }
    }
    struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
}

// MARK: - The run loop

/// SIGHUP, SIGTERM and SIGINT as bytes on a pipe the loop polls (the self-pipe trick, as
/// `StopSignals` in the gateway; write(2) is async-signal-safe).
nonisolated(unsafe) private var deviceSignalWriteEnd: Int32 = -1

struct DeviceRunner: ~Copyable {
    let settings: DeviceSettings
    var mgmt: ManagementSocket
    let listener: L2CAPListener
    let activity: DeviceActivity
    let server: DeviceLinkServer
    let signalRead: Int32
    let addressText: String

    /// The mgmt advertising instance: the highest one free when the device started
    /// (`AdvertisingFeatures.freeInstance`), out of bluetoothd's way.
    let instance: UInt8

    init(settings: DeviceSettings) throws {
        // Everything that can fail first, into locals: a noncopyable member is assigned once.
        var mgmt = try ManagementSocket(adapter: settings.adapter)
        var info = try mgmt.controllerInformation()
        guard info.supportedSettings.contains(.lowEnergy) else {
            throw DeviceError(description: "Bluetooth adapter \(settings.adapter) has no Bluetooth Low Energy, which the beacon needs")
        }
        if !info.currentSettings.contains(.powered) {
            try mgmt.setPowered(true)
            info = try mgmt.controllerInformation()
        }
        guard let free = try mgmt.advertisingFeatures().freeInstance else {
            throw DeviceError(description: "every advertising instance of \(settings.adapter) is in use (`btmgmt -i \(settings.adapter) advinfo` lists them)")
        }
        // The receive MTU is also how many credits the kernel grants a gateway: Linux gives
        // MTU / MPS + 1 (l2cap_core.c `l2cap_le_flowctl_init`), so an MTU of one SDU lets one SDU
        // be in flight, and a gateway that finds no credits drops a stream frame and waits for
        // the resend (docs/vm.md: 100 KB took 28 s instead of 2 s on the real stack). The largest MTU
        // grants enough for a whole stream window; the link still carries at most
        // DeviceLinkServer.receiveMTU per SDU (§5.3: the device's open says so).
        let listener = try L2CAPListener(adapter: settings.adapter, psm: settings.psm, receiveMTU: 65_535)
        let activity = try DeviceActivity(settings: settings, id: settings.id ?? info.address, psm: listener.psm)
        self.settings = settings
        self.mgmt = mgmt
        self.instance = free
        self.listener = listener
        self.activity = activity
        server = DeviceLinkServer(device: activity)
        addressText = Self.addressText(info)

        var ends: (Int32, Int32) = (-1, -1)
        let ok = withUnsafeMutablePointer(to: &ends) { $0.withMemoryRebound(to: Int32.self, capacity: 2) { pipe($0) } }
        precondition(ok == 0, "pipe failed: errno \(Glibc.errno)")
        for end in [ends.0, ends.1] {
            _ = Glibc.fcntl(end, F_SETFL, Glibc.fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = Glibc.fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        signalRead = ends.0
        deviceSignalWriteEnd = ends.1
        for sig in [SIGHUP, SIGTERM, SIGINT] {
            signal(sig) { sig in
                var byte = UInt8(truncatingIfNeeded: sig)
                _ = write(deviceSignalWriteEnd, &byte, 1)
            }
        }
        signal(SIGPIPE, SIG_IGN)
    }

    /// Writes the sequence going on the air to `sequenceFile`, so the next run starts after it.
    func keepSequence() {
        guard let path = settings.sequenceFile else { return }
        let dir = (path as NSString).deletingLastPathComponent
        do {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try "\(activity.beacon.sequence)\n".write(toFile: path, atomically: true, encoding: .utf8)
        } catch {
            Stderr.say("device", "cannot keep the sequence in \(path): \(error); give --sequence next time, above \(activity.beacon.sequence)")
        }
    }

    /// "00:AA:01:01:00:01 (public)": how a gateway sees this device.
    static func addressText(_ info: ControllerInformation) -> String {
        let a = info.address
        let text = (0..<6).reversed().map { String(format: "%02X", UInt8(truncatingIfNeeded: a >> (8 * UInt64($0)))) }.joined(separator: ":")
        return info.usesStaticAddress ? "its static random address" : "\(text) (public)"
    }

    func say(_ line: String) {
        // One write per line, unbuffered: a script reading a pipe sees each event at once.
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    /// Puts the current beacon on the air. Remove, then add: the kernel then disables and
    /// enables advertising, which makes a scanner that reports an advertiser only when its
    /// advertising starts (BlueZ's btvirt, docs/vm.md) hear the change; a real radio hears it on
    /// the next advertising event either way.
    mutating func advertise() throws {
        keepSequence()
        try mgmt.removeAdvertising(instance: instance)
        let data = activity.advertisement()
        try data.withUnsafeBytes { p throws in
            // Connectable: gateways open the link on the advertised address (§5).
            try mgmt.addAdvertising(instance: instance, flags: .connectable, data: p)
        }
    }

    mutating func run() -> Int32 {
        do {
            try advertise()
        } catch {
            Stderr.say("device", "\(error)")
            return 1
        }
        let idText = ActivityBeacon.deviceIDText(activity.id)
        say("advertising \(idText) seq \(activity.beacon.sequence) on \(settings.adapter) at \(addressText), psm 0x\(String(listener.psm, radix: 16))")
        var stdinOpen = true
        var line: [UInt8] = []
        var endsAt: Instant?
        var rotateAt: Instant? = settings.rotate > .zero ? .now + settings.rotate : nil
        var fds: [pollfd] = []
        fds.reserveCapacity(3 + DeviceLinkServer.capacity)
        var status: Int32 = 0
        while true {
            if let endsAt, Instant.now >= endsAt { break }
            fds.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: signalRead, events: Int16(POLLIN), revents: 0))
            fds.append(pollfd(fd: stdinOpen && endsAt == nil ? 0 : -1, events: Int16(POLLIN), revents: 0))
            fds.append(pollfd(fd: listener.fd, events: Int16(POLLIN), revents: 0))
            server.addPollFDs(&fds)
            var wake = server.nextDue
            if let endsAt { wake = min(wake ?? endsAt, endsAt) }
            if let rotateAt { wake = min(wake ?? rotateAt, rotateAt) }
            let timeout = wake.map { ($0 - .now).pollMilliseconds(atMost: 60_000) } ?? 1000
            _ = Glibc.poll(&fds, nfds_t(fds.count), timeout)

            if let at = rotateAt, Instant.now >= at, endsAt == nil {
                rotateAt = at + settings.rotate
                do {
                    try activity.rotate()
                    try advertise()
                    say("rotated: on air as \(ActivityBeacon.deviceIDText(activity.beacon.deviceID))")
                } catch {
                    Stderr.say("device", "rotating: \(error)")
                }
            }
            var commands: [String] = []
            if fds[0].revents != 0 {
                var byte: UInt8 = 0
                while read(signalRead, &byte, 1) == 1 {
                    commands.append(Int32(byte) == SIGHUP ? "save" : "end")
                }
            }
            if fds[1].revents != 0 {
                var chunk = [UInt8](repeating: 0, count: 4096)
                let n = read(0, &chunk, chunk.count)
                if n <= 0 {
                    stdinOpen = false  // EOF: keep running; SIGTERM ends it (e.g. under systemd)
                } else {
                    for b in chunk[..<n] {
                        if b == 0x0A {
                            commands.append(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespaces))
                            line.removeAll(keepingCapacity: true)
                        } else if line.count < 256 {
                            line.append(b)
                        }
                    }
                }
            }
            for command in commands where endsAt == nil {
                switch command {
                case "", "save":
                    do {
                        try activity.save()
                        try advertise()
                        say("saved \(idText) seq \(activity.beacon.sequence)")
                    } catch {
                        Stderr.say("device", "save failed: \(error)")
                    }
                case "end":
                    activity.end()
                    do { try advertise() } catch {
                        Stderr.say("device", "\(error)")
                        status = 1
                    }
                    say("ended \(idText) seq \(activity.beacon.sequence)")
                    endsAt = .now + settings.linger
                default:
                    Stderr.say("device", "unknown command \"\(command)\" (save, end)")
                }
            }
            if fds[2].revents != 0 {
                while true {
                    let accepted: (fd: Int32, peer: LinkAddress)?
                    do { accepted = try listener.accept() } catch {
                        Stderr.say("device", "\(error)")
                        break
                    }
                    guard let accepted else { break }
                    if server.adopt(fd: accepted.fd) {
                        say("link from \(accepted.peer)")
                    } else {
                        Stderr.say("device", "every link slot (\(DeviceLinkServer.capacity)) is in use; refused \(accepted.peer)")
                    }
                }
            }
            server.serve(fds[...]) { c in
                say("continued in \(c.room) (seq \(c.sequence))")
            }
        }
        do { try mgmt.removeAdvertising(instance: instance) } catch {
            Stderr.say("device", "\(error)")
        }
        server.close()
        let c = server.linkCounts[0]
        say("stopped: \(c.links) links, \(c.fetches) fetches, \(c.streams) streams, \(c.continued) continued")
        return status
    }
}
