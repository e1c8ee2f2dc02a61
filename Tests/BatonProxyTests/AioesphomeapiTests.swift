// Home Assistant's client library against the proxy (issue 22, "What it must show"):
// aioesphomeapi 46.23.0 (scripts/esphome-venv) connects to a ProxyServer on 127.0.0.1, driven by
// the gateway's PollLoop exactly as the gateway drives it (docs/esphome.md §8: add it to the
// loop, `handle` when it has work, `heard` per advertising report, `flush` every turn), and
// reads what a simulated controller's advertisements become: the same address, RSSI, type and
// bytes. Skipped when the venv is missing (scripts/esphome-venv makes it).
import BatonHCI
import BatonLibc
import BatonSim
import BatonTestSupport
import CLibc
import Foundation
import Testing
@testable import BatonProxy

let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardized.path
let esphomePython = ProcessInfo.processInfo.environment["BATON_ESPHOME_PYTHON"] ?? repoRoot + "/.build/esphome-venv/bin/python"
let haveAioesphomeapi = FileManager.default.isExecutableFile(atPath: esphomePython)

/// What the simulated controller "heard": a BTHome v2 sensor, a random-address beacon, and a
/// scan response of 62 bytes (31 + 31, the most an ESPHome message holds).
let simulatedAdvertisements: [(address: UInt64, type: UInt8, rssi: Int8, data: [UInt8])] = [
    (bthomeAddress, 0, -67, bthomeData),
    (0xC0FF_EE00_0001, 1, -40, hx("0201060302aafe")),
    (0x0012_3456_789A, 0, -101, [UInt8](repeating: 0x5A, count: 62)),
]

let keyBase64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

struct ClientRun {
    var lines: [[String: Any]] = []
    var server: ProxyCounters
    var log: [String]
    func first(_ key: String) -> Any? { lines.first { $0[key] != nil }?[key] }
}

/// What a server logged: its Logger writes to a file of the test's, read back as lines
/// (the `<N>` priority included).
final class LogLines: @unchecked Sendable {
    let path = NSTemporaryDirectory() + "baton-proxy-log-\(getpid())-\(UUID().uuidString.prefix(8))"
    let fd: Int32
    init() { fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o644) }
    deinit {
        close(fd)
        unlink(path)
    }
    var logger: Logger { Logger(level: .debug, descriptor: fd) }
    var lines: [String] { ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init) }
}

/// Feeds the three `simulatedAdvertisements` straight into `heard`, once.
func feedOnce() -> (inout ProxyServer) -> Void {
    var fed = false
    return { server in
        guard !fed else { return }
        for a in simulatedAdvertisements {
            a.data.withUnsafeBytes { server.heard(address: a.address, addressType: a.type, rssi: a.rssi, data: $0) }
        }
        fed = true
    }
}

/// Runs the client against a server with `encryption` until it exits (at most 600 turns of
/// at most 50 ms), feeding advertisements once it has subscribed.
func runClient(server encryption: ProxyEncryption, clientKey: String?, expect count: Int = simulatedAdvertisements.count,
               feed: (inout ProxyServer) -> Void = feedOnce()) throws -> ClientRun {
    var settings = ProxySettings(encryption: encryption)
    settings.address = "127.0.0.1"
    settings.port = 0
    // The passive proxy: no connections part here, so none offered (97).
    settings.connections = 0
    let lines = LogLines()
    let mac: UInt64 = 0x02BA_7000_0001
    let info = DeviceInfo(name: "hall", macAddress: ProxySettings.macText(mac), esphomeVersion: "2025.5.0", model: "Baton gateway",
                          manufacturer: "Baton", friendlyName: "Hall", bluetoothMacAddress: "00:1A:7D:DA:71:13",
                          encryptionSupported: encryption != .none)
    var server = try ProxyServer(settings: settings, info: info, compactMAC: ProxySettings.compactMAC(mac), log: lines.logger)
    let dir = NSTemporaryDirectory() + "baton-esphome-\(getpid())-\(server.port)"
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: dir) }
    let child = try ChildProcess(esphomePython, [repoRoot + "/Tests/BatonProxyTests/Interop/esphome_client.py", "\(server.port)",
                                                 clientKey ?? "-", "\(count)"],
                                 stdout: dir + "/out", stderr: dir + "/err")
    // As the gateway turns: this turn's advertisements (to a subscribed client), then the server.
    var loop = TestLoop(parts: 1, descriptors: server.descriptorLimit, longestWait: .milliseconds(50))
    try loop.run(limit: .seconds(30), until: { !child.isRunning }) { driver in
        if server.subscriberCount > 0 { feed(&server) }
        let slot = driver.add(&server)
        driver.wait()
        server.serve(driver.ready(slot), now: driver.now)
    }
    _ = child.wait(timeout: .seconds(5))
    let out = (try? String(contentsOfFile: dir + "/out", encoding: .utf8)) ?? ""
    let err = (try? String(contentsOfFile: dir + "/err", encoding: .utf8)) ?? ""
    var run = ClientRun(server: server.counters, log: lines.lines)
    for line in out.split(separator: "\n") {
        if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { run.lines.append(o) }
    }
    if run.lines.isEmpty { Issue.record("the client printed nothing; stderr: \(err)") }
    return run
}

@Suite(.serialized, .enabled(if: haveAioesphomeapi, "scripts/esphome-venv makes the venv"))
struct AioesphomeapiTests {
    func checkSession(_ run: ClientRun, encrypted: Bool) {
        #expect(run.first("error") == nil, "\(run.lines)")
        let info = run.first("device_info") as? [String: Any] ?? [:]
        #expect(info["name"] as? String == "hall")
        #expect(info["mac_address"] as? String == "02:BA:70:00:00:01")
        #expect(info["friendly_name"] as? String == "Hall")
        #expect(info["manufacturer"] as? String == "Baton")
        #expect(info["model"] as? String == "Baton gateway")
        #expect(info["bluetooth_mac_address"] as? String == "00:1A:7D:DA:71:13")
        #expect(info["bluetooth_proxy_feature_flags"] as? Int == 97)
        #expect(info["api_encryption_supported"] as? Bool == encrypted)
        let ads = run.first("advertisements") as? [[String: Any]] ?? []
        #expect(ads.count == simulatedAdvertisements.count)
        for (got, sent) in zip(ads, simulatedAdvertisements) {
            #expect(got["address"] as? UInt64 == sent.address)
            #expect(got["rssi"] as? Int == Int(sent.rssi))
            #expect(got["address_type"] as? Int == Int(sent.type))
            #expect(got["data"] as? String == hexString(sent.data))
        }
        // RUNNING (2), PASSIVE (0): sent with the subscription.
        #expect((run.first("scanner") as? [[Int]])?.first == [2, 0, 0])
        #expect(run.first("disconnected") as? Bool == true)
        #expect(run.server.advertisementsSent == 3 && run.server.batchesSent == 1)
        #expect(run.server.badFrames == 0 && run.server.wrongKey == 0)
    }

    @Test func encryptedWithTheRightKey() throws {
        let run = try runClient(server: .noise(key: Array(0...31)), clientKey: keyBase64)
        checkSession(run, encrypted: true)
    }

    /// The gateway's path: a simulated controller speaks H4 to a RadioH4, the decoder walks its
    /// LE Advertising Reports, and each report goes to `heard` as `Gateway.route` will pass it
    /// (docs/esphome.md §8). Home Assistant's client receives exactly what the controller
    /// delivered: address, type, RSSI and bytes.
    @Test func whatASimulatedControllerDeliversIsWhatHomeAssistantReceives() throws {
        var h4: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &h4) == 0)
        let controller = VirtualController(fd: h4[1])
        var radio = try RadioH4(fd: h4[0])
        try radio.start(now: .now)
        var decoder = AdvertisementDecoder()
        var traffic = CaptureGenerator(devices: 6, seed: 22)
        var delivered: [GeneratedReport] = []
        let want = 12
        let run = try runClient(server: .noise(key: Array(0...31)), clientKey: keyBase64, expect: want) { server in
            controller.poll()
            if controller.scanning, delivered.count < want {
                var r = traffic.next()
                while r.extended || r.data.count > 31 { r = traffic.next() }
                controller.deliver(r)
                delivered.append(r)
            }
            controller.flush()
            _ = try? radio.poll(now: .now) { event in
                decoder.decode(event: event, timestamp: 0) { heard in
                    let r = heard.report
                    server.heard(address: r.address, addressType: r.addressType, rssi: r.rssi, data: r.data)
                }
            }
        }
        // Scanning starts only after the radio's init, which the same turns drive.
        let ads = run.first("advertisements") as? [[String: Any]] ?? []
        #expect(ads.count == want, "\(run.lines)")
        for (got, sent) in zip(ads, delivered) {
            #expect(got["address"] as? UInt64 == sent.address)
            #expect(got["address_type"] as? Int == Int(sent.addressType))
            #expect(got["rssi"] as? Int == Int(sent.rssi))
            #expect(got["data"] as? String == hexString(sent.data))
        }
    }

    @Test func plaintextWhenTheConfigSaysSo() throws {
        let run = try runClient(server: .none, clientKey: nil)
        checkSession(run, encrypted: false)
    }

    @Test func aWrongKeyIsRefusedAsInvalidEncryptionKey() throws {
        var other = Array<UInt8>(0...31)
        other[31] = 0
        let run = try runClient(server: .noise(key: other), clientKey: keyBase64)
        #expect(run.first("error") as? String == "InvalidEncryptionKeyAPIError", "\(run.lines)")
        #expect(run.server.wrongKey == 1)
        #expect(run.log.contains { $0.contains("wrong encryption key") })
    }

    @Test func aPlaintextClientOfAnEncryptedServerIsToldItNeedsTheKey() throws {
        let run = try runClient(server: .noise(key: Array(0...31)), clientKey: nil)
        #expect(run.first("error") as? String == "RequiresEncryptionAPIError", "\(run.lines)")
        #expect(run.server.badFrames == 1)
    }

    @Test func aClientWithAKeyOfAPlaintextServerIsToldItIsPlaintext() throws {
        let run = try runClient(server: .none, clientKey: keyBase64)
        #expect(run.first("error") as? String == "EncryptionPlaintextAPIError", "\(run.lines)")
        #expect(run.server.badFrames == 1)
    }
}
