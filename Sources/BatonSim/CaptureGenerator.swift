// A deterministic generator of advertising traffic with known contents: Baton devices sending
// activity beacons, Apple devices sending Continuity frames, and ordinary devices sending
// names. Tests assert exact decoded output against what it says it wrote; scripts/bench
// decodes its large captures; the README's first command replays a small one.
import BatonWire

/// A small, fast, deterministic PRNG (SplitMix64), so a seed names a capture exactly.
public struct SplitMix64: RandomNumberGenerator {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// One simulated device and what it advertises.
public struct SimulatedDevice: Sendable {
    public enum Kind: Sendable, Equatable {
        /// A Baton device: its current beacon (the sequence is bumped as it saves).
        case baton(ActivityBeacon)
        /// An Apple device: the Handoff sequence it currently sends.
        case apple(handoffSequence: UInt16)
        /// Anything else: a named sensor, a speaker, a TV.
        case ordinary(name: String)
    }

    public var kind: Kind
    public var address: UInt64
    /// 0 public, 1 random (HCI LE Advertising Report Address_Type).
    public var addressType: UInt8
    public var rssi: Int8
    /// True when this device's reports go out as LE Extended Advertising Reports.
    public var extended: Bool
}

/// One advertising report as the generator emitted it.
public struct GeneratedReport: Sendable {
    public var timestamp: Int64
    public var device: Int
    public var kind: SimulatedDevice.Kind
    public var address: UInt64
    public var addressType: UInt8
    public var rssi: Int8
    public var extended: Bool
    public var data: [UInt8]
    /// §7.7.65.13 Data_Status (extended reports): 0 complete, 1 more to come, 2 truncated.
    public var dataStatus: UInt8 = 0
    /// A legacy Event_Type other than the kind's (§7.7.65.2): 0x02 ADV_SCAN_IND, 0x04 SCAN_RSP.
    public var legacyEventType: UInt8? = nil

    public init(timestamp: Int64, device: Int, kind: SimulatedDevice.Kind, address: UInt64, addressType: UInt8,
                rssi: Int8, extended: Bool, data: [UInt8], dataStatus: UInt8 = 0, legacyEventType: UInt8? = nil) {
        self.timestamp = timestamp
        self.device = device
        self.kind = kind
        self.address = address
        self.addressType = addressType
        self.rssi = rssi
        self.extended = extended
        self.data = data
        self.dataStatus = dataStatus
        self.legacyEventType = legacyEventType
    }
}

public struct CaptureGenerator {
    public private(set) var devices: [SimulatedDevice]
    public let beaconCompanyID: UInt16
    var rng: SplitMix64
    var clock: Int64
    /// How many reports a device sends between saves (sequence bumps) of its activity.
    public var saveEvery: Int
    /// Extended devices send long advertisements (230–699 bytes, the beacon or the Continuity
    /// data last), each as a chain of reports of at most 229 bytes (Core 5.4, Vol 4, Part E,
    /// §7.7.65.13), interleaved with other devices' reports (docs/simulator.md). Off by default,
    /// so the captures of a seed stay what they were.
    public var longAdvertisements = false
    /// Fragments not yet sent, oldest chain first.
    var pending: [GeneratedReport] = []
    /// Chains begun whose fragments are all out (reports of `next` that complete one).
    public private(set) var chainsCompleted = 0

    public static let activityTypes = [
        "com.example.reader.article", "com.example.mail.compose", "com.example.video.watch",
        "org.example.notes.edit", "net.example.maps.route",
    ]

    /// `devices` devices: a third Baton devices, a third Apple devices, a third ordinary.
    /// Timestamps start at `start` (µs since the Unix epoch) and advance 1–20 ms a report.
    public init(devices count: Int, seed: UInt64 = 1, beaconCompanyID: UInt16 = ActivityBeacon.defaultCompanyID,
                start: Int64 = 1_795_000_000_000_000, saveEvery: Int = 40) {
        precondition(count > 0)
        var rng = SplitMix64(seed: seed)
        var devices: [SimulatedDevice] = []
        for i in 0..<count {
            let address = rng.next() & 0xFFFF_FFFF_FFFF
            let rssi = Int8(-40 - Int(rng.next() % 50))
            let kind: SimulatedDevice.Kind
            switch i % 3 {
            case 0:
                let type = Self.activityTypes[Int(rng.next() % UInt64(Self.activityTypes.count))]
                // An RPA-shaped id: prand's top two bits are 0b01 (Core Vol 6 Part B §1.3.2.2).
                let id = (rng.next() & 0x3FFF_FFFF_FFFF) | 0x4000_0000_0000
                var flags: BeaconFlags = []
                if rng.next() % 2 == 0 { flags.insert(.supportsStreams) }
                if rng.next() % 2 == 0 { flags.insert(.hasWebURL) }
                kind = .baton(ActivityBeacon(flags: flags, sequence: UInt16(truncatingIfNeeded: rng.next()),
                                             activityTypeHash: activityTypeHash(type.utf8), groupHash: 0xA1B2_C3D4,
                                             deviceID: id, psm: 0x0080 + UInt16(i % 64)))
            case 1:
                kind = .apple(handoffSequence: UInt16(truncatingIfNeeded: rng.next()))
            default:
                kind = .ordinary(name: "Sensor \(i)")
            }
            // Random addresses carry their sub-type in the top two bits (Core 5.4, Vol 6, Part B,
            // §1.3.2): an Apple device's is resolvable (0b01), as iPhones advertise; a Baton
            // device's static (0b11). 0b10 is reserved, and Home Assistant's clients read the bits.
            let random: UInt64
            if case .apple = kind { random = address & 0x3FFF_FFFF_FFFF | 0x4000_0000_0000 }
            else { random = address | 0xC000_0000_0000 }
            devices.append(SimulatedDevice(kind: kind, address: i % 3 == 2 ? address : random, addressType: i % 3 == 2 ? 0 : 1,
                                           rssi: rssi, extended: i % 5 == 4))
        }
        self.devices = devices
        self.beaconCompanyID = beaconCompanyID
        self.rng = rng
        self.clock = start
        self.saveEvery = saveEvery
    }

    /// The next report: a random device advertises its current state; Baton devices save
    /// (bump the sequence) every `saveEvery` reports on average, Apple devices change their
    /// Handoff sequence as often.
    public mutating func next() -> GeneratedReport {
        clock += 1_000 + Int64(rng.next() % 19_000)
        // Three times in four, an open chain goes on (as a controller reports each AUX_CHAIN_IND
        // it receives): few chains are open at once, and each ends well within 2.5 s.
        if longAdvertisements, !pending.isEmpty, rng.next() % 4 != 0 { return nextFragment() }
        let i = Int(rng.next() % UInt64(devices.count))
        // A device in the middle of its chain sends the chain's next fragment, not a new one.
        if longAdvertisements, pending.contains(where: { $0.device == i }) { return nextFragment(of: i) }
        if rng.next() % UInt64(saveEvery) == 0 {
            switch devices[i].kind {
            case .baton(var b): b.sequence &+= 1; devices[i].kind = .baton(b)
            case .apple(let s): devices[i].kind = .apple(handoffSequence: s &+ 1)
            case .ordinary: break
            }
        }
        let d = devices[i]
        let noise = Int8(truncatingIfNeeded: Int(rng.next() % 7) - 3)
        let report = GeneratedReport(timestamp: clock, device: i, kind: d.kind, address: d.address,
                                     addressType: d.addressType, rssi: d.rssi &+ noise, extended: d.extended,
                                     data: advertisingData(d.kind))
        guard longAdvertisements, d.extended else { return report }
        var long = report
        long.data = Self.padding(device: i) + report.data
        let chain = AdvertisingEvents.fragments(long)
        pending += chain.dropFirst()
        return chain[0]
    }

    /// The next fragment of device `i`'s chain (or of the oldest chain), stamped now.
    mutating func nextFragment(of i: Int? = nil) -> GeneratedReport {
        let k = i.flatMap { d in pending.firstIndex { $0.device == d } } ?? 0
        var f = pending.remove(at: k)
        f.timestamp = clock
        if f.dataStatus == 0 { chainsCompleted += 1 }
        return f
    }

    /// The rest of every open chain, so a capture or a run ends with whole advertisements.
    public mutating func finishChains() -> [GeneratedReport] {
        var out: [GeneratedReport] = []
        while !pending.isEmpty {
            clock += 1_000
            out.append(nextFragment())
        }
        return out
    }

    /// What goes before a long advertiser's usual data: URI AD structures (type 0x24, Core
    /// Supplement, Part A, §1.18) of deterministic text, 199–668 bytes in all, by device.
    static func padding(device i: Int) -> [UInt8] {
        var left = 199 + (i &* 97) % 470
        var out: [UInt8] = []
        while left > 0 {
            // Pieces of at most 200 bytes, none shorter than 2 (Length and AD Type).
            let n = left <= 200 ? left : left - 200 >= 2 ? 200 : 150
            let text = n - 2
            out += [UInt8(text + 1), 0x24] + (0..<text).map { UInt8(0x61 + ($0 + i) % 26) }
            left -= n
        }
        return out
    }

    /// Ends every Baton device's activity: each sends one beacon with the invalidated flag.
    public mutating func invalidateAll() -> [GeneratedReport] {
        // Open chains end first: an invalidation must not be taken for a chain's last fragment.
        var out: [GeneratedReport] = finishChains()
        for i in devices.indices {
            guard case .baton(var b) = devices[i].kind else { continue }
            b.flags.insert(.invalidated)
            b.sequence &+= 1
            devices[i].kind = .baton(b)
            clock += 1_000
            let d = devices[i]
            out.append(GeneratedReport(timestamp: clock, device: i, kind: d.kind, address: d.address,
                                       addressType: d.addressType, rssi: d.rssi, extended: d.extended,
                                       data: advertisingData(d.kind)))
        }
        return out
    }

    func advertisingData(_ kind: SimulatedDevice.Kind) -> [UInt8] {
        switch kind {
        case .baton(let b):
            var out = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
            out.withUnsafeMutableBytes { raw in
                var w = ByteWriter(raw)
                // Proof: the buffer is exactly advertisementLength bytes.
                do throws(WireError) { try b.encodeAdvertisement(companyID: beaconCompanyID, authenticator: OpenGroup(), into: &w) }
                catch { preconditionFailure("a beacon fits 31 bytes") }
            }
            return out
        case .apple(let seq):
            // Flags; Apple data: Nearby Info (status 1, action 0xB, data flags 0x1C, tag) and
            // Handoff (no clipboard, the sequence, tag byte, 10 encrypted bytes).
            return [0x02, 0x01, 0x1A,
                    0x1A, 0xFF, 0x4C, 0x00,
                    0x10, 0x05, 0x1B, 0x1C, 0x7A, 0x8D, 0x2E,
                    0x0C, 0x0E, 0x00, UInt8(truncatingIfNeeded: seq), UInt8(truncatingIfNeeded: seq >> 8), 0x5F,
                    0xC3, 0x91, 0x07, 0x2A, 0xE4, 0x18, 0x66, 0xB0, 0x3D, 0x52]
        case .ordinary(let name):
            let n = Array(name.utf8.prefix(20))
            return [0x02, 0x01, 0x06, UInt8(n.count + 1), 0x09] + n + [0x02, 0x0A, 0xF4]
        }
    }
}
