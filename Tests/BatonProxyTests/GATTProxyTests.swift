// Home Assistant connects to a device through the gateway (docs/esphome.md §11): aioesphomeapi,
// as bleak-esphome drives it, against the ESPHome server and the gateway's connections, turned
// as `Gateway.turn` turns them (the server, then what its clients asked handed to the
// connections, then the connections), to a thermometer's GATT server (`TestGATTDevice`) at the
// far end of the attribute channel.
import BatonLibc
import BatonProxy
import BatonRelay
import BatonTestSupport
import BatonWire
import Foundation
import Testing

@Suite(.serialized, .enabled(if: haveAioesphomeapi, "scripts/esphome-venv makes the venv"))
struct GATTProxyTests {
    @Test func homeAssistantConnectsListsReadsWritesHearsANotificationAndFreesTheSlot() throws {
        var settings = ProxySettings(encryption: .none)
        settings.address = "127.0.0.1"
        settings.port = 0
        settings.connections = 3
        let mac: UInt64 = 0x02BA_7000_0002
        let info = DeviceInfo(name: "office", macAddress: ProxySettings.macText(mac), esphomeVersion: "2025.5.0",
                              model: "Baton gateway", manufacturer: "Baton", friendlyName: "Office",
                              bluetoothMacAddress: "00:1A:7D:DA:71:14", encryptionSupported: false)
        var server = try ProxyServer(settings: settings, info: info, compactMAC: ProxySettings.compactMAC(mac))
        let devices = GATTTestDevices()
        var connections = GATTConnections(limit: settings.connections, link: AnyDeviceLink(GATTTestLink(box: devices)))
        let address: UInt64 = 0xC0FF_EE00_0001
        let dir = NSTemporaryDirectory() + "baton-gatt-\(getpid())-\(server.port)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let child = try ChildProcess(esphomePython, [repoRoot + "/Tests/BatonProxyTests/Interop/gatt_client.py", "\(server.port)", "\(address)"],
                                     stdout: dir + "/out", stderr: dir + "/err")
        var notified = false
        var loop = TestLoop(parts: 2, descriptors: server.descriptorLimit + connections.descriptorLimit, longestWait: .milliseconds(20))
        try loop.run(limit: .seconds(60), before: {
            guard let device = devices.devices[address] else { return }
            device.serve()
            // The client turned the temperature's notifications on (its CCCD, 0x0001): one comes.
            if !notified, device.value(10) == [0x01, 0x00] {
                notified = true
                device.notify(9, [0x36, 0x08])
            }
        }, until: { !child.isRunning }) { driver in
            let s = driver.add(&server)
            let c = driver.add(&connections)
            driver.wait()
            server.serve(driver.ready(s), now: driver.now)
            while let a = server.nextGATTAsk() {
                connections.ask(a.ask, client: a.client, address: a.address, data: a.data, now: driver.now, to: &server)
            }
            connections.serve(driver.ready(c), now: driver.now, to: &server)
        }
        _ = child.wait(timeout: .seconds(5))
        let out = (try? String(contentsOfFile: dir + "/out", encoding: .utf8)) ?? ""
        let err = (try? String(contentsOfFile: dir + "/err", encoding: .utf8)) ?? ""
        var lines: [[String: Any]] = []
        for line in out.split(separator: "\n") {
            if let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { lines.append(o) }
        }
        func first(_ key: String) -> Any? { lines.first { $0[key] != nil }?[key] }
        #expect(first("error") == nil, "\(lines) \(err)")

        // 103: passive scan, active connections, remote caching, raw advertisements, state and mode.
        #expect(first("feature_flags") as? Int == 103)
        // [connected, mtu, error], connected as 1 or 0.
        #expect(first("connected") as? [[Int]] == [[1, 247, 0]])
        let services = try #require(first("services") as? [[String: Any]])
        try #require(services.count == 2, "\(services)")
        #expect(services[0]["uuid"] as? String == "0000180f-0000-1000-8000-00805f9b34fb")
        #expect(services[0]["handle"] as? Int == 1)
        let battery = try #require((services[0]["characteristics"] as? [[String: Any]])?.first)
        #expect(battery["uuid"] as? String == "00002a19-0000-1000-8000-00805f9b34fb")
        #expect(battery["handle"] as? Int == 3, "the value's handle, as an ESP32 names a characteristic")
        #expect(battery["properties"] as? Int == 0x12)
        #expect(battery["descriptors"] as? [[AnyHashable]] == [["00002902-0000-1000-8000-00805f9b34fb", 4]])
        // The 128-bit service: 10 11 … 1F on the air (little-endian) is 1f1e…1110 written out.
        #expect(services[1]["uuid"] as? String == "1f1e1d1c-1b1a-1918-1716-151413121110")
        let custom = try #require(services[1]["characteristics"] as? [[String: Any]])
        #expect(custom.map { $0["handle"] as? Int } == [7, 9])
        #expect(first("battery") as? String == "57")
        #expect(first("long") as? String == TestGATTDevice.longValue.map { String(format: "%02x", $0) }.joined())
        // A Write Request (01 02 03), then a Write Command (04): the value is the last one.
        #expect(first("written") as? String == "04")
        #expect(first("read_error") as? String == "BluetoothGATTAPIError", "\(lines)")
        #expect(first("notification") as? String == "3608")
        // Connected, then disconnected by the client (0x16: by this side, as an ESP32 says).
        #expect(first("states") as? [[Int]] == [[1, 247, 0], [0, 0, 22]])
        // The slots: all free, one taken by the thermometer, all free again.
        let slots = try #require(first("slots") as? [[Any]])
        #expect(slots.first?[0] as? Int == 3 && slots.first?[1] as? Int == 3)
        #expect(slots.contains { $0[0] as? Int == 2 && ($0[2] as? [UInt64]) == [address] })
        #expect(slots.last?[0] as? Int == 3)
        #expect(first("disconnected") as? Bool == true)
        #expect(connections.count == 0 && connections.counters.connected == 1)
        #expect(server.counters.badFrames == 0)
    }
}
