// The config file and the flags over it: docs/config.md. Every error text here is what the
// user reads on the console, byte for byte, with its line number.
import Foundation
import Testing
import BatonCore
import BatonKeys
import BatonTestSupport
import BatonMQTT
import BatonRelay
@testable import BatonGateway

private let host = "Living-Room.lan"
private let etc = "/etc/baton/baton.yaml"

private func parse(_ yaml: String, file: String = etc) throws(ConfigError) -> GatewayConfig {
    try GatewayConfig.parse(yaml: yaml, file: file, hostName: host)
}

/// What `baton gateway` prints for this file, or nil if it loads.
private func problems(_ yaml: String, file: String = etc) -> String? {
    do throws(ConfigError) {
        _ = try parse(yaml, file: file)
        return nil
    } catch {
        return error.description
    }
}

/// The Apple id key is random per load; everything else must match exactly.
private func withoutKey(_ config: GatewayConfig) -> GatewayConfig {
    var c = config
    c.apple.idKey = 0
    return c
}

/// docs/config.md, written out field by field for the host name "Living-Room.lan".
private let documentedDefaults = GatewayConfig(
    gatewayID: "living-room-lan",
    room: "living-room-lan",
    broker: MQTTConfig(host: "127.0.0.1", port: 1883, tls: nil, clientID: "baton-living-room-lan",
                       username: nil, password: nil, keepalive: 30, will: nil, protocolVersion: .automatic,
                       reconnectMin: .milliseconds(250), reconnectMax: .seconds(30)),
    prefix: "baton",
    discoveryPrefix: "homeassistant",
    discovery: true,
    radio: .adapter("hci0"),
    pacedCapture: true,
    radioSilence: .seconds(60),
    companyID: 0xFFFF,
    table: ActivityTableConfig(capacity: 1536, expiry: .seconds(60)),
    apple: AppleDeviceTableConfig(tracking: .handoff, capacity: 64, expiry: .seconds(60), idKey: 0),
    appleAddresses: false,
    statusInterval: .seconds(30),
    logLevel: "info",
    rooms: RoomsConfig(sightingInterval: .seconds(2), sightingStep: 3, sightingMinInterval: .milliseconds(500),
                       sightingFresh: .seconds(5), lostAfter: .seconds(10), settle: .seconds(1), margin: 6,
                       dwell: .seconds(3), walkDwell: .seconds(1), walkWindow: .seconds(15), calm: .seconds(5),
                       forgetAfter: .seconds(60), capacity: 2048, gateways: 32),
    relay: RelayConfig(fetchTimeout: .seconds(5), linkIdle: .seconds(10), fetches: 32, cache: 32, links: 8,
                       payloadMax: 4096, streams: 16, streamWindow: 16, streamMaxData: 1024,
                       streamRetry: .seconds(1), streamIdle: .seconds(60)),
    relayLink: .auto,
    security: SecurityConfig())

/// A fresh directory for files the config points at; removed when the test ends.
private final class Scratch {
    let path: String
    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("baton-config-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
    @discardableResult
    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        let file = path + "/" + name
        try FileManager.default.createDirectory(atPath: (file as NSString).deletingLastPathComponent,
                                                withIntermediateDirectories: true)
        try Data(bytes).write(to: URL(fileURLWithPath: file))
        return file
    }
    @discardableResult
    func write(_ name: String, _ text: String) throws -> String { try write(name, Array(text.utf8)) }
}

/// The reason BatonMQTT gives for a bad broker URL: the config passes it through unchanged.
private func urlReason(_ text: String) -> String {
    do throws(MQTTError) {
        _ = try MQTTURL(parsing: text)
        return "(parsed)"
    } catch {
        if case .invalidURL(let reason) = error { return reason }
        return "(other error)"
    }
}

// MARK: - Defaults

@Suite struct ConfigDefaultsTests {
    @Test func defaultsAreTheDocumentedOnes() {
        #expect(withoutKey(GatewayConfig.defaults(hostName: host)) == documentedDefaults)
    }

    @Test func theGatewayIDComesFromTheHostName() {
        #expect(GatewayConfig.defaultGatewayID(hostName: "Living-Room.lan") == "living-room-lan")
        #expect(GatewayConfig.defaultGatewayID(hostName: "pi") == "pi")
        #expect(GatewayConfig.defaultGatewayID(hostName: "Küche_2") == "k-che_2")
        #expect(GatewayConfig.defaultGatewayID(hostName: "") == "baton")
        #expect(GatewayConfig.defaultGatewayID(hostName: String(repeating: "a", count: 100)) == String(repeating: "a", count: 64))
    }

    @Test(arguments: ["", "# nothing set\n", "---\n", "gateway:\nbroker:\n", "broker:\n  username: ~\n  keepalive:\n  tls:\n"])
    func anEmptyFileOrEmptySectionsGiveTheDefaults(yaml: String) throws {
        #expect(withoutKey(try parse(yaml)) == documentedDefaults)
    }

    @Test func theAppleIDKeyIsFreshOnEveryLoad() throws {
        // A constant key would let one run's pseudonyms be linked to the next run's.
        let a = try parse(""), b = try parse("")
        #expect(a.apple.idKey != b.apple.idKey)
    }

    @Test func theShippedFileLoadsAndHoldsTheDefaults() throws {
        // board/baton.yaml is what a Pi install copies to /etc/baton/baton.yaml.
        let board = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../board/baton.yaml").standardized.path
        let config = try GatewayConfig.load(file: board, hostName: host)
        #expect(withoutKey(config) == documentedDefaults)
    }

    @Test func everyKeyIsInTheShippedFileAndTheDocs() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..")
        let board = try String(contentsOf: root.appendingPathComponent("board/baton.yaml"), encoding: .utf8)
        let docs = try String(contentsOf: root.appendingPathComponent("docs/config.md"), encoding: .utf8)
        #expect(ConfigSchema.valueKeys.count == 83)  // 61, then relay.fetch-titles (issue 18), radio.reassembly (issue 19), esphome's 9 (issue 22), rooms.batches, rooms.neighbourhoods, rooms.reach and radio.gather (issue 21), broker.max-qos (issue 35), rooms.walk-dwell, walk-window, calm and calm-per-contest (issue 33), esphome.scan-mode and esphome.connections (issue 32)
        for key in ConfigSchema.valueKeys {
            let leaf = key.split(separator: ".").last!
            let inBoard = board.contains(" \(leaf): "), inDocs = docs.contains("`\(key)`")
            #expect(inBoard, "board/baton.yaml does not show \(key)")
            #expect(inDocs, "docs/config.md does not describe \(key)")
        }
    }
}

// MARK: - A full file

@Suite struct ConfigFileTests {
    @Test func everyKeyLandsInItsField() throws {
        let dir = try Scratch()
        try dir.write("ca.crt", "CA\n")
        try dir.write("certs/kitchen.crt", "CERT\n")
        let key = try dir.write("kitchen.key", "KEY\n")
        let yaml = """
            gateway:
              id: kitchen
              room: Küche
            broker:
              url: mqtts://broker.home.arpa:8884
              client-id: baton-kitchen-1
              username: baton
              password: "s3cret: yes"
              keepalive: 45s
              protocol: 3.1.1
              max-qos: 0
              reconnect-min: 1s
              reconnect-max: 2m
              tls:
                ca-file: ca.crt
                cert-file: certs/kitchen.crt
                key-file: \(key)
                insecure: true
            topics:
              prefix: home/baton
              discovery: false
              discovery-prefix: ha
            radio:
              source: capture:room.btsnoop
              paced: false
              silence: 1m30s
              company-id: 0x1234
            table:
              capacity: 1000
              expiry: 5m
            apple:
              tracking: all
              capacity: 128
              expiry: 30s
              publish-address: true
            status:
              interval: 1h
            log:
              level: debug

            """
        let c = try parse(yaml, file: dir.path + "/baton.yaml")
        #expect(c.gatewayID == "kitchen")
        #expect(c.room == "Küche")
        #expect(c.broker.host == "broker.home.arpa")
        #expect(c.broker.port == 8884)
        // Relative paths are taken from the config file's directory.
        #expect(c.broker.tls == MQTTTLS(caFile: dir.path + "/ca.crt", certFile: dir.path + "/certs/kitchen.crt",
                                        keyFile: key, insecure: true))
        #expect(c.broker.clientID == "baton-kitchen-1")
        #expect(c.broker.maxQoS == 0)
        #expect(c.broker.username == "baton")
        #expect(c.broker.password == "s3cret: yes")
        #expect(c.broker.keepalive == 45)
        #expect(c.broker.protocolVersion == .v311)
        #expect(c.broker.reconnectMin == .seconds(1))
        #expect(c.broker.reconnectMax == .seconds(120))
        #expect(c.broker.will == nil)
        #expect(c.prefix == "home/baton")
        #expect(c.discovery == false)
        #expect(c.discoveryPrefix == "ha")
        #expect(c.radio == .capture(path: dir.path + "/room.btsnoop"))
        #expect(c.pacedCapture == false)
        #expect(c.radioSilence == .seconds(90))
        #expect(c.companyID == 0x1234)
        #expect(c.table == ActivityTableConfig(capacity: 1000, expiry: .seconds(300)))
        #expect(c.apple.tracking == .all)
        #expect(c.apple.capacity == 128)
        #expect(c.apple.expiry == .seconds(30))
        #expect(c.appleAddresses == true)
        #expect(c.statusInterval == .seconds(3600))
        #expect(c.logLevel == "debug")
    }

    @Test func theRoomAndClientIDFollowTheIDUnlessSet() throws {
        let followed = try parse("gateway:\n  id: hall\n")
        #expect(followed.room == "hall")
        #expect(followed.broker.clientID == "baton-hall")
        let set = try parse("gateway:\n  id: hall\n  room: Front hall\nbroker:\n  client-id: pi-7\n")
        #expect(set.room == "Front hall")
        #expect(set.broker.clientID == "pi-7")
    }

    @Test func valuesAreTakenAsWritten() throws {
        // YAML would read these as a number and a boolean; a room name is text.
        #expect(try parse("gateway:\n  room: 101\n").room == "101")
        #expect(try parse("gateway:\n  room: no\n").room == "no")
        // A quoted "null" is text; a bare ~ leaves the key unset.
        let c = try parse("broker:\n  username: ~\n  password: \"null\"\n")
        #expect(c.broker.username == nil)
        #expect(c.broker.password == "null")
        #expect(try parse("broker:\n  protocol: 5\n").broker.protocolVersion == .v5)
        #expect(try parse("log:\n  level: WARNING\n").logLevel == "warning")
        #expect(try parse("topics:\n  discovery: off\n").discovery == false)
        #expect(try parse("radio:\n  company-id: 65535\n").companyID == 0xFFFF)
        #expect(try parse("radio:\n  company-id: 0x0a0b\n").companyID == 0x0A0B)
        #expect(try parse("radio:\n  source: h4:/dev/ttyACM0\n").radio == .h4(path: "/dev/ttyACM0"))
    }

    @Test func anMQTTSURLWithoutTLSSettingsUsesTheSystemCAs() throws {
        let c = try parse("broker:\n  url: mqtts://broker.lan\n")
        #expect(c.broker.tls == MQTTTLS())
        #expect(c.broker.port == 8883)
    }

    @Test func thePasswordFileGivesItsFirstLine() throws {
        let dir = try Scratch()
        try dir.write("mqtt-password", "hunter2\nsecond line\n")
        try dir.write("windows-password", "hunter3\r\n")
        let file = try dir.write("baton.yaml", "broker:\n  username: baton\n  password-file: mqtt-password\n")
        #expect(try GatewayConfig.load(file: file, hostName: host).broker.password == "hunter2")
        let windows = try dir.write("windows.yaml", "broker:\n  password-file: windows-password\n")
        #expect(try GatewayConfig.load(file: windows, hostName: host).broker.password == "hunter3")
    }

    @Test func roomParametersAreCheckedAgainstEachOther() throws {
        // docs/rooms.md §3: a heartbeat must arrive before its sighting goes stale, and a
        // device must be called lost before a table forgets it.
        let c = try parse("table:\n  expiry: 30s\nrooms:\n  dwell: 750ms\n  margin: 8\n  lost-after: 20s\n")
        #expect(c.rooms.dwell == .milliseconds(750) && c.rooms.margin == 8 && c.rooms.lostAfter == .seconds(20))
        let walk = try parse("rooms:\n  walk-dwell: 500ms\n  walk-window: 20s\n  calm: 8s\n  calm-per-contest: 2s\n")
        #expect(walk.rooms.walkDwell == .milliseconds(500) && walk.rooms.walkWindow == .seconds(20) && walk.rooms.calm == .seconds(8))
        #expect(walk.rooms.calmPerContest == .seconds(2))
        #expect(problems("rooms:\n  calm-per-contest: 2h\n")
                == "/etc/baton/baton.yaml:2: rooms.calm-per-contest: must be between 0s and 1h, got 2h")
        #expect(c.rooms.forgetAfter == .seconds(30), "a device nobody hears is forgotten after table.expiry")
        #expect(problems("rooms:\n  lost-after: 60s\n")
                == "/etc/baton/baton.yaml:2: rooms.lost-after: must be shorter than table.expiry (1m), so other rooms take a device over before this one forgets it")
        #expect(problems("rooms:\n  sighting-interval: 5s\n  sighting-fresh: 5s\n")
                == "/etc/baton/baton.yaml:3: rooms.sighting-fresh: must be longer than rooms.sighting-interval (5s), or every heartbeat would arrive stale")
        #expect(problems("rooms:\n  capacity: 100001\n")
                == "/etc/baton/baton.yaml:2: rooms.capacity: must be between 1 and 100000, got 100001")
        #expect(problems("rooms:\n  dwel: 3s\n") == #"/etc/baton/baton.yaml:2: rooms: unknown key "dwel" (did you mean "dwell"?)"#)
    }

    @Test func theRelayLinkFollowsTheRadioUnlessSet() throws {
        // docs/relay.md §5: an adapter's L2CAP channels, the simulator's socket beside its
        // controller's, nothing for a capture.
        #expect(try parse("radio:\n  source: hci1\n").resolvedRelayLink == .bluez(adapter: "hci1"))
        #expect(try parse("radio:\n  source: sim:/tmp/b/hall.sock\n").resolvedRelayLink == .simulator(path: "/tmp/b/hall.link"))
        #expect(try parse("radio:\n  source: capture:x.btsnoop\n").resolvedRelayLink == .none)
        #expect(try parse("radio:\n  source: hci0\nrelay:\n  link: none\n").resolvedRelayLink == .none)
        #expect(try parse("relay:\n  link: sim:/tmp/x.link\n  fetch-timeout: 2s\n  payload-max: 65532\n").relay
                == RelayConfig(fetchTimeout: .seconds(2), payloadMax: 65_532))
        #expect(problems("relay:\n  link: blue\n")
                == #"/etc/baton/baton.yaml:2: relay.link: expected auto, none, bluez:hci0 or sim:SOCKET, got "blue""#)
        #expect(problems("relay:\n  payload-max: 65533\n")
                == "/etc/baton/baton.yaml:2: relay.payload-max: must be between 64 and 65532, got 65533")
        #expect(problems("relay:\n  payload-max: 1024\n  stream-max-data: 1023\n")
                == "/etc/baton/baton.yaml:3: relay.stream-max-data: must be at most relay.payload-max - 2 (1022): a data frame must fit the link's MTU")
        #expect(problems("relay:\n  fetches: 4097\n")
                == "/etc/baton/baton.yaml:2: relay.fetches: must be between 1 and 4096, got 4097")
    }

    @Test func capacitiesAcceptTheirMaximumAndNotOneMore() throws {
        #expect(try parse("table:\n  capacity: 100000\n").table.capacity == 100_000)
        #expect(problems("table:\n  capacity: 100001\n")
                == "/etc/baton/baton.yaml:2: table.capacity: must be between 1 and 100000, got 100001")
        #expect(try parse("apple:\n  capacity: 100000\n").apple.capacity == 100_000)
        #expect(problems("apple:\n  capacity: 100001\n")
                == "/etc/baton/baton.yaml:2: apple.capacity: must be between 1 and 100000, got 100001")
    }
}

// MARK: - Mistakes, as the user reads them

@Suite struct ConfigErrorTests {
    @Test func aMisspelledKeyGetsASuggestion() {
        #expect(problems("gateway:\n  room: Kitchen\nbrokr:\n  url: mqtt://pi.lan\n")
                == #"/etc/baton/baton.yaml:3: unknown key "brokr" (did you mean "broker"?)"#)
        #expect(problems("broker:\n  keepalve: 30s\n")
                == #"/etc/baton/baton.yaml:2: broker: unknown key "keepalve" (did you mean "keepalive"?)"#)
        #expect(problems("broker:\n  client_id: pi\n")
                == #"/etc/baton/baton.yaml:2: broker: unknown key "client_id" (did you mean "client-id"?)"#)
        #expect(problems("broker:\n  colour: blue\n")
                == #"/etc/baton/baton.yaml:2: broker: unknown key "colour""#)
    }

    @Test func aKeyInTheWrongPlaceIsPointedHome() {
        #expect(problems("keepalive: 30s\n")
                == #"/etc/baton/baton.yaml:1: unknown key "keepalive" (did you mean "broker.keepalive"?)"#)
        #expect(problems("radio:\n  prefix: home\n")
                == #"/etc/baton/baton.yaml:2: radio: unknown key "prefix" (did you mean "topics.prefix"?)"#)
        #expect(problems("broker.url: mqtt://pi.lan\n")
                == #"/etc/baton/baton.yaml:1: unknown key "broker.url" (keys nest by indentation: write "broker:", then indented under it "url:")"#)
        #expect(problems("broker:\n  url: mqtt://pi.lan\n  topics:\n    prefix: home\n")
                == #"/etc/baton/baton.yaml:3: broker: unknown key "topics" ("topics" is a section of its own: start it at the beginning of a line, not indented)"#)
    }

    @Test func aKeyGivenTwice() {
        #expect(problems("table:\n  capacity: 100\n  capacity: 200\n")
                == "/etc/baton/baton.yaml:3: table.capacity: given twice (first on line 2)")
    }

    @Test func aValueOfTheWrongShape() {
        #expect(problems("gateway:\n  room: [Kitchen, Hall]\n")
                == "/etc/baton/baton.yaml:2: gateway.room: expected text, got a list")
        #expect(problems("table:\n  capacity:\n    max: 10\n")
                == "/etc/baton/baton.yaml:3: table.capacity: expected a whole number, got a section of keys")
        #expect(problems("broker: mqtt://pi.lan\n")
                == #"/etc/baton/baton.yaml:1: broker: expected a section of "key: value" lines indented under it, got "mqtt://pi.lan""#)
        #expect(problems("- broker\n")
                == #"/etc/baton/baton.yaml:1: expected sections like "broker:" at the top of the file, got a list"#)
        #expect(problems("topics:\n  discovery: maybe\n")
                == #"/etc/baton/baton.yaml:2: topics.discovery: expected true or false, got "maybe""#)
        #expect(problems("radio:\n  company-id: apple\n")
                == #"/etc/baton/baton.yaml:2: radio.company-id: expected a number like 0xFFFF, got "apple""#)
    }

    @Test func aBadDuration() {
        #expect(problems("gateway:\n  room: Kitchen\nbroker:\n  url: mqtt://pi.lan\n  keepalive: thirty\n")
                == #"/etc/baton/baton.yaml:5: broker.keepalive: expected a duration like 30s or 500ms, got "thirty""#)
        #expect(problems("status:\n  interval: 30\n")
                == #"/etc/baton/baton.yaml:2: status.interval: expected a duration like 30s or 500ms, got "30" (a number needs its unit: ms, s, m or h)"#)
        #expect(problems("status:\n  interval: 1.5s\n")
                == #"/etc/baton/baton.yaml:2: status.interval: expected a duration like 30s or 500ms, got "1.5s""#)
    }

    @Test func aValueOutOfRange() {
        #expect(problems("broker:\n  keepalive: 2s\n")
                == "/etc/baton/baton.yaml:2: broker.keepalive: must be between 5s and 65535s, got 2s")
        #expect(problems("broker:\n  keepalive: 30500ms\n")
                == "/etc/baton/baton.yaml:2: broker.keepalive: must be whole seconds, got 30500ms")
        #expect(problems("table:\n  capacity: 0\n")
                == "/etc/baton/baton.yaml:2: table.capacity: must be between 1 and 100000, got 0")
        #expect(problems("table:\n  expiry: 500ms\n")
                == "/etc/baton/baton.yaml:2: table.expiry: must be at least 1s, got 500ms")
        #expect(problems("radio:\n  company-id: 0x10000\n")
                == "/etc/baton/baton.yaml:2: radio.company-id: must be between 0x0000 and 0xFFFF, got 0x10000")
        #expect(problems("radio:\n  company-id: 0x004C\n")
                == "/etc/baton/baton.yaml:2: radio.company-id: 0x004C is Apple's company id (read as Continuity frames): pick another, got 0x004C")
        #expect(problems("broker:\n  reconnect-min: 10s\n  reconnect-max: 5s\n")
                == "/etc/baton/baton.yaml:3: broker.reconnect-max: must not be less than broker.reconnect-min (10s), got 5s")
        #expect(problems("broker:\n  reconnect-min: 1m\n")
                == "/etc/baton/baton.yaml:2: broker.reconnect-min: must not be more than broker.reconnect-max (30s), got 1m")
    }

    @Test func aValueOutsideItsChoices() {
        #expect(problems("log:\n  level: verbose\n")
                == #"/etc/baton/baton.yaml:2: log.level: expected trace, debug, info, notice, warning, error or critical, got "verbose""#)
        #expect(problems("apple:\n  tracking: some\n")
                == #"/etc/baton/baton.yaml:2: apple.tracking: expected off, handoff or all, got "some""#)
        #expect(problems("broker:\n  protocol: 4\n")
                == #"/etc/baton/baton.yaml:2: broker.protocol: expected auto, 5 or 3.1.1, got "4""#)
    }

    @Test func aBadBrokerURLSaysWhatToWrite() {
        // The reason is BatonMQTT's own (docs/broker.md); the config adds where it was.
        for url in ["http://pi.lan", "pi.lan", "mqtt://pi.lan:99999"] {
            let text = problems("broker:\n  url: \(url)\n")
            #expect(text == "/etc/baton/baton.yaml:2: broker.url: " + urlReason(url))
            #expect(text?.contains(url) == true, "the message quotes what was written")
        }
    }

    /// docs/config.md "broker": the nodes of one broker as a YAML list, a flow list or one
    /// comma-separated line; one URL is still one node.
    @Test func brokerURLTakesTheNodesOfACluster() throws {
        let nodes = [MQTTNode(host: "node-a", port: 1883), MQTTNode(host: "node-b", port: 1883), MQTTNode(host: "node-c", port: 1884)]
        #expect(try parse("broker:\n  url:\n    - mqtt://node-a:1883\n    - mqtt://node-b\n    - mqtt://node-c:1884\n").broker.nodes == nodes)
        #expect(try parse("broker:\n  url: [mqtt://node-a, mqtt://node-b, mqtt://node-c:1884]\n").broker.nodes == nodes)
        #expect(try parse("broker:\n  url: mqtt://node-a,mqtt://node-b, mqtt://node-c:1884\n").broker.nodes == nodes)
        #expect(try parse("broker:\n  url: mqtt://pi.lan\n").broker.nodes == [MQTTNode(host: "pi.lan", port: 1883)])
        #expect(try parse("").broker.nodes == [MQTTNode(host: "127.0.0.1", port: 1883)])
        let tls = try parse("broker:\n  url: [mqtts://node-a, mqtts://node-b]\n  tls:\n    insecure: true\n")
        #expect(tls.broker.tls == MQTTTLS(insecure: true))
        #expect(tls.broker.nodes.map(\.port) == [8883, 8883])
    }

    @Test func aBadListOfNodesIsNamedAtItsLine() {
        #expect(problems("broker:\n  url: []\n")
                == "/etc/baton/baton.yaml:2: broker.url: expected at least one broker URL, like mqtt://host:1883; an empty list names no broker")
        #expect(problems("broker:\n  url:\n    - mqtt://node-a\n    - node-b.lan\n    - mqtts://node-c\n    - mqtt://node-a:1883\n") == """
            /etc/baton/baton.yaml:4: broker.url: \(urlReason("node-b.lan"))
            /etc/baton/baton.yaml:5: broker.url: every node takes the same scheme (one set of TLS settings serves them all): mqtt://node-a:1883 is mqtt://, mqtts://node-c:8883 is mqtts://
            /etc/baton/baton.yaml:6: broker.url: mqtt://node-a:1883 is listed twice
            """)
        #expect(problems("broker:\n  url: mqtt://node-a,,mqtt://node-b\n")
                == #"/etc/baton/baton.yaml:2: broker.url: an empty entry in the list "mqtt://node-a,,mqtt://node-b": separate the nodes' URLs with one comma each, like mqtt://node-a:1883,mqtt://node-b:1883"#)
        #expect(problems("broker:\n  url:\n    - url: mqtt://node-a\n")?.hasPrefix("/etc/baton/baton.yaml:3: broker.url: expected a broker URL like mqtt://host:1883, got ") == true)
        #expect(problems("broker:\n  url: [mqtt://a, mqtt://b]\n  tls:\n    insecure: true\n")
                == "/etc/baton/baton.yaml:3: broker.tls: TLS settings need an mqtts:// broker.url, and it is the list mqtt://a:1883, …")
    }

    @Test func maxQoSIsZeroOrOne() {
        #expect(problems("broker:\n  max-qos: 2\n") == "/etc/baton/baton.yaml:2: broker.max-qos: must be between 0 and 1, got 2")
        #expect(problems("broker:\n  max-qos: none\n") == #"/etc/baton/baton.yaml:2: broker.max-qos: expected a whole number, got "none""#)
    }

    @Test func theBrokerFlagTakesTheNodesOfACluster() throws {
        var c = try parse("broker:\n  url: mqtt://pi.lan\n")
        try c.apply(GatewayOverrides(broker: "mqtt://127.0.0.1:4001,mqtt://127.0.0.1:4002"))
        #expect(c.broker.nodes == [MQTTNode(host: "127.0.0.1", port: 4001), MQTTNode(host: "127.0.0.1", port: 4002)])
        let error = try #require(throws: ConfigError.self) { try c.apply(GatewayOverrides(broker: "mqtt://a,")) }
        #expect(error.description == #"command line: --broker: an empty entry in the list "mqtt://a,": separate the nodes' URLs with one comma each, like mqtt://node-a:1883,mqtt://node-b:1883"#)
    }

    @Test func aBadGatewayIDOrRoom() {
        #expect(problems("gateway:\n  id: Kitchen Pi\n")
                == #"/etc/baton/baton.yaml:2: gateway.id: use only a-z, 0-9, _ and - (the id is part of MQTT topics and Home Assistant's device id), got "Kitchen Pi""#)
        #expect(problems("gateway:\n  id: \(String(repeating: "a", count: 65))\n")
                == "/etc/baton/baton.yaml:2: gateway.id: must be at most 64 characters, got 65")
        #expect(problems("gateway:\n  room: \"\"\n")
                == "/etc/baton/baton.yaml:2: gateway.room: must not be empty")
        #expect(problems("gateway:\n  room: \"Hall\\nway\"\n")
                == #"/etc/baton/baton.yaml:2: gateway.room: must not contain control characters (line breaks, tabs), got "Hall\nway""#)
    }

    @Test func aBadRadioSource() {
        #expect(problems("radio:\n  source: hco0\n")
                == #"/etc/baton/baton.yaml:2: radio.source: expected an adapter like hci0, or h4:/dev/ttyACM0, capture:FILE or sim:SOCKET, got "hco0""#)
        #expect(problems("radio:\n  source: /dev/ttyACM0\n")
                == #"/etc/baton/baton.yaml:2: radio.source: expected an adapter like hci0, or h4:/dev/ttyACM0, capture:FILE or sim:SOCKET, got "/dev/ttyACM0" (a path needs its kind in front: h4:, capture: or sim:)"#)
        #expect(problems("radio:\n  source: \"h4:\"\n")
                == "/etc/baton/baton.yaml:2: radio.source: h4: needs the controller's serial device, like h4:/dev/ttyACM0")
    }

    @Test func aBadTopicPrefix() {
        #expect(problems("topics:\n  prefix: home/#\n")
                == #"/etc/baton/baton.yaml:2: topics.prefix: must not contain the MQTT wildcards + or # (MQTT 5.0 §4.7.1), got "home/#""#)
        #expect(problems("topics:\n  discovery-prefix: +/ha\n")
                == #"/etc/baton/baton.yaml:2: topics.discovery-prefix: must not contain the MQTT wildcards + or # (MQTT 5.0 §4.7.1), got "+/ha""#)
        #expect(problems("topics:\n  prefix: /baton\n")
                == #"/etc/baton/baton.yaml:2: topics.prefix: must not start or end with "/", got "/baton""#)
        #expect(problems("topics:\n  prefix: home//baton\n")
                == #"/etc/baton/baton.yaml:2: topics.prefix: must not contain an empty topic level ("//"), got "home//baton""#)
        #expect(problems("topics:\n  prefix: $SYS/baton\n")
                == #"/etc/baton/baton.yaml:2: topics.prefix: must not start with "$" (such topics are the broker's own, MQTT 5.0 §4.7.2), got "$SYS/baton""#)
        #expect(problems("topics:\n  prefix: \"\"\n")
                == "/etc/baton/baton.yaml:2: topics.prefix: must not be empty")
    }

    @Test func aClientCertificateWithoutItsKey() throws {
        let dir = try Scratch()
        try dir.write("kitchen.crt", "CERT\n")
        try dir.write("kitchen.key", "KEY\n")
        #expect(problems("broker:\n  url: mqtts://pi.lan\n  tls:\n    cert-file: kitchen.crt\n", file: dir.path + "/baton.yaml")
                == "\(dir.path)/baton.yaml:4: broker.tls.cert-file: a client certificate needs its private key: set broker.tls.key-file too")
        #expect(problems("broker:\n  url: mqtts://pi.lan\n  tls:\n    key-file: kitchen.key\n", file: dir.path + "/baton.yaml")
                == "\(dir.path)/baton.yaml:4: broker.tls.key-file: a private key needs its client certificate: set broker.tls.cert-file too")
    }

    @Test func aTLSFileThatCannotBeRead() throws {
        #expect(problems("broker:\n  url: mqtts://pi.lan\n  tls:\n    ca-file: /nonexistent/baton/ca.crt\n")
                == #"/etc/baton/baton.yaml:4: broker.tls.ca-file: cannot read "/nonexistent/baton/ca.crt": No such file or directory"#)
        let dir = try Scratch()
        #expect(problems("broker:\n  url: mqtts://pi.lan\n  tls:\n    ca-file: .\n", file: dir.path + "/baton.yaml")
                == "\(dir.path)/baton.yaml:4: broker.tls.ca-file: cannot read \"\(dir.path)/.\": it is a directory")
    }

    @Test func tlsSettingsWithAPlainURL() {
        #expect(problems("broker:\n  url: mqtt://pi.lan\n  tls:\n    insecure: true\n")
                == #"/etc/baton/baton.yaml:3: broker.tls: TLS settings need an mqtts:// broker.url, and it is "mqtt://pi.lan""#)
        #expect(problems("broker:\n  tls:\n    insecure: true\n")
                == "/etc/baton/baton.yaml:2: broker.tls: TLS settings need an mqtts:// broker.url, and it is the default, mqtt://127.0.0.1:1883")
        #expect(problems("broker:\n  url: mqtt://pi.lan\n  tls:\n    ca-file: /nonexistent/baton/ca.crt\n") == """
            /etc/baton/baton.yaml:3: broker.tls: TLS settings need an mqtts:// broker.url, and it is "mqtt://pi.lan"
            /etc/baton/baton.yaml:4: broker.tls.ca-file: cannot read "/nonexistent/baton/ca.crt": No such file or directory
            """)
        // `insecure: false` is the default, with any URL.
        #expect(problems("broker:\n  url: mqtt://pi.lan\n  tls:\n    insecure: false\n") == nil)
    }

    @Test func aMissingPasswordFile() {
        #expect(problems("broker:\n  username: baton\n  password-file: /nonexistent/baton/mqtt-password\n")
                == #"/etc/baton/baton.yaml:3: broker.password-file: cannot read "/nonexistent/baton/mqtt-password": No such file or directory"#)
    }

    @Test func anEmptyPasswordFile() throws {
        let dir = try Scratch()
        try dir.write("mqtt-password", "\n")
        #expect(problems("broker:\n  password-file: mqtt-password\n", file: dir.path + "/baton.yaml")
                == "\(dir.path)/baton.yaml:2: broker.password-file: \"\(dir.path)/mqtt-password\" has an empty first line: write the password on it")
    }

    @Test func aPasswordAndAPasswordFile() {
        #expect(problems("broker:\n  password: secret\n  password-file: /etc/baton/mqtt-password\n")
                == "/etc/baton/baton.yaml:3: broker.password-file: give broker.password or broker.password-file, not both")
    }

    /// docs/config.md "apple.irks": the user's names, each with an IRK in either form.
    @Test func namedDevicesTakeAnIRKInHexOrKeychainBase64() throws {
        let hex = "ec0234a357c8ad05341010a60a397d9b"
        // The same key as macOS Keychain stores it: least significant byte first, base64.
        let keychain = "m305CqYQEDQFrchXozQC7A=="
        let c = try parse("apple:\n  irks:\n    \"Anna's iPhone\": irk:\(hex.uppercased())\n    Ben: \"Dw4NDAsKCQgHBgUEAwIBAA==\"\n")
        #expect(c.appleIRKs.map(\.name) == ["Anna's iPhone", "Ben"])
        #expect(c.appleIRKs.map(\.irk.bytes) == [hx(hex), Array(0..<16)])
        #expect(problems("apple:\n  irks:\n    Anna: \(hex)\n    Ben: \"\(keychain)\"\n")
                == #"/etc/baton/baton.yaml:4: apple.irks.Ben: the same IRK as "Anna": one device, one name"#,
                "the Keychain form is the same key reversed")
        #expect(problems("apple:\n  irks:\n    Anna: \(hex.dropLast(2))\n")
                == "/etc/baton/baton.yaml:3: apple.irks.Anna: an IRK is 16 bytes, this is 15")
        #expect(problems("apple:\n  irks:\n    Anna: my-phone\n")?.contains("expected an IRK as 32 hex digits") == true)
        #expect(problems("apple:\n  irks:\n    Anna: \(hex)\n    Anna: \(hex)\n")?.contains("given twice") == true)
        #expect(problems("apple:\n  irks: \(hex)\n")?.contains("expected one \"name: IRK\" line per device") == true)
        let many = (0..<65).map { String(format: "    d%d: %032x\n", $0, $0 + 1) }.joined()
        #expect(problems("apple:\n  irks:\n" + many)?.contains("at most 64 devices, got 65") == true)
        #expect(try parse("apple:\n  irks:\n" + many.split(separator: "\n").dropLast().joined(separator: "\n") + "\n")
                    .appleIRKs.count == 64)
        #expect(!(problems("apple:\n  irks:\n    Anna: \(hex.dropLast(2))\n") ?? "").contains(hex.dropLast(2)),
                "the key is printed back")
        #expect(problems("apple:\n  tracking: off\n  irks:\n    Anna: \(hex)\n")?.contains("apple.irks: apple.tracking is off") == true)
    }

    /// docs/config.md "broker.tls": a pre-shared key instead of certificates, never both.
    @Test func aPreSharedKeyNeedsItsIdentityAndNoCertificates() throws {
        let dir = try Scratch()
        try dir.write("hall.psk", "00112233445566778899AABBCCDDEEFF\n")
        let url = "broker:\n  url: mqtts://broker\n  tls:\n"
        let c = try parse(url + "    psk-identity: hall\n    psk-file: hall.psk\n", file: dir.path + "/baton.yaml")
        #expect(c.broker.tls?.psk == MQTTPSK(identity: "hall", hexKey: "00112233445566778899AABBCCDDEEFF"))
        #expect(try parse(url + "    psk-identity: hall\n    psk: abcd\n").broker.tls?.psk?.hexKey == "abcd")
        #expect(problems(url + "    psk: abcd\n")
                == "/etc/baton/baton.yaml:4: broker.tls.psk: a pre-shared key needs its identity: set broker.tls.psk-identity too")
        #expect(problems(url + "    psk-identity: hall\n")
                == "/etc/baton/baton.yaml:4: broker.tls.psk-identity: an identity needs its pre-shared key: set broker.tls.psk or broker.tls.psk-file too")
        let odd = problems(url + "    psk-identity: hall\n    psk: s3cretkey\n")
        #expect(odd == "/etc/baton/baton.yaml:5: broker.tls.psk: expected 2 to 128 hex digits, an even number of them (the key is not shown)")
        #expect(problems(url + "    psk-identity: hall\n    psk: abcd\n    ca-file: /etc/ssl/certs/ca-certificates.crt\n")?
                    .contains("TLS-PSK and certificates do not go together") == true)
        #expect(problems(url + "    psk-identity: hall\n    psk: abcd\n    psk-file: hall.psk\n")?
                    .contains("give broker.tls.psk or broker.tls.psk-file, not both") == true)
        #expect(problems("broker:\n  url: mqtt://broker\n  tls:\n    psk-identity: hall\n    psk: abcd\n")?
                    .contains("TLS settings need an mqtts:// broker.url") == true)
        #expect(problems(url + "    psk-identity: \"\"\n    psk: abcd\n")?
                    .contains("broker.tls.psk-identity: expected the identity the broker's psk_file lists") == true)
    }

    /// docs/config.md "security": the key is checked whole at start, with its line.
    @Test func theBeaconKeyIsReadInlineOrFromAFileAndCheckedWhole() throws {
        let dir = try Scratch()
        let key = BeaconKey(bytes: Array(0x10..<0x20))
        try dir.write("beacon.key", "\(key.text)\n# the hall's copy\n")
        let inline = try parse("security:\n  beacon-key: \(key.text)\n  identities: 1024\n  unkeyed: IGNORE\n")
        #expect(inline.security.beaconKey == key && inline.security.identities == 1024 && inline.security.unkeyed == .ignore)
        let fromFile = try parse("security:\n  beacon-key-file: beacon.key\n", file: dir.path + "/baton.yaml")
        #expect(fromFile.security.beaconKey == key && fromFile.security.identities == 16 && fromFile.security.unkeyed == .publish)
        #expect(try parse("").security.beaconKey == nil)

        // One character mistyped: the checksum names it, and the key is not shown back.
        var typo = Array(key.text)
        typo[20] = typo[20] == "A" ? "B" : "A"
        let problem = problems("security:\n  beacon-key: \(String(typo))\n")
        #expect(problem?.hasPrefix("/etc/baton/baton.yaml:2: security.beacon-key: ") == true, "\(problem ?? "")")
        #expect(problem?.contains(String(typo)) == false, "the key is printed: \(problem ?? "")")
        #expect(problems("security:\n  beacon-key: BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL\n")?.contains("security.beacon-key") == true,
                "a group secret where the beacon key goes is refused")
        #expect(problems("security:\n  beacon-key: \(key.text)\n  beacon-key-file: beacon.key\n")
                == "/etc/baton/baton.yaml:3: security.beacon-key-file: give security.beacon-key or security.beacon-key-file, not both")
        #expect(problems("security:\n  identities: 1025\n")?.contains("security.identities: must be between 0 and 1024") == true)
        #expect(problems("security:\n  unkeyed: drop\n")?.contains("security.unkeyed: expected") == true)
        #expect(problems("security:\n  beacon-key-file: /nonexistent/beacon.key\n")?.hasPrefix("/etc/baton/baton.yaml:2: security.beacon-key-file: ") == true)
    }

    /// docs/config.md "relay", docs/relay.md §9: re-advertising tags with the group's key, so
    /// it is refused without one, with its line.
    @Test func reAdvertisingNeedsTheBeaconKey() throws {
        let key = BeaconKey(bytes: Array(0x10..<0x20))
        #expect(try parse("").readvertise == 0)
        #expect(try parse("relay:\n  readvertise: 4\nsecurity:\n  beacon-key: \(key.text)\n").readvertise == 4)
        #expect(problems("relay:\n  readvertise: 2\n")
                == "/etc/baton/baton.yaml:2: relay.readvertise: re-advertising needs the group's beacon key: set security.beacon-key (or beacon-key-file) too")
        #expect(try parse("relay:\n  readvertise: 0\n").readvertise == 0, "0 (off) needs no key")
        #expect(problems("relay:\n  readvertise: 17\nsecurity:\n  beacon-key: \(key.text)\n")?
                    .contains("relay.readvertise: must be between 0 and 16") == true)
    }

    @Test func aYAMLSyntaxErrorNamesItsLine() {
        #expect(problems("broker:\n  url: mqtt://pi.lan\n keepalive: 30s\n")
                == "/etc/baton/baton.yaml:3: YAML syntax: did not find expected key (while parsing a block mapping on line 1)")
        #expect(problems("broker:\n\turl: mqtt://pi.lan\n")
                == "/etc/baton/baton.yaml:2: YAML syntax: found character that cannot start any token (while scanning for the next token on line 2); indent with spaces, YAML does not allow tabs")
        #expect(problems("gateway:\n  room: \"Kitchen\n")
                == "/etc/baton/baton.yaml:3: YAML syntax: found unexpected end of stream (while scanning a quoted scalar on line 2)")
    }

    @Test func everyProblemIsReportedInFileOrder() throws {
        let yaml = "broker:\n  keepalive: thirty\ntable:\n  capacity: 0\nbrokr: {}\n"
        let error = try #require(throws: ConfigError.self) { try parse(yaml) }
        #expect(error.all.map(\.line) == [2, 4, 5])
        #expect(error.others.count == 2)
        #expect(error.description == """
            /etc/baton/baton.yaml:2: broker.keepalive: expected a duration like 30s or 500ms, got "thirty"
            /etc/baton/baton.yaml:4: table.capacity: must be between 1 and 100000, got 0
            /etc/baton/baton.yaml:5: unknown key "brokr" (did you mean "broker"?)
            """)
    }

    @Test func aFileThatCannotBeRead() throws {
        let dir = try Scratch()
        let absent = dir.path + "/absent.yaml"
        #expect(throws: ConfigError(file: absent, line: nil, key: "",
                                    message: "cannot read the config file: No such file or directory")) {
            try GatewayConfig.load(file: absent, hostName: host)
        }
        #expect(throws: ConfigError(file: dir.path, line: nil, key: "", message: "cannot read the config file: it is a directory")) {
            try GatewayConfig.load(file: dir.path, hostName: host)
        }
        let latin1 = try dir.write("latin1.yaml", Array("gateway:\n  room: K".utf8) + [0xFC] + Array("che\n".utf8))
        let error = try #require(throws: ConfigError.self) { try GatewayConfig.load(file: latin1, hostName: host) }
        #expect(error.description == "\(latin1):2: not UTF-8 text (save the file as UTF-8)")
    }
}

// MARK: - Nesting and tags (issue 16)

/// `depth` lists inside each other, flow style, on one line: `[[[…]]]`.
private func flowLists(_ depth: Int) -> String {
    String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
}

/// `depth` sections inside each other, block style: `a:` indented under `a:`, one per line,
/// the innermost holding `a: 1`. Section n starts on line n.
private func blockSections(_ depth: Int) -> String {
    (0..<depth).map { String(repeating: "  ", count: $0) + "a:" + ($0 == depth - 1 ? " 1" : "") + "\n" }.joined()
}

private let tooDeep = "YAML nesting deeper than 64 levels (lists and sections inside each other): is it the right file?"

@Suite struct ConfigNestingTests {
    /// The issue's file: Yams recursed once per `[` and the gateway died of SIGSEGV.
    @Test func aFileNestedFiveThousandDeepIsRefusedWithItsLine() throws {
        let dir = try Scratch()
        let file = try dir.write("n.yaml", String(repeating: "[", count: 5000) + "\n")
        let error = try #require(throws: ConfigError.self) { try GatewayConfig.load(file: file, hostName: host) }
        #expect(error.description == "\(file):1: \(tooDeep)")
    }

    @Test func theGatewayExitsTwoOnIt() throws {
        let dir = try Scratch()
        let file = try dir.write("n.yaml", String(repeating: "[", count: 5000) + "\n")
        let gateway = Process()
        gateway.executableURL = batonBinary
        gateway.arguments = ["gateway", "--config", file]
        let stderr = Pipe()
        gateway.standardError = stderr
        gateway.standardOutput = FileHandle.nullDevice
        try gateway.run()
        let said = stderr.fileHandleForReading.readDataToEndOfFile()
        gateway.waitUntilExit()
        #expect(gateway.terminationReason == .exit, "killed by signal \(gateway.terminationStatus)")
        #expect(gateway.terminationStatus == 2)
        #expect(String(decoding: said, as: UTF8.self) == "baton gateway: \(file):1: \(tooDeep)\n")
    }

    @Test func sectionsNestedPastTheCapAreRefusedWhereTheyPassIt() {
        #expect(problems(blockSections(65)) == "\(etc):65: \(tooDeep)")
        #expect(problems(blockSections(3000)) == "\(etc):65: \(tooDeep)")
        let flowSections = String(repeating: "{a: ", count: 65) + "1" + String(repeating: "}", count: 65) + "\n"
        #expect(problems(flowSections) == "\(etc):1: \(tooDeep)")
        #expect(problems("gateway:\n  room: Kitchen\nbroker:\n  tls: " + flowLists(65) + "\n") == "\(etc):4: \(tooDeep)")
    }

    /// 64 levels pass the check and reach the schema, which refuses them for what they are.
    @Test func nestingUpToTheCapIsReadOn() {
        #expect(problems(flowLists(64) + "\n")
                == #"/etc/baton/baton.yaml:1: expected sections like "broker:" at the top of the file, got a list"#)
        #expect(problems(flowLists(65) + "\n") == "\(etc):1: \(tooDeep)")
        #expect(problems(blockSections(64))?.hasPrefix(#"/etc/baton/baton.yaml:1: unknown key "a""#) == true)
        // The deepest real setting, a TLS file 3 levels down, is far inside.
        #expect(problems("broker:\n  tls:\n    insecure: \(flowLists(61))\n")
                == "/etc/baton/baton.yaml:3: broker.tls.insecure: expected true or false, got a list")
    }

    /// An alias puts the anchored node where it stands (as Yams did), so the nesting it builds is the
    /// alias's depth plus the anchored node's height: 1 + 23 + 40 = 64 passes, one more does not.
    @Test func anAliasCountsAsTheNestingItStandsFor() {
        let anchored = "x: &deep " + flowLists(40) + "\n"
        func alias(inside lists: Int) -> String {
            anchored + "y: " + String(repeating: "[", count: lists) + "*deep" + String(repeating: "]", count: lists) + "\n"
        }
        #expect(problems(alias(inside: 23))?.hasPrefix(#"/etc/baton/baton.yaml:1: unknown key "x""#) == true)
        #expect(problems(alias(inside: 24)) == "\(etc):2: YAML nesting deeper than 64 levels through the alias *deep "
                + "(lists and sections inside each other): is it the right file?")
    }

    @Test func aYAMLTagIsRefusedWithItsLine() {
        #expect(problems("status:\n  interval: !!int 5s\n")
                == "\(etc):2: YAML tag !!int is not allowed: remove it, each key already says how its value is read")
        #expect(problems("gateway: !section\n  room: Kitchen\n")
                == "\(etc):1: YAML tag !section is not allowed: remove it, each key already says how its value is read")
        // Reported with the schema's problems, in file order.
        #expect(problems("table:\n  capacity: 0\nlog:\n  level: !!str info\n") == """
            /etc/baton/baton.yaml:2: table.capacity: must be between 1 and 100000, got 0
            /etc/baton/baton.yaml:4: YAML tag !!str is not allowed: remove it, each key already says how its value is read
            """)
    }

    @Test func aNumberWrittenWithAPlusIsRefused() throws {
        #expect(problems("table:\n  capacity: +5\n")
                == #"/etc/baton/baton.yaml:2: table.capacity: expected a whole number, got "+5" (write it without the +)"#)
        #expect(problems("radio:\n  company-id: +0xFFFF\n")
                == #"/etc/baton/baton.yaml:2: radio.company-id: expected a number like 0xFFFF, got "+0xFFFF" (write it without the +)"#)
        #expect(problems("status:\n  interval: +5s\n")
                == #"/etc/baton/baton.yaml:2: status.interval: expected a duration like 30s or 500ms, got "+5s" (write it without the +)"#)
        #expect(try parse("table:\n  capacity: 5\n").table.capacity == 5)
    }
}

// MARK: - Flags over the file

@Suite struct ConfigOverrideTests {
    @Test func flagsOverrideTheFile() throws {
        var c = try parse("gateway:\n  id: kitchen\nbroker:\n  url: mqtts://broker.lan\ntopics:\n  prefix: home/baton\n")
        try c.apply(GatewayOverrides(broker: "mqtt://10.0.0.2:1884", radio: "sim:/run/baton/sim.sock", room: "Küche",
                                     id: "kitchen-2", prefix: "lab/baton"))
        #expect(c.gatewayID == "kitchen-2")
        #expect(c.room == "Küche")
        #expect(c.broker.clientID == "baton-kitchen-2")
        #expect(c.broker.host == "10.0.0.2")
        #expect(c.broker.port == 1884)
        #expect(c.broker.tls == nil)
        #expect(c.radio == .simulator(socket: "/run/baton/sim.sock"))
        #expect(c.prefix == "lab/baton")
    }

    @Test func theIDFlagCarriesOnlyDefaultsWithIt() throws {
        var followed = try parse("gateway:\n  id: kitchen\n")
        try followed.apply(GatewayOverrides(id: "hall"))
        #expect(followed.room == "hall")
        #expect(followed.broker.clientID == "baton-hall")

        var set = try parse("gateway:\n  id: kitchen\n  room: Kitchen\nbroker:\n  client-id: pi-7\n")
        try set.apply(GatewayOverrides(id: "hall"))
        #expect(set.gatewayID == "hall")
        #expect(set.room == "Kitchen")
        #expect(set.broker.clientID == "pi-7")
    }

    @Test func theBrokerFlagKeepsTheFilesTLSSettingsForMQTTS() throws {
        let dir = try Scratch()
        try dir.write("ca.crt", "CA\n")
        let file = dir.path + "/baton.yaml"
        var c = try parse("broker:\n  url: mqtts://broker.lan\n  tls:\n    ca-file: ca.crt\n", file: file)
        try c.apply(GatewayOverrides(broker: "mqtts://other.lan"))
        #expect(c.broker.tls == MQTTTLS(caFile: dir.path + "/ca.crt"))
        #expect(c.broker.port == 8883)
        var plain = try parse("")
        try plain.apply(GatewayOverrides(broker: "mqtts://broker.lan"))
        #expect(plain.broker.tls == MQTTTLS())
    }

    @Test func badFlagsAreNamedAndChangeNothing() throws {
        let before = try parse("gateway:\n  id: kitchen\n")
        var c = before
        let error = try #require(throws: ConfigError.self) {
            try c.apply(GatewayOverrides(broker: "broker.lan", radio: "bluetooth", room: "", id: "Kitchen", prefix: "baton/+"))
        }
        #expect(error.description == """
            command line: --id: use only a-z, 0-9, _ and - (the id is part of MQTT topics and Home Assistant's device id), got "Kitchen"
            command line: --room: must not be empty
            command line: --broker: \(urlReason("broker.lan"))
            command line: --radio: expected an adapter like hci0, or h4:/dev/ttyACM0, capture:FILE or sim:SOCKET, got "bluetooth"
            command line: --prefix: must not contain the MQTT wildcards + or # (MQTT 5.0 §4.7.1), got "baton/+"
            """)
        #expect(error.key == "--id")
        #expect(error.file == "command line")
        #expect(c == before)
    }
}

// MARK: - Radio source text

@Suite struct RadioSourceSpecTests {
    @Test(arguments: [
        ("hci0", RadioSourceSpec.adapter("hci0")),
        ("hci12", .adapter("hci12")),
        ("h4:/dev/ttyACM0", .h4(path: "/dev/ttyACM0")),
        ("capture:room.btsnoop", .capture(path: "room.btsnoop")),
        ("sim:/run/baton/sim.sock", .simulator(socket: "/run/baton/sim.sock")),
    ])
    func parsesAndPrintsBack(text: String, spec: RadioSourceSpec) throws {
        #expect(try RadioSourceSpec(parsing: text) == spec)
        #expect(spec.description == text)
    }

    @Test(arguments: ["", "hci", "hci-1", "hci65536", "hciX", "usb0", "h4:", "capture:", "sim:"])
    func refuses(text: String) {
        #expect(throws: ConfigValueError.self) { try RadioSourceSpec(parsing: text) }
    }
}
