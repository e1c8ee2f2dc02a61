// A gateway started in the test's process as `GatewayLauncher` starts one, with the room's
// controller the simulator's over H4, for the tests that turn its loop themselves.
import BatonLibc
@testable import BatonGateway
import BatonHCI
import BatonMQTT
import BatonProxy
import BatonSim
import BatonTestSupport
import CBlueZ  // its shim includes <sys/socket.h>: the socket types have one owner
import Glibc
import Testing

/// The hall's config as `baton gateway --broker … --radio sim:… --room Hall --id hall` makes it
/// on `broker`'s port, its links to devices `relayLink` (none unless a test gives one).
func hallConfig(_ broker: MosquittoBroker, relayLink: RelayLinkSpec = .none) throws -> GatewayConfig {
    var config = GatewayConfig.defaults(hostName: "hall")
    try config.apply(GatewayOverrides(broker: "mqtt://127.0.0.1:\(broker.port)", radio: "sim:/run/baton/hall.sock",
                                      room: "Hall", id: "hall"))
    config.relayLink = relayLink
    return config
}

/// A gateway on `config`: the room's controller over H4 (`extended`: a Bluetooth 5 one, which
/// reports LE Extended Advertising), the broker connect and the radio started, its keys made
/// from `config`, and the ESPHome server listening when `config` has an `esphome:` section.
struct StartedGateway: ~Copyable {
    struct ServerDidNotStart: Error {}
    let room: VirtualController
    var gateway: Gateway<RadioH4>
    /// The ESPHome server's port; 0 without one.
    let port: UInt16

    init(_ config: GatewayConfig, extended: Bool = false, readvertising: (any AdvertisingController)? = nil) throws {
        var h4: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &h4) == 0)
        let room = VirtualController(fd: h4[1], extended: extended)
        var radio = try RadioH4(fd: h4[0])
        var mqtt = try MQTTClient(config: GatewayLauncher.mqttConfig(config))
        let start = Instant.now
        mqtt.start(now: start)
        try radio.start(now: start)
        let keys = try GatewayKeys.make(config)
        var proxy: ProxyServer? = nil
        var serverPort: UInt16 = 0
        if config.esphome != nil {
            guard case .started(let server) = GatewayLauncher.startProxy(config: config, log: Logger()) else {
                throw ServerDidNotStart()
            }
            serverPort = server.port
            proxy = consume server
        }
        self.room = room
        port = serverPort
        gateway = Gateway(config: config, radio: radio, mqtt: mqtt, keys: keys, readvertising: readvertising,
                          proxy: proxy, log: Logger(), environment: [:], now: start,
                          unixMicroseconds: 1_790_000_000_000_000)
    }
}
