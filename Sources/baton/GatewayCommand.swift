import ArgumentParser
import BatonGateway
import Foundation

struct GatewayCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gateway",
        abstract: "Run the room's gateway: hear activity beacons, publish current activities to MQTT.",
        discussion: "Settings come from --config (docs/config.md); the flags override the file. Stops cleanly on SIGTERM or Ctrl-C.")

    @Option(name: .long, help: "The YAML config file (docs/config.md); default /etc/baton/baton.yaml when it exists.")
    var config: String?

    static let defaultConfig = "/etc/baton/baton.yaml"
    @Option(name: .long, help: "Broker URL: mqtt://host[:port] or mqtts://host[:port].")
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
        let host = ProcessInfo.processInfo.hostName
        var settings: GatewayConfig
        do throws(ConfigError) {
            // An explicit --config must exist; the default file is read only when present.
            let path = config ?? (FileManager.default.fileExists(atPath: Self.defaultConfig) ? Self.defaultConfig : nil)
            settings = try path.map { path throws(ConfigError) in try GatewayConfig.load(file: path, hostName: host) }
                ?? GatewayConfig.defaults(hostName: host)
            try settings.apply(GatewayOverrides(broker: broker, radio: radio, room: room, id: id, prefix: prefix))
        } catch {
            FileHandle.standardError.write(Data("baton gateway: \(error)\n".utf8))
            throw ExitCode(2)
        }
        let log = Logger(level: Logger.Level(rawValue: settings.logLevel) ?? .info)
        let status = GatewayLauncher.run(config: settings, log: log)
        if status != 0 { throw ExitCode(status) }
    }
}
