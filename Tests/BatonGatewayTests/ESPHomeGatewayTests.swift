// Issue 22, "What it must show": Home Assistant's client library (aioesphomeapi, pinned in
// scripts/esphome-venv) against the gateway itself on loopback: the whole `Gateway` with its
// broker, its radio (the simulator's controller over H4) and the ESPHome server started as
// `GatewayLauncher` starts it from the `esphome:` section, turned by `Gateway.turn()`. What the
// controller delivered is what Home Assistant receives: address, type, RSSI and bytes, over
// Noise with the right key; a wrong key is refused; the stats topic counts both.
@testable import BatonGateway
import BatonHCI
import BatonLibc
import BatonMQTT
import BatonProxy
import BatonSim
import BatonTestSupport
import Foundation
import Glibc
import Testing

private let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardized.path
private let python = ProcessInfo.processInfo.environment["BATON_ESPHOME_PYTHON"] ?? repoRoot + "/.build/esphome-venv/bin/python"
private let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

@Suite(.serialized, .enabled(if: FileManager.default.isExecutableFile(atPath: python), "scripts/esphome-venv makes the venv"))
struct ESPHomeGatewayTests {
    struct Session {
        var lines: [[String: Any]] = []
        var delivered: [GeneratedReport] = []
        var stats: [String: Any]?
        /// LE_Scan_Type of the controller's last scan parameters, each time it changed.
        var controllerActive: [Bool] = []
        /// Scan parameters commands the gateway sent: passive ones, active ones.
        var controllerParameters = (passive: 0, active: 0)
        func first(_ key: String) -> Any? { lines.first { $0[key] != nil }?[key] }
    }

    /// The device of the active-scan session: a thermometer whose name is only in its scan
    /// response, as many sensors send it (Core Supplement, Part A, §1.2 Local Name).
    static let sensor: UInt64 = 0xA4C1_3800_5C01
    /// Flags (LE General Discoverable, BR/EDR not supported), then 16-bit service data 0xFCD2.
    static let sensorAdvertisement: [UInt8] = [0x02, 0x01, 0x06, 0x06, 0x16, 0xD2, 0xFC, 0x40, 0x02, 0xC4]
    static func isBaton(_ r: GeneratedReport) -> Bool {
        if case .baton = r.kind { return true }
        return false
    }

    /// Complete Local Name "hall-thermo".
    static let sensorScanResponse: [UInt8] = [0x0C, 0x09] + Array("hall-thermo".utf8)

    /// Runs a gateway with `esphome: encryption-key` and the client with `clientKey` until the
    /// client exits (bounded: 30 s); the room's controller delivers one advertisement a turn
    /// once Home Assistant has subscribed, `want` in all.
    func session(clientKey: String, want: Int, scanMode: ProxyScanMode? = nil) throws -> Session {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("esphome-gateway")
        var config = try hallConfig(broker)
        var settings = ProxySettings(encryption: .noise(key: try #require(ProxySettings.key(base64: key))))
        settings.address = "127.0.0.1"
        settings.port = 0  // a free port; the config file says 1 to 65535
        settings.mdnsServiceFile = ""
        if let scanMode { settings.scanMode = scanMode }
        config.esphome = settings

        var run = try StartedGateway(config)
        let room = run.room, port = run.port
        let active = scanMode != nil
        let client = try ChildProcess(python, [repoRoot + "/Tests/BatonProxyTests/Interop/esphome_client.py", "\(port)",
                                               clientKey, "\(want)"] + (active ? ["active"] : []),
                                      stdout: dir.path + "/out", stderr: dir.path + "/err")
        var s = Session()
        var traffic = CaptureGenerator(devices: 6, seed: 31)
        if active { room.scanResponses[Self.sensor] = Self.sensorScanResponse }
        var nextSensor = Instant.now
        let end = Instant.now + .seconds(30)
        while client.isRunning, Instant.now < end {
            room.poll()
            if s.controllerActive.last != room.activeScanning { s.controllerActive.append(room.activeScanning) }
            // Advertisements before Home Assistant subscribed are not its (ESPHome sends none
            // either): the room starts talking once the gateway has a subscriber.
            let subscribed = (run.gateway.proxy?.subscriberCount ?? 0) > 0
            if active, room.scanning, subscribed, Instant.now >= nextSensor {
                // The sensor advertises every 20 ms while the client runs through its modes.
                nextSensor = Instant.now + .milliseconds(20)
                room.deliver(GeneratedReport(timestamp: 0, device: 0, kind: .ordinary(name: "hall-thermo"),
                                             address: Self.sensor, addressType: 0, rssi: -61, extended: false,
                                             data: Self.sensorAdvertisement))
            } else if !active, room.scanning, s.delivered.filter({ !Self.isBaton($0) }).count < want, subscribed {
                var r = traffic.next()
                while r.extended || r.data.count > 31 { r = traffic.next() }
                room.deliver(r)
                s.delivered.append(r)
            }
            room.flush()
            _ = run.gateway.turn()
        }
        _ = client.wait(timeout: .seconds(5))
        // Sized from the configuration before the server existed: its listener and every
        // client slot, and no turn with the client connected outgrew it.
        #expect(run.gateway.partsDescriptorLimit == run.gateway.loop.descriptorLimit)
        #expect(run.gateway.loop.oversizedTurns == 0)
        s.controllerParameters = (room.passiveParametersSent, room.activeParametersSent)
        // The stats topic now (as after `status.interval`), and turns until it has left.
        run.gateway.publishStats(now: .now)
        let settle = Instant.now + .milliseconds(500)
        while Instant.now < settle { _ = run.gateway.turn() }
        let out = (try? String(contentsOfFile: dir.path + "/out", encoding: .utf8)) ?? ""
        for line in out.split(separator: "\n") {
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { s.lines.append(o) }
        }
        if s.lines.isEmpty {
            Issue.record("the client printed nothing; stderr: \((try? String(contentsOfFile: dir.path + "/err", encoding: .utf8)) ?? "")")
        }
        let stats = try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? []
        s.stats = try? JSONSerialization.jsonObject(with: Data(stats)) as? [String: Any]
        return s
    }

    @Test func homeAssistantReceivesWhatTheRoomsControllerDelivered() throws {
        let s = try session(clientKey: key, want: 10)
        #expect(s.first("error") == nil, "\(s.lines)")
        let info = s.first("device_info") as? [String: Any] ?? [:]
        #expect(info["name"] as? String == "hall")
        #expect(info["friendly_name"] as? String == "Hall")
        // Passive scan 1, raw advertisements 32, state and mode 64 (docs/esphome.md §3).
        #expect(info["bluetooth_proxy_feature_flags"] as? Int == 97, "relay.link none: no connections, so not connectable")
        #expect(info["api_encryption_supported"] as? Bool == true)
        // Home Assistant's device page: "Baton gateway by Baton", firmware "0.4.0 (ESPHome
        // 2025.5.0)", and no "outdated ESPHome firmware" repair for a named project (§3.2).
        #expect(info["project_name"] as? String == "Baton.Baton gateway")
        #expect(info["project_version"] as? String == BatonVersion.current)
        #expect(info["mac_address"] as? String == ProxySettings.macText(ProxySettings.derivedMAC(gatewayID: "hall")))
        // Everything but Baton's own beacons (§3.7), which the stats count.
        let ads = s.first("advertisements") as? [[String: Any]] ?? []
        let forwarded = s.delivered.filter { !Self.isBaton($0) }
        let withheld = s.delivered.count - forwarded.count
        #expect(withheld > 0, "the room's traffic has Baton beacons")
        #expect(ads.count == forwarded.count && ads.count == 10, "\(s.lines)")
        for (got, sent) in zip(ads, forwarded) {
            #expect(got["address"] as? UInt64 == sent.address)
            #expect(got["address_type"] as? Int == Int(sent.addressType))
            #expect(got["rssi"] as? Int == Int(sent.rssi))
            #expect(got["data"] as? String == hexString(sent.data))
        }
        // The scanner's state follows the radio: running (2), passive (0), once it scans.
        #expect((s.first("scanner") as? [[Int]])?.last == [2, 0, 0], "\(s.lines)")
        #expect(s.first("disconnected") as? Bool == true)
        let esphome = s.stats?["esphome"] as? [String: Any]
        #expect(esphome?["advertisements"] as? Int == 10, "\(String(describing: s.stats))")
        #expect(esphome?["baton_beacons_withheld"] as? Int == withheld, "\(String(describing: s.stats))")
        #expect(esphome?["wrong_key"] as? Int == 0)
    }

    /// Issue 32 item 2: Home Assistant's active window. Passive scanning hears the sensor's
    /// advertisement only; asked for active, the controller is set to active scanning, the
    /// scanner state says so, and the sensor's scan response arrives with its advertisement in
    /// one raw advertisement (the advertisement's bytes, then the scan response's, as an ESP32
    /// sends them); asked for passive again, the controller and the state go back.
    @Test func anActiveScanRequestBringsTheScanResponsesPassiveScanningMisses() throws {
        let s = try session(clientKey: key, want: 5, scanMode: .onRequest)
        #expect(s.first("error") == nil, "\(s.lines)")
        let advertisement = hexString(Self.sensorAdvertisement)
        let merged = hexString(Self.sensorAdvertisement + Self.sensorScanResponse)
        func datas(_ key: String) -> [String] {
            (s.first(key) as? [[String: Any]] ?? []).filter { $0["address"] as? UInt64 == Self.sensor }
                .compactMap { $0["data"] as? String }
        }
        let passive = datas("advertisements"), active = datas("active"), again = datas("passive_again")
        #expect(passive.count >= 5 && passive.allSatisfy { $0 == advertisement }, "\(passive)")
        #expect(active.contains(merged), "no scan response while active: \(active)")
        #expect(active.allSatisfy { $0 == advertisement || $0 == merged }, "\(active)")
        #expect(again.count >= 5 && again.allSatisfy { $0 == advertisement }, "\(again)")
        // The controller: passive, active, passive; the state: running passive, running active,
        // running passive, configured passive throughout (esphome.scan-mode: auto).
        #expect(s.controllerActive == [false, true, false], "\(s.controllerActive)")
        let states = s.lines.last { $0["scanner"] != nil }?["scanner"] as? [[Int]] ?? []
        let running = states.filter { $0[0] == 2 }.map { $0[1] }
        #expect(running.first == 0 && running.contains(1) && running.last == 0, "\(states)")
        #expect(states.allSatisfy { $0[2] == 0 }, "\(states)")
    }

    /// `esphome.scan-mode: passive` keeps the radio passive whatever Home Assistant asks.
    @Test func aPinnedPassiveModeIgnoresTheRequest() throws {
        let s = try session(clientKey: key, want: 5, scanMode: .passive)
        #expect(s.controllerActive == [false], "\(s.controllerActive)")
        // The client waited for an active state that never came.
        #expect(s.lines.contains { $0.keys.contains("active") && $0["active"] is NSNull }, "\(s.lines)")
    }

    /// `esphome.scan-mode: active` scans actively from the init on: the controller's first scan
    /// parameters are active ones (no passive init changed on the first turn), and Home
    /// Assistant asking for passive changes nothing.
    @Test func aPinnedActiveModeScansActivelyFromTheFirstScan() throws {
        let s = try session(clientKey: key, want: 5, scanMode: .active)
        #expect(s.controllerParameters == (passive: 0, active: 1), "\(s.controllerParameters)")
        // The scanner state: running (2) active (1), configured active (1), whatever was asked.
        let states = s.lines.last { $0["scanner"] != nil }?["scanner"] as? [[Int]] ?? []
        #expect(!states.isEmpty && states.allSatisfy { $0[0] != 2 || ($0[1] == 1 && $0[2] == 1) }, "\(states)")
    }

    @Test func aWrongKeyIsRefusedAndCounted() throws {
        let s = try session(clientKey: "AQECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", want: 1)
        #expect(s.first("error") as? String == "InvalidEncryptionKeyAPIError", "\(s.lines)")
        #expect((s.stats?["esphome"] as? [String: Any])?["wrong_key"] as? Int == 1, "\(String(describing: s.stats))")
    }
}

extension ESPHomeGatewayTests {
    /// Issue 32 item 1 through the whole gateway: Home Assistant connects to a thermometer through
    /// the gateway's ESPHome server, `Gateway.turn()` hands what it asks to the connections and
    /// what the device says back, over the simulator's link socket (an attribute channel is its
    /// connect message with PSM 0, docs/protocol.md §5.5). The stats topic counts it.
    @Test func homeAssistantConnectsToADeviceThroughTheGateway() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("esphome-gatt")
        let thermometer: UInt64 = 0xC0FF_EE00_0001
        let devices = try GATTLinkSocket(path: dir.path + "/hall.link")
        var config = try hallConfig(broker, relayLink: .simulator(path: devices.path))
        var settings = ProxySettings(encryption: .noise(key: try #require(ProxySettings.key(base64: key))))
        settings.address = "127.0.0.1"
        settings.port = 0
        settings.mdnsServiceFile = ""
        config.esphome = settings  // connections: 3, the default

        var run = try StartedGateway(config)
        let room = run.room, port = run.port
        let client = try ChildProcess(python, [repoRoot + "/Tests/BatonProxyTests/Interop/gatt_client.py", "\(port)",
                                               "\(thermometer)", key],
                                      stdout: dir.path + "/out", stderr: dir.path + "/err")
        var notified = false
        let end = Instant.now + .seconds(45)
        while client.isRunning, Instant.now < end {
            room.poll()
            room.flush()
            devices.serve()
            if !notified, let d = devices.devices[thermometer], d.value(10) == [0x01, 0x00] {
                notified = true
                d.notify(9, [0x36, 0x08])
            }
            _ = run.gateway.turn()
        }
        _ = client.wait(timeout: .seconds(5))
        #expect(run.gateway.partsDescriptorLimit == run.gateway.loop.descriptorLimit)
        #expect(run.gateway.loop.oversizedTurns == 0)
        run.gateway.publishStats(now: .now)
        let settle = Instant.now + .milliseconds(500)
        while Instant.now < settle { _ = run.gateway.turn() }

        var lines: [[String: Any]] = []
        let out = (try? String(contentsOfFile: dir.path + "/out", encoding: .utf8)) ?? ""
        for line in out.split(separator: "\n") {
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { lines.append(o) }
        }
        func first(_ k: String) -> Any? { lines.first { $0[k] != nil }?[k] }
        let err = (try? String(contentsOfFile: dir.path + "/err", encoding: .utf8)) ?? ""
        #expect(first("error") == nil, "\(lines) \(err)")
        #expect(first("feature_flags") as? Int == 103)
        #expect(devices.psms == [0], "one attribute channel: the connect message's PSM 0")
        #expect(first("connected") as? [[Int]] == [[1, 247, 0]])
        #expect((first("services") as? [[String: Any]])?.map { $0["uuid"] as? String }
                == ["0000180f-0000-1000-8000-00805f9b34fb", "1f1e1d1c-1b1a-1918-1716-151413121110"])
        #expect(first("battery") as? String == "57")
        #expect(first("written") as? String == "04")
        #expect(first("notification") as? String == "3608")
        #expect(first("states") as? [[Int]] == [[1, 247, 0], [0, 0, 22]])
        #expect(first("disconnected") as? Bool == true)

        let stats = try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? []
        let s = try #require(try? JSONSerialization.jsonObject(with: Data(stats)) as? [String: Any])
        let c = try #require(s["esphome_connections"] as? [String: Any], "\(s.keys)")
        #expect(c["slots"] as? Int == 3 && c["connected_now"] as? Int == 0)
        #expect(c["connects"] as? Int == 1 && c["connected"] as? Int == 1 && c["failed"] as? Int == 0)
    }
}
