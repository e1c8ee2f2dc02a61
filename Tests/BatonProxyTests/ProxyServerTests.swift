// The server's exchange and its bad clients (docs/esphome.md §1, §5), over loopback with a
// plaintext client written in bytes. Time is injected: a "later" turn passes an `Instant` past
// the bound instead of waiting for it.
import BatonHCI
import BatonLibc
import BatonTestSupport
import BatonWire
import CLibc
import Glibc
import Testing
@testable import BatonProxy

/// A server on 127.0.0.1 and a way to turn it, as the gateway's loop does.
struct Bench: ~Copyable {
    var server: ProxyServer
    let log = LogLines()

    init(clients: Int = 2, sendBuffer: Int = 16 * 1024, encryption: ProxyEncryption = .none, connections: Int = 0) throws {
        var s = ProxySettings(encryption: encryption)
        s.address = "127.0.0.1"
        s.port = 0
        s.clients = clients
        s.sendBuffer = sendBuffer
        // The passive proxy's bytes (feature flags 97) unless asked: connections are GATTProxyTests'.
        s.connections = connections
        server = try ProxyServer(settings: s, info: hallInfo, compactMAC: "02ba70000001", log: log.logger)
        server.fixedEphemeralKey = vectorResponderEphemeral
    }

    /// A few turns at `now` (default: the clock), each waiting at most 20 ms.
    mutating func turn(_ times: Int = 5, now: Instant? = nil) {
        var loop = TestLoop(parts: 1, descriptors: server.descriptorLimit, longestWait: .milliseconds(20))
        loop.turns(times, now: now) { driver in
            let slot = driver.add(&server)
            driver.wait()
            server.serve(driver.ready(slot), now: now ?? driver.now)
        }
    }

    /// Turns until the server holds `n` clients, for at most `bound` of the clock: on a loaded
    /// machine (the suite's parallel fuzz build) five 20 ms turns can pass before the loop is
    /// scheduled again. A client's close reaches the server only if no child process holds a
    /// copy of it: the client is close-on-exec (`connectClient`), and `ChildProcess` passes
    /// its children nothing past stderr.
    mutating func turn(untilClients n: Int, within bound: Duration = .seconds(5)) {
        let end = Instant.now + bound
        repeat { turn(1) } while server.clientCount != n && Instant.now < end
    }

    func connectClient() -> Int32 {
        // Close-on-exec: a child a parallel test starts must not hold the client open.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = server.port.bigEndian
        a.sin_addr.s_addr = inet_addr("127.0.0.1")
        let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        #expect(r == 0)
        return fd
    }
}

func sendAll(_ fd: Int32, _ bytes: [UInt8]) {
    #expect(bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) } == bytes.count)
}

/// What the client has received so far (non-blocking); nil once the server closed.
func received(_ fd: Int32) -> [UInt8]? {
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n > 0 { out += buf[..<n]; continue }
        if n == 0 { return out.isEmpty ? nil : out }
        return out
    }
}

@Suite(.serialized) struct ProxyServerTests {
    @Test func helloDeviceInfoListPingAndGoodbyeSection1() throws {
        var b = try Bench()
        let c = b.connectClient()
        defer { close(c) }
        b.turn()
        // HelloRequest "aioesphomeapi" 1.12, DeviceInfoRequest, ListEntitiesRequest,
        // SubscribeStatesRequest, PingRequest, an unknown message 200, DisconnectRequest.
        sendAll(c, hx("00 13 01 0a0d61696f657370686f6d656170691001180c") + hx("00 00 09  00 00 0b  00 00 14  00 00 07  00 00 c801  00 00 05"))
        b.turn()
        let hello = try written(type: 2, HelloResponse(serverInfo: Array("Baton (ESPHome native API)".utf8), name: Array("hall".utf8)))
        let info = try written(type: 10, DeviceInfoResponse(hallInfo))
        #expect(received(c) == hello + info + hx("00 00 13  00 00 08  00 00 06"))
        #expect(received(c) == nil, "closed after the DisconnectResponse")
        #expect(b.server.clientCount == 0)
        #expect(b.log.lines.contains { $0.contains("is \"aioesphomeapi\" (API 1.12)") })
    }

    /// docs/esphome.md §11.2: the slots are told on subscription (80 → 81), and a GATT request no
    /// connections part takes within its turn is refused the next (82, −1), counted, so asks
    /// never pile up in a server whose gateway has no device link.
    @Test func slotsAreToldAndAnAskNobodyTakesIsRefused() throws {
        var b = try Bench(connections: 3)
        let c = b.connectClient()
        defer { close(c) }
        b.turn()
        // Hello, SubscribeBluetoothConnectionsFreeRequest (80 = 0x50), BluetoothGATTReadRequest
        // (73 = 0x49) for address 1, handle 3.
        sendAll(c, hx("00 13 01 0a0d61696f657370686f6d656170691001180c") + hx("00 00 50") + hx("00 04 49 0801 1003"))
        b.turn()
        let hello = try written(type: 2, HelloResponse(serverInfo: Array("Baton (ESPHome native API)".utf8), name: Array("hall".utf8)))
        let slots = try written(type: 81, ConnectionsFreeMessage(free: 3, limit: 3, allocated: [][...]))
        let refused = try written(type: 82, GATTVarintMessage.error(address: 1, handle: 3, code: -1))
        #expect(received(c) == hello + slots + refused)
        #expect(b.server.counters.gattAsksRefused == 1)
        #expect(b.server.info.featureFlags == 103)
    }

    /// Home Assistant 2024.3 (aioesphomeapi 23) sends ConnectRequest (3, no password) with its
    /// hello and waits for both answers: an empty ConnectResponse (4), `invalid_password` false.
    @Test func aConnectRequestIsAnsweredWithoutAPasswordSection3_3() throws {
        var b = try Bench()
        let c = b.connectClient()
        defer { close(c) }
        b.turn()
        sendAll(c, hx("00 13 01 0a0d61696f657370686f6d656170691001180a") + hx("00 00 03"))
        b.turn()
        let hello = try written(type: 2, HelloResponse(serverInfo: Array("Baton (ESPHome native API)".utf8), name: Array("hall".utf8)))
        #expect(received(c) == hello + hx("00 00 04"))
        #expect(b.server.clientCount == 1)
    }

    @Test func theNoiseExchangeInBytesSection4_1() throws {
        var b = try Bench(encryption: .noise(key: vectorPSK))
        let c = b.connectClient()
        defer { close(c) }
        b.turn()
        // The client's hello, its handshake frame (0 = OK, then the §4.3 message), its ping.
        sendAll(c, hx("01 0000") + hx("01 0031 00") + vectorMessage1 + hx("01 0014") + vectorClientPing)
        b.turn()
        #expect(received(c) == hx("01 0013  01 68616c6c 00 303262613730303030303031 00")  // 1, "hall", "02ba70000001"
                + hx("01 0031 00") + vectorMessage2
                + hx("01 0014") + vectorServerPong)
    }

    @Test func anUnfinishedHandshakeTimesOutHoweverSlowlyItTrickles() throws {
        var b = try Bench(encryption: .noise(key: vectorPSK))
        let c = b.connectClient()
        defer { close(c) }
        b.turn()
        sendAll(c, hx("01 0000  01 0031 00"))  // the hello, then a handshake frame that never ends
        b.turn(1, now: .now + .seconds(9))
        sendAll(c, hx("7b4e"))
        b.turn(1, now: .now + .seconds(9))
        #expect(b.server.clientCount == 1)
        b.turn(1, now: .now + .seconds(11))
        #expect(b.server.clientCount == 0 && b.server.counters.timedOut == 1)
        #expect(b.log.lines.contains { $0.contains("did not finish the handshake within 10 s") })
    }

    @Test func advertisementsArriveInTheTurnTheyAreHeardSection3_4() throws {
        var b = try Bench()
        let c = b.connectClient()
        defer { close(c) }
        b.turn()
        sendAll(c, hx("00 02 42 08 01"))
        b.turn()
        #expect(received(c) == hx("00 02 7e 08 02"), "the scanner's state with the subscription")
        bthomeData.withUnsafeBytes { b.server.heard(address: bthomeAddress, addressType: 0, rssi: -67, data: $0) }
        b.server.flush(now: .now)
        #expect(received(c) == hx("00 1f 5d  0a 1d 08 ef9bafc5939829 10 8501 22 10 0201060b16d2fc4000c402ca0903bf13"))
        // 16 in one turn make one full message; the 17th waits for the turn's end.
        for i in 0..<17 { bthomeData.withUnsafeBytes { b.server.heard(address: UInt64(i), addressType: 0, rssi: -50, data: $0) } }
        #expect(b.server.counters.batchesSent == 2)
        b.server.flush(now: .now)
        #expect(b.server.counters.batchesSent == 3 && b.server.counters.advertisementsSent == 18)
        // Too long for ESPHome's 62 bytes: counted, not sent.
        [UInt8](repeating: 0, count: 63).withUnsafeBytes { b.server.heard(address: 1, addressType: 0, rssi: -50, data: $0) }
        #expect(b.server.counters.tooLong == 1)
        sendAll(c, hx("00 00 57"))  // UnsubscribeBluetoothLEAdvertisementsRequest (87)
        b.turn()
        #expect(b.server.subscriberCount == 0)
    }

    /// "Active scanning": a request (127, mode 1) makes the wanted mode active; the state says
    /// passive until the gateway has changed the radio; then a scannable advertisement and its
    /// scan response go out as one entry, advertising data first (field 4, 10 + 13 bytes). A
    /// client that leaves takes its request with it.
    @Test func anActiveRequestAndTheScanResponseSentWithItsAdvertisement() throws {
        var b = try Bench()
        let c = b.connectClient()
        sendAll(c, hx("00 02 42 08 01"))
        b.turn()
        #expect(received(c) == hx("00 02 7e 08 02"))
        #expect(b.server.wantedScanMode == ScannerMode.passive)
        sendAll(c, hx("00 02 7f 08 01"))  // BluetoothScannerSetModeRequest: active
        b.turn()
        #expect(b.server.wantedScanMode == ScannerMode.active)
        #expect(received(c) == hx("00 02 7e 08 02"), "still passive: the radio has not changed yet")
        b.server.setScannerState(ScannerState.running, mode: ScannerMode.active)
        b.server.flush(now: .now)
        #expect(received(c) == hx("00 04 7e 08 02 10 01"), "running, active, configured passive")

        let adv = hx("02 01 06 06 16 d2 fc 40 02 c4"), rsp = hx("0c 09") + Array("hall-thermo".utf8)
        adv.withUnsafeBytes { b.server.heard(address: 0xA4C1_3800_5C01, addressType: 0, rssi: -61, data: $0, eventType: 0x12) }
        rsp.withUnsafeBytes { b.server.heard(address: 0xA4C1_3800_5C01, addressType: 0, rssi: -60, data: $0, eventType: 0x1A) }
        // A scan response of a device whose advertisement was not heard goes alone.
        rsp.withUnsafeBytes { b.server.heard(address: 0xA4C1_3800_5C02, addressType: 0, rssi: -70, data: $0, eventType: 0x1A) }
        b.server.flush(now: .now)
        // 89 bytes, type 93; address A4:C1:38:00:5C:01 is the varint 81b881c0939829.
        #expect(received(c) == hx("00 59 5d")
            + hx("0a 16 08 81b881c0939829 10 79 22 0a") + adv
            + hx("0a 23 08 81b881c0939829 10 77 22 17") + adv + rsp
            + hx("0a 1a 08 82b881c0939829 10 8b01 22 0d") + rsp)
        #expect(b.server.scanResponses.merged == 1 && b.server.scanResponses.alone == 1)

        sendAll(c, hx("00 02 7f 08 07"))  // not a mode: changes nothing
        b.turn()
        #expect(b.server.wantedScanMode == ScannerMode.active)
        close(c)
        b.turn(untilClients: 0)
        #expect(b.server.clientCount == 0)
        #expect(b.server.wantedScanMode == ScannerMode.passive, "a client that left takes its request with it")
    }

    @Test func aPinnedModeIsWhatTheRadioIsAskedWhateverTheRequest() throws {
        var settings = ProxySettings(encryption: .none)
        settings.address = "127.0.0.1"
        settings.port = 0
        settings.scanMode = .active
        var server = try ProxyServer(settings: settings, info: hallInfo, compactMAC: "02ba70000001")
        #expect(server.wantedScanMode == ScannerMode.active && server.configuredScanMode == ScannerMode.active)
        settings.scanMode = .passive
        server = try ProxyServer(settings: settings, info: hallInfo, compactMAC: "02ba70000001")
        #expect(server.wantedScanMode == ScannerMode.passive && server.configuredScanMode == ScannerMode.passive)
    }

    @Test func garbageIsDisconnectedAndCounted() throws {
        var b = try Bench()
        let c = b.connectClient()
        defer { close(c) }
        b.turn()
        sendAll(c, hx("00 02 42 0b 01"))  // wire type 3 in the body
        b.turn()
        #expect(received(c) == nil)
        #expect(b.server.counters.badFrames == 1 && b.server.clientCount == 0)
        #expect(b.log.lines.contains { $0.contains("that is not protobuf") && $0.hasSuffix("disconnected") })
        let d = b.connectClient()
        defer { close(d) }
        sendAll(d, hx("00 ffff03 01"))  // a body of 65,535 bytes for a 1 KiB buffer
        b.turn()
        #expect(received(d) == nil && b.server.counters.badFrames == 2)
    }

    @Test func aConnectionBeyondTheSlotsIsClosedAtOnce() throws {
        var b = try Bench(clients: 1)
        let c = b.connectClient(), d = b.connectClient()
        defer { close(c); close(d) }
        b.turn()
        #expect(b.server.clientCount == 1 && b.server.counters.refusedFull == 1)
        #expect(received(d) == nil)
        #expect(b.log.lines.contains { $0.contains("all 1 client slots are taken (raise esphome.clients)") })
    }

    @Test func aClientThatStopsReadingIsDroppedAfterTheBound() throws {
        var b = try Bench(sendBuffer: 4096)
        let c = b.connectClient()
        defer { close(c) }
        var small: Int32 = 4096
        setsockopt(c, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(4))
        b.turn()
        sendAll(c, hx("00 02 42 08 01"))
        b.turn()
        // The client reads nothing: the kernel's buffers fill, then ours.
        let data = [UInt8](repeating: 0x5A, count: 62)
        var i = 0
        while b.server.counters.advertisementsDropped == 0, i < 200_000 {
            data.withUnsafeBytes { b.server.heard(address: UInt64(i), addressType: 0, rssi: -60, data: $0) }
            i += 1
            if i % 16 == 0 { b.server.flush(now: .now) }
        }
        #expect(b.server.counters.advertisementsDropped > 0, "its batches are dropped once its buffer is full")
        b.turn(1)
        #expect(b.server.clientCount == 1, "not yet: the bound is 10 s")
        b.turn(1, now: .now + .seconds(11))
        #expect(b.server.clientCount == 0 && b.server.counters.stalled == 1 && b.server.subscriberCount == 0)
        #expect(b.log.lines.contains { $0.contains("stopped reading: its 4096-byte send buffer stayed full for 10 s") })
    }

    /// §5: a quiet client is pinged after 60 s (a subscriber has nothing to say while
    /// advertisements stream in); one that answers stays; one silent for 150 s is gone.
    @Test func aQuietClientIsPingedAndKeptWhenItAnswers() throws {
        var b = try Bench()
        let c = b.connectClient()
        defer { close(c) }
        let start = Instant.now
        b.turn()
        b.turn(1, now: start + .seconds(59))
        #expect(received(c) == nil || received(c) == [], "nothing before 60 s")
        b.turn(1, now: start + .seconds(61))
        #expect(received(c) == hx("00 00 07"), "a PingRequest")
        sendAll(c, hx("00 00 08"))
        b.turn(1, now: start + .seconds(62))
        b.turn(1, now: start + .seconds(200))
        #expect(b.server.clientCount == 1, "it answered at 62 s: pinged again at 122 s, not dropped")
        #expect(b.server.counters.timedOut == 0)
    }

    @Test func aSilentClientAndAnUnfinishedHandshakeTimeOut() throws {
        var b = try Bench()
        let c = b.connectClient()
        defer { close(c) }
        let start = Instant.now
        b.turn()
        b.turn(1, now: start + .seconds(61))
        b.turn(1, now: start + .seconds(149))
        #expect(b.server.clientCount == 1, "pinged at 60 s, given until 150 s")
        b.turn(1, now: start + .seconds(151))
        #expect(b.server.clientCount == 0 && b.server.counters.timedOut == 1)
    }

    @Test func theStatsSection() throws {
        let b = try Bench()
        var out = [UInt8](repeating: 0, count: 1024)
        let text = try out.withUnsafeMutableBytes { buf in
            var w = JSONWriter(buf)
            try b.server.writeStats(into: &w)
            return String(decoding: w.written, as: UTF8.self)
        }
        #expect(text == "{\"port\":\(b.server.port),\"encryption\":\"none\",\"clients\":0,\"slots\":2,\"subscribed\":0,\"accepted\":0,\"refused_full\":0,\"wrong_key\":0,\"bad_frames\":0,\"stalled\":0,\"timed_out\":0,\"advertisements\":0,\"batches\":0,\"dropped\":0,\"too_long\":0,\"scan_mode\":\"passive\",\"scan_responses_merged\":0,\"scan_responses_alone\":0,\"baton_beacons_withheld\":0,\"gatt_asks_refused\":0}")
    }

    @Test func theAvahiServiceFileSection7() {
        let xml = MDNSService.avahiXML(name: "hall", friendlyName: "Hall & <Co>", port: 6053, mac: "02ba70000001", version: "2025.5.0", encrypted: true)
        #expect(xml.contains("<type>_esphomelib._tcp</type>"))
        #expect(xml.contains("<port>6053</port>"))
        #expect(xml.contains("<txt-record>mac=02ba70000001</txt-record>"))
        #expect(xml.contains("<txt-record>friendly_name=Hall &amp; &lt;Co&gt;</txt-record>"))
        #expect(xml.contains("<txt-record>api_encryption=Noise_NNpsk0_25519_ChaChaPoly_SHA256</txt-record>"))
        #expect(!MDNSService.avahiXML(name: "hall", friendlyName: "Hall", port: 6053, mac: "02ba70000001", version: "2025.5.0", encrypted: false).contains("api_encryption"))
        #expect(!MDNSService.emptyXML(name: "hall").contains("<service>"))
    }

    @Test func theServiceFileIsRewrittenInPlaceNeverCreated() throws {
        let path = "/tmp/baton-esphome-\(getpid()).service"
        defer { unlink(path) }
        #expect(throws: Errno.self) { try MDNSService.write("x", to: path) }  // the package creates it
        let fd = creat(path, 0o644)
        #expect(fd >= 0)
        close(fd)
        try MDNSService.write(MDNSService.emptyXML(name: "hall") + "longer than what follows", to: path)
        try MDNSService.write(MDNSService.emptyXML(name: "hall"), to: path)
        #expect((try? readFile(path)).map { String(decoding: $0, as: UTF8.self) } == MDNSService.emptyXML(name: "hall"))
    }
}
