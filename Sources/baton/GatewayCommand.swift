import ArgumentParser
import BatonGateway

struct GatewayCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gateway",
        abstract: "Run the room's gateway: hear activity beacons, publish current activities to MQTT.",
        discussion: "Settings come from --config (docs/config.md); the flags override the file. Stops cleanly on SIGTERM or Ctrl-C.")

    @Option(name: .long, help: "The YAML config file (docs/config.md); default /etc/baton/baton.yaml when it exists.")
    var config: String?

    @Option(name: .long, help: "Broker URL: mqtt://host[:port] or mqtts://host[:port]; a cluster's nodes as URL,URL,… (tried in order).")
    var broker: String?
    @Option(name: .long, help: "Radio source: hci0, h4:/dev/ttyACM0, capture:FILE or sim:SOCKET.")
    var radio: String?
    @Option(name: .long, help: "The room's name, as users see it.")
    var room: String?
    @Option(name: .long, help: "The gateway's id in topics and in Home Assistant.")
    var id: String?
    @Option(name: .long, help: "MQTT topic prefix.")
    var prefix: String?

    func run() throws {
        // The firmware reads the same flags with getopt_long; from here on it is one implementation.
        let status = GatewayMain.run(GatewayOptions(config: config, broker: broker, radio: radio, room: room, id: id, prefix: prefix))
        if status != 0 { throw ExitCode(status) }
    }
}
