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
        func first(_ key: String) -> Any? { lines.first { $0[key] != nil }?[key] }
    }

    /// Runs a gateway with `esphome: encryption-key` and the client with `clientKey` until the
    /// client exits (bounded: 30 s); the room's controller delivers one advertisement a turn
    /// once Home Assistant has subscribed, `want` in all.
    func session(clientKey: String, want: Int) throws -> Session {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("esphome-gateway")
        var config = GatewayConfig.defaults(hostName: "hall")
        try config.apply(GatewayOverrides(broker: "mqtt://127.0.0.1:\(broker.port)", radio: "sim:/run/baton/hall.sock",
                                          room: "Hall", id: "hall"))
        config.relayLink = .none
        var settings = ProxySettings(encryption: .noise(key: try #require(ProxySettings.key(base64: key))))
        settings.address = "127.0.0.1"
        settings.port = 0  // a free port; the config file says 1 to 65535
        settings.mdnsServiceFile = ""
        config.esphome = settings

        var h4: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &h4) == 0)
        let room = VirtualController(fd: h4[1])
        var radio = try RadioH4(fd: h4[0])
        var mqtt = try MQTTClient(config: GatewayLauncher.mqttConfig(config))
        let start = Instant.now
        mqtt.start(now: start)
        try radio.start(now: start)
        guard case .started(let proxy) = GatewayLauncher.startProxy(config: config, log: Logger()) else {
            Issue.record("the ESPHome server did not start")
            return Session()
        }
        let port = proxy.port
        var gateway = Gateway(config: config, radio: radio, mqtt: mqtt, proxy: proxy, log: Logger(), environment: [:],
                              now: start, unixMicroseconds: 1_790_000_000_000_000)
        let client = try ChildProcess(python, [repoRoot + "/Tests/BatonProxyTests/Interop/esphome_client.py", "\(port)",
                                               clientKey, "\(want)"],
                                      stdout: dir.path + "/out", stderr: dir.path + "/err")
        var s = Session()
        var traffic = CaptureGenerator(devices: 6, seed: 31)
        let end = Instant.now + .seconds(30)
        while client.isRunning, Instant.now < end {
            room.poll()
            // Advertisements before Home Assistant subscribed are not its (ESPHome sends none
            // either): the room starts talking once the gateway has a subscriber.
            if room.scanning, s.delivered.count < want, (gateway.proxy?.subscriberCount ?? 0) > 0 {
                var r = traffic.next()
                while r.extended || r.data.count > 31 { r = traffic.next() }
                room.deliver(r)
                s.delivered.append(r)
            }
            room.flush()
            _ = gateway.turn()
        }
        _ = client.wait(timeout: .seconds(5))
        // The stats topic now (as after `status.interval`), and turns until it has left.
        gateway.publishStats(now: .now)
        let settle = Instant.now + .milliseconds(500)
        while Instant.now < settle { _ = gateway.turn() }
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
        #expect(info["bluetooth_proxy_feature_flags"] as? Int == 97)
        #expect(info["api_encryption_supported"] as? Bool == true)
        #expect(info["mac_address"] as? String == ProxySettings.macText(ProxySettings.derivedMAC(gatewayID: "hall")))
        let ads = s.first("advertisements") as? [[String: Any]] ?? []
        #expect(ads.count == s.delivered.count && ads.count == 10, "\(s.lines)")
        for (got, sent) in zip(ads, s.delivered) {
            #expect(got["address"] as? UInt64 == sent.address)
            #expect(got["address_type"] as? Int == Int(sent.addressType))
            #expect(got["rssi"] as? Int == Int(sent.rssi))
            #expect(got["data"] as? String == hexString(sent.data))
        }
        // The scanner's state follows the radio: running (2), passive (0), once it scans.
        #expect((s.first("scanner") as? [[Int]])?.last == [2, 0], "\(s.lines)")
        #expect(s.first("disconnected") as? Bool == true)
        let esphome = s.stats?["esphome"] as? [String: Any]
        #expect(esphome?["advertisements"] as? Int == 10, "\(String(describing: s.stats))")
        #expect(esphome?["wrong_key"] as? Int == 0)
    }

    @Test func aWrongKeyIsRefusedAndCounted() throws {
        let s = try session(clientKey: "AQECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=", want: 1)
        #expect(s.first("error") as? String == "InvalidEncryptionKeyAPIError", "\(s.lines)")
        #expect((s.stats?["esphome"] as? [String: Any])?["wrong_key"] as? Int == 1, "\(String(describing: s.stats))")
    }
}
