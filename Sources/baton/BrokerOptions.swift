import ArgumentParser
import BatonMQTT

/// The broker options every client command shares (`baton watch`, `baton fetch`), and the
/// client they make: one spelling of the flags, one set of error texts.
struct BrokerOptions: ParsableArguments {
    @Option(name: .long, help: "Broker URL: mqtt://host[:port] or mqtts://host[:port]; a cluster's nodes as URL,URL,… (tried in order).")
    var broker: String = "mqtt://127.0.0.1:1883"
    @Option(name: .long, help: "MQTT topic prefix the gateways use.")
    var prefix: String = "baton"
    @Option(name: .long, help: "Broker user name.")
    var username: String?
    @Option(name: .long, help: "Broker password.")
    var password: String?
    @Option(name: .customLong("ca-file"), help: "The CA certificate (PEM) for an mqtts:// broker with a private CA; default: the system's CAs.")
    var caFile: String?

    /// A client for `--broker` with this client id; `ValidationError`s name the flag.
    func client(id: String, reconnectMax: Duration) throws -> MQTTClient {
        let urls: [MQTTURL]
        do throws(MQTTError) { urls = try MQTTURL.nodes(parsing: broker) } catch {
            throw ValidationError("--broker: \(error)")
        }
        let url = urls[0]
        if caFile != nil, !url.tls { throw ValidationError("--ca-file is for an mqtts:// broker; --broker is \(broker)") }
        var config = MQTTConfig(host: url.host, port: url.port, tls: url.tls ? MQTTTLS(caFile: caFile) : nil,
                                clientID: id, username: username, password: password,
                                otherNodes: urls.dropFirst().map { MQTTNode(host: $0.host, port: $0.port) })
        config.reconnectMax = reconnectMax
        do throws(MQTTError) { return try MQTTClient(config: config) } catch {
            throw ValidationError("broker: \(error)")
        }
    }
}
