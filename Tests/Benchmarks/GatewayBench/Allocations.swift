// Heap allocations per unchanged advertisement through the whole gateway loop
// (docs/performance.md "Allocations in the loop"). In process: a `Gateway<RadioCapture>` built
// with its public init, connected to the bench's mosquitto, turned by the bench with the same
// `turn()` its `run()` calls. Every call in a counted turn is counted: poll(), the capture
// radio, the decoder, both tables, the publisher, libmosquitto's loop calls, the timers.
//
// The capture is paced at its own timestamps, in phases:
//   0 ms          one HCI command record (skipped by the radio; it only starts the clock);
//   200 ms        every device once: each becomes current (or appears) and is published;
//   400 ms        5,000 warm-up reports, all unchanged: every unchanged path runs once;
//   450–990 ms    a skipped command record every 10 ms: the loop turns, the broker's
//                 PUBACKs and the gateway's own publishes coming back are read and settle;
//   1000 ms       the measured reports, 20 µs apart (100,000 take 2 s, so the window holds
//                 libmosquitto's once-a-second loop_misc too), every one unchanged: identical
//                 beacons, identical Continuity, identical names; only the RSSI moves;
//   +1 h          one more report, never reached: the replay never finishes inside the
//                 window (its end is logged once, which allocates; a radio never ends).
// Counting starts at the first turn after 900 ms, once the warm-up was heard, and stops after
// the turn that heard the last measured report. The figure is mallocs in those turns divided
// by the reports those turns processed. A subscriber checks afterwards that nothing was
// published while counting, i.e. every counted report was unchanged.
import BatonLibc
import BatonCore
import BatonGateway
import BatonKeys
import BatonHCI
import BatonMQTT
import BatonProxy
import BatonRelay
import BatonSim
import BatonTestSupport
import BatonWire
import CMosquitto
import Foundation
import Glibc
import MallocInterposerSwift

struct AllocationFigures {
    var devices: Int
    var batonDevices: Int
    var mallocs: Int
    var frees: Int
    var reports: Int
    var beacons: Int
    var continuity: Int
    var other: Int
    var turns: Int
    var windowMilliseconds: Double
    var calibrationMallocs: Int
    var libraryCalibrationMallocs: Int
    var publishedDuringWindow: Int
    var statusIntervalSeconds: Int64
    var keepaliveSeconds: Int
    /// Long extended advertisements in fragments (the `fragmented` pass): the counted reports
    /// that were fragments of a chain, the advertisements assembled from them, and the drops.
    var fragments = 0
    var assembled = 0
    var drops = 0
    /// The `esphome` pass: bytes Home Assistant's subscribed client received while counting
    /// (the batches of every report, docs/esphome.md §3.4); 0 proves nothing was measured.
    var esphomeBytes = 0

    var perReport: Double { Double(mallocs) / Double(reports) }
    var perFragment: Double { fragments == 0 ? 0 : Double(mallocs) / Double(fragments) }

    var json: String {
        """
        {"devices": \(devices), "baton_devices": \(batonDevices), "reports_counted": \(reports), \
        "beacons": \(beacons), "continuity": \(continuity), "other": \(other), "turns": \(turns), \
        "window_ms": \(windowMilliseconds), "mallocs": \(mallocs), "frees": \(frees), \
        "allocations_per_unchanged_advertisement": \(perReport), "calibration_mallocs": \(calibrationMallocs), \
        "library_calibration_mallocs": \(libraryCalibrationMallocs), \
        "published_during_window": \(publishedDuringWindow), "status_interval_s": \(statusIntervalSeconds), \
        "keepalive_s": \(keepaliveSeconds), "fragments": \(fragments), "assembled": \(assembled), \
        "drops": \(drops), "allocations_per_fragment": \(perFragment), "esphome_bytes": \(esphomeBytes)}
        """
    }
}

/// The capture's phases, as built.
struct PacedCapture {
    var file: [UInt8]
    var firsts: Int
    var warmup: Int
    var measured: Int
}

/// `endless` false: no report at +1 h, the capture ends with the last measured report (a
/// replay in the running binary ends there and logs it: Firmware.swift's heaptrack count).
func pacedCapture(devices: Int, warmup: Int, measured: Int, seed: UInt64, fragmented: Bool = false,
                  endless: Bool = true) throws -> PacedCapture {
    // saveEvery .max: no device ever saves or changes its Handoff sequence.
    var generator = CaptureGenerator(devices: devices, seed: seed, saveEvery: .max)
    // Fragmented: every extended device's advertisement is 230–699 bytes, a chain of 2–4
    // reports interleaved with the others' (docs/radio.md "Advertisements in fragments").
    generator.longAdvertisements = fragmented
    var firsts: [GeneratedReport] = []
    var rest: [GeneratedReport] = []
    var seen = Set<Int>()
    rest.reserveCapacity(warmup + measured + 1)
    var made = 0
    while rest.count < warmup + measured + 1 || seen.count < devices {
        let r = generator.next()
        if seen.insert(r.device).inserted { firsts.append(r) } else if rest.count < warmup + measured + 1 { rest.append(r) }
        made += 1
        guard made < 100 * (warmup + measured + devices) else { throw BenchError("the generator never reached every device") }
    }

    let base: Int64 = 1_795_000_000_000_000
    var timed: [(Int64, H4PacketType, [UInt8])] = []
    // LE_Set_Scan_Enable (Core 5.4, Vol 4, Part E, §7.8.11) as the host sent it: a record the
    // radio skips, only there to start the replay's clock and to pace the settling turns.
    let command: [UInt8] = [0x0C, 0x20, 0x02, 0x01, 0x00]
    timed.append((base, .command, command))
    for (k, r) in firsts.enumerated() { timed.append((base + 200_000 + Int64(k) * 100, .event, AdvertisingEvents.event([r][...]))) }
    for k in 0..<warmup { timed.append((base + 400_000 + Int64(k) * 10, .event, AdvertisingEvents.event([rest[k]][...]))) }
    for t in stride(from: Int64(460_000), through: 990_000, by: 10_000) { timed.append((base + t, .command, command)) }
    for k in 0..<measured {
        timed.append((base + 1_000_000 + Int64(k) * 20, .event, AdvertisingEvents.event([rest[warmup + k]][...])))
    }
    if endless { timed.append((base + 3_600_000_000, .event, AdvertisingEvents.event([rest[warmup + measured]][...]))) }

    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 + timed.count * 320, alignment: 8)
    defer { buffer.deallocate() }
    var w = ByteWriter(buffer)
    try BTSnoop.writeHeader(datalink: BTSnoop.datalinkH4, into: &w)
    for record in timed {
        let direction: HCIDirection = record.1 == .command ? .hostToController : .controllerToHost
        try record.2.withUnsafeBytes { raw in
            try BTSnoop.writeH4Record(timestamp: record.0, type: record.1, direction: direction, packet: raw, into: &w)
        }
    }
    return PacedCapture(file: Array(w.written), firsts: firsts.count, warmup: warmup, measured: measured)
}

/// Proves the counter counts: a known number of class instances while counting. A counter
/// not wired in would report 0 here, and a 0 for the loop would then mean nothing.
func calibrateCounter() -> Int {
    final class Box { let value: Int; init(_ value: Int) { self.value = value } }
    var boxes: [Box] = []
    boxes.reserveCapacity(1000)
    MallocInterposerSwift.initialize()
    MallocInterposerSwift.hook()
    for i in 0..<1000 { boxes.append(Box(i)) }
    MallocInterposerSwift.unhook()
    precondition(boxes.count == 1000)
    return MallocInterposerSwift.getStatistics().mallocCount
}

/// Proves the counter also sees allocations made inside libmosquitto (a C library calling
/// malloc through its own PLT, as it does in mosquitto_loop_read/_write/_misc): one client
/// created and destroyed while counting must show up.
func calibrateLibraryCounter() -> Int {
    _ = mosquitto_lib_init()  // counted per call by libmosquitto; the client's own init is the same
    MallocInterposerSwift.initialize()
    MallocInterposerSwift.hook()
    let client = mosquitto_new("bench-calibration", true, nil)
    MallocInterposerSwift.unhook()
    let n = MallocInterposerSwift.getStatistics().mallocCount
    if let client { mosquitto_destroy(client) }
    return n
}

/// `fragmented`: the extended devices' advertisements come in fragments (`pacedCapture`).
/// `keyed`: the gateway also holds a beacon key and 8 IRKs (docs/security.md §4.4, §10), so
/// every beacon goes through the verifier and every other report through address resolution,
/// and re-advertises (docs/relay.md §9): 2 slots, one of them on the air for another room's
/// activity, with their listeners polled every turn.
func measureAllocations(broker: MosquittoBroker, devices: Int, warmup: Int, measured: Int, seed: UInt64,
                        statusInterval: Duration, keepalive: Int, keyed: Bool = false,
                        fragmented: Bool = false, esphome: Bool = false) throws -> AllocationFigures {
    let calibration = calibrateCounter()
    guard calibration >= 1000 else {
        throw BenchError("the malloc counter saw \(calibration) allocations for 1000 objects: is the interposer linked?")
    }
    let libraryCalibration = calibrateLibraryCounter()
    guard libraryCalibration >= 1 else {
        throw BenchError("the malloc counter saw no allocation inside libmosquitto's mosquitto_new")
    }
    let capture = try pacedCapture(devices: devices, warmup: warmup, measured: measured, seed: seed, fragmented: fragmented)
    let batonDevices = (devices + 2) / 3

    let subscriber = try Subscriber(port: broker.port, clientID: "bench-alloc-subscriber")
    try subscriber.connect(subscribing: ["baton/activities/+", "baton/apple/+"])
    var activities = Set<String>()
    var published = 0
    let count: (MQTTMessage) -> Void = { m in
        guard !m.payload.isEmpty, let g = json(m.payload)?["gateway"] as? String, g == "bench-alloc" else { return }
        published += 1
        if m.topic.hasPrefix("baton/activities/") { activities.insert(m.topic) }
    }

    var config = GatewayConfig.defaults(hostName: "bench")
    try config.apply(GatewayOverrides(broker: "mqtt://127.0.0.1:\(broker.port)", radio: "capture:generated.btsnoop",
                                      room: "Bench", id: "bench-alloc"))
    // The defaults are 30 s each: no stats publish and no PINGREQ falls in a 2 s window.
    // Shorter ones put those timers' own allocations in it (docs/performance.md).
    config.statusInterval = statusInterval
    config.broker.keepalive = keepalive
    // The room rule's timers are treated like the stats timer: a sighting is a publish
    // (libmosquitto allocates its packet), due on its heartbeat or after a 3 dB move, and
    // neither is an unchanged advertisement; so the heartbeat goes out of the window and a
    // lone gateway owns its devices at once (docs/performance.md, docs/rooms.md §2).
    config.rooms.sightingInterval = statusInterval
    config.rooms.sightingFresh = statusInterval * 2
    config.rooms.sightingStep = 60
    config.rooms.settle = .zero
    if keyed {
        config.security.beaconKey = BeaconKey(bytes: Array(0x40..<0x50))
        config.appleIRKs = (0..<8).map { NamedIRK(name: "device \($0)", irk: IdentityResolvingKey(bytes: Array(repeating: UInt8($0 + 1), count: 16))) }
    }
    var controller: IdleController?
    if keyed {
        config.readvertise = 2
        controller = IdleController()
        let key = config.security.beaconKey!  // Proof: set just above for `keyed`.
        let group = String(try key.groupHash(), radix: 16)
        let padded = String(repeating: "0", count: 8 - group.count) + group
        try broker.publish(topic: "baton/gateways/hall/status", payload: Array("online".utf8), retain: true)
        try broker.publish(topic: "baton/activities/\(padded)0004", payload: Array("""
            {"state":"current","seq":258,"type_hash":"be9b4bb7","group":"\(padded)","supports_streams":true,\
            "has_web_url":false,"relayed":false,"psm":128,"verified":true,"gateway":"hall"}
            """.utf8), retain: true)
    }
    var proxy: ProxyServer?
    var homeAssistant: ESPHomeSubscriber?
    if esphome {
        // Home Assistant's Bluetooth proxy on (docs/esphome.md), plaintext to keep the bench's
        // client a socket: every report goes to `heard`, every turn flushes a batch.
        var settings = ProxySettings(encryption: .none)
        settings.address = "127.0.0.1"
        settings.port = 0
        settings.mdnsServiceFile = ""
        config.esphome = settings
        // Its connections part too (docs/esphome.md §11), as a gateway with a device link has
        // it: 3 idle slots in every turn. A capture has no link, so one is named (nothing
        // connects to it); title fetches stay off, as without a link before.
        config.relayLink = .simulator(path: "/nonexistent/bench-alloc.link")
        config.fetchTitles = false
        guard case .started(let server) = GatewayLauncher.startProxy(config: config, log: Logger()) else {
            throw BenchError("the ESPHome API server did not start")
        }
        homeAssistant = try ESPHomeSubscriber(port: server.port)
        proxy = consume server
    }
    let keys = try GatewayKeys.make(config)
    var mqtt = try MQTTClient(config: GatewayLauncher.mqttConfig(config))
    var radio = try RadioCapture(file: capture.file, pace: .timestamps(speed: 1))
    // What `Gateway.run()` does before its first turn: the broker connect and the radio start.
    let start = Instant.now
    mqtt.start(now: start)
    try radio.start(now: start)
    var tv = timespec()
    clock_gettime(CLOCK_REALTIME, &tv)
    let log = Logger()
    var gateway = Gateway(config: config, radio: radio, mqtt: mqtt, keys: keys, readvertising: controller, proxy: proxy,
                          log: log, environment: [:], now: start,
                          unixMicroseconds: Int64(tv.tv_sec) * 1_000_000 + Int64(tv.tv_nsec) / 1000)

    // Warm-up and settling: every device heard, every unchanged path run, the broker quiet.
    let beforeMeasured = capture.firsts + capture.warmup
    while Instant.now < start + .milliseconds(900) || gateway.tally.reports < beforeMeasured {
        _ = gateway.turn()
        subscriber.pump(timeoutMs: 0, count)
        homeAssistant?.drain()
        guard Instant.now < start + .seconds(30) else {
            throw BenchError("the gateway heard \(gateway.tally.reports) of the \(beforeMeasured) warm-up reports in 30 s")
        }
    }
    subscriber.pump(for: .milliseconds(50), count)
    guard activities.count == batonDevices else {
        throw BenchError("the subscriber saw \(activities.count) of \(batonDevices) activities from the in-process gateway: did it connect?")
    }
    let publishedBefore = published
    if let controller, controller.advertised == 0 {
        throw BenchError("the re-advertising gateway put nothing on the air: the pass would not measure it")
    }

    // The counted window.
    let t0 = gateway.tally
    let turns0 = gateway.counters.loopTurns
    let total = beforeMeasured + capture.measured
    if let homeAssistant, homeAssistant.received == 0 {
        throw BenchError("Home Assistant's client received nothing from the ESPHome server during the warm-up: did it subscribe?")
    }
    let esphomeBefore = homeAssistant?.received ?? 0
    let windowStart = Instant.now
    MallocInterposerSwift.initialize()
    MallocInterposerSwift.hook()
    while gateway.tally.reports < total, Instant.now < windowStart + .seconds(30) {
        _ = gateway.turn()
        homeAssistant?.drain()
    }
    MallocInterposerSwift.unhook()
    let windowEnd = Instant.now
    let stats = MallocInterposerSwift.getStatistics()
    if keyed {
        // The other room's gateway and activity were the pass's: the broker is shared with the
        // other parts, which must not see a phantom gateway.
        try broker.publish(topic: "baton/gateways/hall/status", payload: [], retain: true)
        let key = config.security.beaconKey!  // Proof: set above for `keyed`.
        let group = String(try key.groupHash(), radix: 16)
        try broker.publish(topic: "baton/activities/\(String(repeating: "0", count: 8 - group.count) + group)0004",
                           payload: [], retain: true)
    }
    let t1 = gateway.tally
    guard t1.reports == total else {
        throw BenchError("the gateway heard \(t1.reports - beforeMeasured) of \(capture.measured) measured reports in 30 s")
    }

    // Nothing may have been published while counting: every counted report was unchanged.
    subscriber.pump(for: .milliseconds(300), count)
    return AllocationFigures(
        devices: devices, batonDevices: batonDevices, mallocs: stats.mallocCount, frees: stats.freeCount,
        reports: t1.reports - t0.reports, beacons: t1.beacons - t0.beacons,
        continuity: t1.continuityReports - t0.continuityReports, other: t1.other - t0.other,
        turns: gateway.counters.loopTurns - turns0, windowMilliseconds: microseconds(windowEnd - windowStart) / 1000,
        calibrationMallocs: calibration, libraryCalibrationMallocs: libraryCalibration, publishedDuringWindow: published - publishedBefore,
        statusIntervalSeconds: statusInterval.components.seconds, keepaliveSeconds: keepalive,
        fragments: t1.fragments - t0.fragments, assembled: t1.assembled - t0.assembled, drops: t1.drops.total - t0.drops.total,
        esphomeBytes: (homeAssistant?.received ?? 0) - esphomeBefore)
}

/// Home Assistant's side of the ESPHome API as the bench needs it: a plaintext client that
/// subscribes to raw advertisements (docs/esphome.md §2.1, §3.3: message 66, flags 1) and reads
/// and discards what comes, into a buffer made once, so its reads count no allocation.
final class ESPHomeSubscriber {
    let fd: Int32
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 16, alignment: 8)
    var received = 0

    init(port: UInt16) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let r = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard r == 0 else { throw BenchError("connecting to the ESPHome server: errno \(Glibc.errno)") }
        // Plaintext frame: 0x00, length 2, type 66, body `08 01` (flags: raw advertisements).
        let subscribe: [UInt8] = [0x00, 0x02, 0x42, 0x08, 0x01]
        guard subscribe.withUnsafeBytes({ Glibc.send(fd, $0.baseAddress, $0.count, 0) }) == subscribe.count else {
            throw BenchError("subscribing to the ESPHome server's advertisements failed")
        }
        _ = Glibc.fcntl(fd, F_SETFL, Glibc.fcntl(fd, F_GETFL) | O_NONBLOCK)
    }

    deinit {
        close(fd)
        buffer.deallocate()
    }

    func drain() {
        while true {
            let n = recv(fd, buffer.baseAddress, buffer.count, 0)
            if n <= 0 { return }
            received += n
        }
    }
}

/// A controller for re-advertising that is never disturbed: listeners nobody connects to, no
/// events. What the gateway puts on the air is counted, not sent anywhere.
final class IdleController: AdvertisingController {
    let adapter = "bench"
    let psms: [UInt16] = [0x0091, 0x0092]
    let pipes: [[Int32]]
    var advertised = 0
    init() {
        pipes = (0..<2).map { _ in
            var ends: [Int32] = [-1, -1]
            precondition(pipe(&ends) == 0)
            return ends
        }
        listenerFDs = pipes.map { $0[0] }
    }
    deinit { for p in pipes { close(p[0]); close(p[1]) } }
    let listenerFDs: [Int32]
    var eventFD: Int32 { -1 }
    var acceptsL2CAP: Bool { false }
    func advertise(_ k: Int, _ data: [UInt8]) throws(ManagementError) { advertised += 1 }
    func withdraw(_ k: Int) throws(ManagementError) {}
    func withdrawAll() {}
    func removedSlots(_ body: (Int) -> Void) {}
    var removalsPending: Bool { false }
    func accept(_ k: Int) throws(LinkError) -> (fd: Int32, peer: LinkAddress)? { nil }
}
