// `baton gateway`, from its arguments to its exit status: one implementation for the firmware
// (arguments through libc's getopt_long, docs/firmware.md) and the full toolbox (ArgumentParser
// reads the same flags and hands them here). Exit status: 0 after a stop, 1 when the radio or
// the broker cannot work (the log says why), 2 for a config or usage error (said on stderr).
import BatonLibc
import BatonYAML
import CLibc

/// The flags of `baton gateway`; each overrides its key in the config file (docs/config.md).
public struct GatewayOptions: Sendable, Equatable {
    public var config: String?
    public var broker: String?
    public var radio: String?
    public var room: String?
    public var id: String?
    public var prefix: String?

    public init(config: String? = nil, broker: String? = nil, radio: String? = nil, room: String? = nil,
                id: String? = nil, prefix: String? = nil) {
        self.config = config; self.broker = broker; self.radio = radio
        self.room = room; self.id = id; self.prefix = prefix
    }
}

public enum GatewayMain {
    /// Read when present and no --config is given; board/baton.service relies on it.
    public static let defaultConfig = "/etc/baton/baton.yaml"

    /// The flags with their help, in the order `--help` lists them.
    public static let flags: [(name: String, value: String, help: String)] = [
        ("config", "FILE", "The YAML config file (docs/config.md); default /etc/baton/baton.yaml when it exists."),
        ("broker", "URL", "Broker URL: mqtt://host[:port] or mqtts://host[:port]; a cluster's nodes as URL,URL,… (tried in order)."),
        ("radio", "SOURCE", "Radio source: hci0, h4:/dev/ttyACM0, capture:FILE or sim:SOCKET."),
        ("room", "NAME", "The room's name, as users see it."),
        ("id", "ID", "The gateway's id in topics and in Home Assistant."),
        ("prefix", "PREFIX", "MQTT topic prefix."),
    ]

    public static var usage: String {
        var text = """
            OVERVIEW: Run the room's gateway: hear activity beacons, publish current activities to MQTT.

            Settings come from --config (docs/config.md); the flags override the file. Stops cleanly on SIGTERM or Ctrl-C.

            USAGE: baton gateway [--config FILE] [--broker URL] [--radio SOURCE] [--room NAME] [--id ID] [--prefix PREFIX]

            OPTIONS:

            """
        for f in flags {
            var left = "  --\(f.name) <\(f.value.lowercased())>"
            while left.utf8.count < 26 { left += " " }
            text += left + f.help + "\n"
        }
        text += "  -h, --help                Show help information.\n"
        return text
    }

    /// Loads the config, applies the flags, and runs the gateway until it is stopped.
    public static func run(_ options: GatewayOptions) -> Int32 {
        let host = hostName()
        var settings: GatewayConfig
        do throws(ConfigError) {
            // An explicit --config must exist; the default file is read only when present.
            let path = options.config ?? (access(defaultConfig, F_OK) == 0 ? defaultConfig : nil)
            if let path {
                settings = try GatewayConfig.load(file: path, hostName: host)
            } else {
                settings = GatewayConfig.defaults(hostName: host)
            }
            try settings.apply(GatewayOverrides(broker: options.broker, radio: options.radio, room: options.room,
                                                id: options.id, prefix: options.prefix))
        } catch {
            writeStandardError("baton gateway: \(error.description)\n")
            return 2
        }
        let log = Logger(level: Logger.Level(rawValue: settings.logLevel) ?? .info)
        return GatewayLauncher.run(config: settings, log: log)
    }

    /// What getopt_long made of the arguments after `gateway`.
    public enum Parsed: Equatable {
        case run(GatewayOptions)
        case help
        /// A usage error, said already by getopt or in the text.
        case usage(String)
    }

    /// Reads the flags of `baton gateway` with getopt_long(3): `--room Hall` and `--room=Hall`
    /// alike, unambiguous prefixes (`--rad`) as GNU allows. `arguments[0]` is the command's name.
    public static func parse(_ arguments: [String]) -> Parsed {
        // getopt_long permutes and keeps pointers into argv: a C copy that outlives the loop.
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        let names: [UnsafeMutablePointer<CChar>?] = flags.map { strdup($0.name) } + [strdup("help")]
        defer {
            for p in argv { free(p) }
            for p in names { free(p) }
        }
        var table: [option] = []
        for (i, name) in names.enumerated() {
            let takesValue = i < flags.count
            table.append(option(name: name, has_arg: takesValue ? required_argument : no_argument, flag: nil,
                                val: takesValue ? Int32(1000 + i) : Int32(UInt8(ascii: "h"))))
        }
        table.append(option(name: nil, has_arg: 0, flag: nil, val: 0))
        var options = GatewayOptions()
        baton_getopt_reset()
        while true {
            let c = argv.withUnsafeMutableBufferPointer { a in
                table.withUnsafeBufferPointer { t in baton_getopt_long(Int32(arguments.count), a.baseAddress!, "h", t.baseAddress) }
            }
            if c == -1 { break }
            if c == Int32(UInt8(ascii: "h")) { return .help }
            let i = Int(c) - 1000
            guard i >= 0, i < flags.count, let value = baton_optarg().map({ String(cString: $0) }) else {
                return .usage("")  // getopt said which option, on stderr
            }
            switch flags[i].name {
            case "config": options.config = value
            case "broker": options.broker = value
            case "radio": options.radio = value
            case "room": options.room = value
            case "id": options.id = value
            default: options.prefix = value
            }
        }
        if Int(baton_optind()) < arguments.count {
            return .usage("unexpected argument '\(arguments[Int(baton_optind())])'")
        }
        return .run(options)
    }

    /// The firmware's `main`: `baton gateway [flags]`, `baton --version`, `baton --help`.
    /// Every other subcommand lives in the full toolbox.
    public static func firmware(_ arguments: [String]) -> Int32 {
        let command = arguments.count > 1 ? arguments[1] : ""
        switch command {
        case "gateway":
            switch parse(Array(arguments.dropFirst())) {
            case .run(let options):
                return run(options)
            case .help:
                writeStandardOutput(usage)
                return 0
            case .usage(let text):
                if !text.isEmpty { writeStandardError("baton gateway: \(text)\n") }
                writeStandardError("Usage: baton gateway [--config FILE] [--broker URL] [--radio SOURCE] [--room NAME] [--id ID] [--prefix PREFIX]\n  See 'baton gateway --help' for more information.\n")
                return 64
            }
        case "--version":
            writeStandardOutput(BatonVersion.current + "\n")
            return 0
        case "--help", "-h", "help":
            writeStandardOutput("""
                OVERVIEW: Carries a person's current activity across the rooms of a building.

                This is Baton's firmware build: it runs the room's gateway and nothing else.

                USAGE: baton gateway [flags]    (see 'baton gateway --help')
                       baton --version

                """)
            return 0
        case "":
            writeStandardError("baton: say which command: this firmware build runs 'baton gateway' (see 'baton --help')\n")
            return 64
        default:
            writeStandardError("baton: '\(command)' is not in this firmware build, which runs only 'baton gateway'; the full toolbox (built from source, docs/install.md) has every subcommand\n")
            return 64
        }
    }

    /// The machine's name (gethostname(2)): the default gateway id and room (docs/config.md).
    static func hostName() -> String {
        var buffer = [UInt8](repeating: 0, count: 256)
        let ok = buffer.withUnsafeMutableBytes { gethostname($0.baseAddress!.assumingMemoryBound(to: CChar.self), 255) } == 0
        guard ok, let end = buffer.firstIndex(of: 0) else { return "baton" }
        return String(decoding: buffer[..<end], as: UTF8.self)
    }
}
