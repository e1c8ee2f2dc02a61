// `baton gateway`: opens the radio the config names, connects the broker client, and runs the
// loop. The radio's concrete type is chosen here, once, so the loop is generic and direct.
import BatonWire
import BatonLibc
import BatonCore
import BatonHCI
import BatonKeys
import BatonMQTT
public import BatonProxy
import BatonRelay
import CLibc

public enum GatewayLauncher {
    /// The broker client for a gateway: its will is the status topic's `offline`.
    public static func mqttConfig(_ config: GatewayConfig) -> MQTTConfig {
        var m = config.broker
        let topics = Topics(prefix: config.prefix, discoveryPrefix: config.discoveryPrefix, gatewayID: config.gatewayID)
        m.will = MQTTWill(topic: topics.status, payload: Array("offline".utf8), qos: 1, retain: true)
        return m
    }

    /// Runs a gateway until it is stopped. Returns the process exit status: 0 after a stop,
    /// 1 when the radio or the broker settings cannot work (the log says why).
    public static func run(config: GatewayConfig, log: Logger) -> Int32 {
        let mqtt: MQTTClient
        do throws(MQTTError) { mqtt = try MQTTClient(config: mqttConfig(config)) } catch {
            log.critical("broker: \(error)")
            return 1
        }
        log.info("baton \(BatonVersion.current) gateway \(config.gatewayID) in room \(config.room): radio \(config.radio), broker \(config.broker.nodeList), prefix \(config.prefix)")
        let radioConfig = RadioConfig()
        do throws(RadioError) {
            switch config.radio {
            // A source missing at start exits with status 1 (systemd starts the unit again in
            // 5 s); one that goes away while running is opened again by the loop.
            case .adapter(let name):
                let open = { () throws(RadioError) -> RadioBlueZ in try RadioBlueZ(adapter: name, config: radioConfig) }
                return run(radio: try open(), reopen: open, mqtt: mqtt, config: config, log: log)
            case .h4(let path):
                let open = { () throws(RadioError) -> RadioH4 in
                    try RadioH4(fd: try RadioH4.openSerial(path: path), config: radioConfig)
                }
                return run(radio: try open(), reopen: open, mqtt: mqtt, config: config, log: log)
            case .simulator(let socket):
                let open = { () throws(RadioError) -> RadioH4 in try RadioH4(fd: try connectUnix(socket), config: radioConfig) }
                return run(radio: try open(), reopen: open, mqtt: mqtt, config: config, log: log)
            case .capture(let path):
                let data: [UInt8]
                do throws(Errno) { data = try readFile(path) } catch {
                    // The reason is what the user acts on: a missing file, or one the baton
                    // user may not read (a capture in a home directory, say).
                    let who = error.code == EACCES ? " (the gateway runs as \(currentUserName()))" : ""
                    log.critical("radio capture:\(path): cannot read the file: \(error.message)\(who)")
                    return 1
                }
                let pace: RadioCapture.Pace = config.pacedCapture ? .timestamps(speed: 1) : .asFastAsPossible
                let radio: RadioCapture
                do throws(RadioError) { radio = try RadioCapture(file: data, pace: pace) } catch {
                    log.critical("radio capture:\(path): not a capture Baton reads: \(error)")
                    return 1
                }
                return run(radio: radio, reopen: nil, mqtt: mqtt, config: config, log: log)
            }
        } catch {
            log.critical("radio \(config.radio): \(error)")
            return 1
        }
    }

    static func run<R: RadioSource & ~Copyable>(radio: consuming R, reopen: (() throws(RadioError) -> R)?,
                                                mqtt: consuming MQTTClient, config: GatewayConfig, log: Logger) -> Int32 {
        let keys: GatewayKeys
        do throws(CryptoError) { keys = try GatewayKeys.make(config) } catch {
            log.critical("security: cannot set up the configured keys: \(error)")
            return 1
        }
        if let verifier = keys.verifier {
            log.info("security: verifying beacons of group \(Hex.text(UInt64(verifier.groupHash), digits: 8)), \(config.security.identities) identities, other groups: \(config.security.unkeyed == .publish ? "published as unverified" : "ignored")")
        }
        if !config.appleIRKs.isEmpty {
            log.info("apple: following \(config.appleIRKs.count) named devices by IRK: \(config.appleIRKs.map({ $0.name }).joined(separator: ", "))")
        }
        var readvertising: ReadvertiseRadio?
        if config.readvertise > 0 {
            // Re-advertising goes out through the controller this gateway scans with
            // (docs/relay.md §9): a capture, a serial controller or the simulator has none.
            guard case .adapter(let adapter) = config.radio else {
                log.critical("relay.readvertise: re-advertising needs a Bluetooth adapter as radio.source (hci0), not \(config.radio)")
                return 1
            }
            do throws(ReadvertiseError) {
                // The largest receive MTU: it is also how many credits the kernel grants a
                // phone (docs/vm.md), so a phone's stream is not throttled to one SDU in flight.
                readvertising = try ReadvertiseRadio(adapter: adapter, count: config.readvertise, receiveMTU: 65_535)
            } catch {
                log.critical("relay.readvertise: \(error)")
                return 1
            }
            if let taken = readvertising?.takenBack, !taken.isEmpty {
                // A killed run's, normally; another program's otherwise (docs/relay.md §9).
                log.warning("relay.readvertise: advertising instances \(taken.map(String.init).joined(separator: ", ")) of \(adapter) were in use at start and are this gateway's now")
            }
            log.info("relay: re-advertising up to \(config.readvertise) activities of other rooms on \(adapter), PSMs \(readvertising!.psms.map { "0x" + Hex.text(UInt64($0), digits: 4) }.joined(separator: ", "))")
        }
        let proxy: ProxyServer?
        var proxyDescriptors = 0
        switch startProxy(config: config, log: log) {
        case .started(let server):
            proxyDescriptors = server.descriptorLimit + server.settings.connections
            proxy = consume server
        case .off: proxy = nil
        case .failed: return 1
        }
        guard openFilesSuffice(config: config, proxy: proxyDescriptors, log: log) else { return 1 }
        var tv = timespec()
        clock_gettime(CLOCK_REALTIME, &tv)
        var gateway = Gateway(config: config, radio: radio, reopen: reopen, mqtt: mqtt, keys: keys,
                              readvertising: readvertising, proxy: proxy, log: log,
                              environment: processEnvironment(), now: .now,
                              unixMicroseconds: Int64(tv.tv_sec) * 1_000_000 + Int64(tv.tv_nsec) / 1000)
        switch gateway.run() {
        case .stopped: return 0
        case .radioFailed: return 1
        }
    }

    /// Descriptors open beside the polled ones: stdin, stdout, stderr, libmosquitto's wake-up
    /// pair, a file being read, the notify socket, and room to spare.
    static let unpolledDescriptors = 32

    /// Raises the open-file limit to what the loop polls (`GatewayConfig.polledDescriptors`), or says
    /// which keys ask for more than the hard limit allows. systemd's soft limit of 1024 is below
    /// what `relay.links: 256` with `relay.streams: 1024` poll (docs/config.md "Relay").
    static func openFilesSuffice(config: GatewayConfig, proxy: Int, log: Logger) -> Bool {
        let needed = config.polledDescriptors(proxy: proxy) + unpolledDescriptors
        switch OpenFileLimit.ensure(needed) {
        case .enough:
            return true
        case .raised(let from, let to):
            log.info("open files: raised this process's soft limit from \(from) to \(to) for what the loop polls (relay.links \(config.relay.links), relay.streams \(config.relay.streams))")
            return true
        case .short(let hard):
            var keys = ["relay.links \(config.relay.links)", "relay.streams \(config.relay.streams)"]
            if config.readvertise > 0 { keys.append("relay.readvertise \(config.readvertise)") }
            if let esphome = config.esphome { keys.append("esphome.clients \(esphome.clients)") }
            log.critical("open files: \(keys.joined(separator: ", ")) need \(needed) open files, but this process may open at most \(hard) (RLIMIT_NOFILE): lower them, or raise LimitNOFILE= in the unit")
            return false
        case .failed(let error):
            // Nothing known is short: run, and let poll(2) say so if it is.
            log.warning("open files: \(error)")
            return true
        }
    }

    public enum ProxyStart: ~Copyable {
        case started(ProxyServer)
        case off
        case failed
    }

    /// The ESPHome API server (`esphome:`, docs/esphome.md), listening before the loop starts,
    /// and the avahi service file that announces it to Home Assistant (§7): rewritten at every
    /// start, so its `mac` and port come from the same settings as the server's. A file that
    /// cannot be written is said and the server runs anyway (Home Assistant can be given the
    /// host and port by hand); a server that cannot listen stops the start.
    public static func startProxy(config: GatewayConfig, log: Logger) -> ProxyStart {
        guard var settings = config.esphome else {
            // Off: a file left by an earlier config announces nothing now (absent is fine).
            do throws(Errno) {
                try MDNSService.write(MDNSService.emptyXML(name: config.gatewayID), to: ProxySettings.defaultServiceFile)
            } catch {}
            return .off
        }
        // Connections go over the gateway's device link (docs/esphome.md §11): without one (an
        // H4 radio, a capture) the scanner is not connectable.
        switch config.resolvedRelayLink {
        case .none, .auto:
            if settings.connections > 0 {
                log.notice("esphome: no device link (relay.link), so Home Assistant cannot connect to devices through this gateway")
            }
            settings.connections = 0
        case .bluez, .simulator:
            break
        }
        let identity = ProxyIdentity(settings: settings, gatewayID: config.gatewayID, room: config.room,
                                     version: BatonVersion.current)
        let server: ProxyServer
        do throws(ProxyStartError) {
            server = try ProxyServer(settings: settings, identity: identity, log: log)
        } catch {
            log.critical("esphome: \(error)")
            return .failed
        }
        announce(identity, port: server.port, encrypted: server.isEncrypted, file: settings.mdnsServiceFile, log: log)
        return .started(server)
    }

    static func announce(_ identity: ProxyIdentity, port: UInt16, encrypted: Bool, file: String, log: Logger) {
        guard !file.isEmpty else { return }
        let xml = MDNSService.avahiXML(name: identity.name, friendlyName: identity.friendlyName, port: port,
                                       mac: identity.compactMAC, version: ProxyIdentity.esphomeVersion, encrypted: encrypted)
        do throws(Errno) { try MDNSService.write(xml, to: file) } catch {
            log.warning("esphome: cannot write \(file) for avahi (\(error)); Home Assistant will not discover this gateway, add it by host and port \(port)")
        }
    }

    /// The simulator's virtual controller: H4 over a Unix stream socket.
    static func connectUnix(_ path: String) throws(RadioError) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .os(Errno(errno, call: "socket(AF_UNIX)")) }
        guard var unix = Syscall.unixAddress(path) else {
            close(fd)
            throw .invalidConfiguration("simulator socket path \(path) is longer than a Unix socket path may be")
        }
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, unix.length) }
        }
        if r != 0 {
            let e = errno
            close(fd)
            if e == ENOENT || e == ECONNREFUSED { throw .adapterNotFound("sim:\(path) (is `baton sim` running?)") }
            throw .os(Errno(e, call: "connect(sim socket)"))
        }
        return fd
    }
}
