// Broker URLs: docs/broker.md "URL forms".
import Testing
import BatonMQTT

@Suite struct MQTTURLTests {
    @Test(arguments: [
        ("mqtt://broker.local", "broker.local", 1883, false),
        ("mqtt://broker.local:1884", "broker.local", 1884, false),
        ("mqtts://broker.local", "broker.local", 8883, true),
        ("mqtts://10.0.0.5:18883", "10.0.0.5", 18883, true),
        ("MQTT://Broker.Local/", "Broker.Local", 1883, false),       // scheme case-insensitive, one trailing slash
        ("tcp://192.168.1.10", "192.168.1.10", 1883, false),        // Paho's name for mqtt://
        ("ssl://192.168.1.10:8884", "192.168.1.10", 8884, true),    // Paho's name for mqtts://
        ("mqtt://[::1]", "::1", 1883, false),
        ("mqtts://[fd00::10]:8884", "fd00::10", 8884, true),
        ("mqtt://[fe80::1%eth0]:1883", "fe80::1%eth0", 1883, false),
        ("mqtt://[::ffff:192.0.2.1]", "::ffff:192.0.2.1", 1883, false),
        ("mqtt://core-mosquitto:65535", "core-mosquitto", 65535, false),
        ("mqtt://host:1", "host", 1, false),
    ])
    func goodURLs(text: String, host: String, port: Int, tls: Bool) throws {
        let url = try MQTTURL(parsing: text)
        #expect(url.host == host)
        #expect(url.port == port)
        #expect(url.tls == tls)
    }

    /// Each bad URL is refused with a message that names what to fix.
    @Test(arguments: [
        ("broker.local", "no scheme; write mqtt://broker.local"),
        ("", "no scheme"),
        ("http://broker.local", "unknown scheme \"http\""),
        ("ws://broker.local:9001", "WebSockets is not supported"),
        ("mqtt://", "names no host"),
        ("mqtt://:1883", "names no host"),
        ("mqtt://host:", "nothing after \":\""),
        ("mqtt://host:0", "port \"0\" is not a number from 1 to 65535"),
        ("mqtt://host:65536", "port \"65536\""),
        ("mqtt://host:99999999999999999999", "port \"99999999999999999999\""),
        ("mqtt://host:-1", "port \"-1\""),
        ("mqtt://host:18x3", "port \"18x3\""),
        ("mqtt://host:+1883", "port \"+1883\""),
        ("mqtt://::1:1883", "an IPv6 address goes in brackets"),
        ("mqtt://[::1", "no closing \"]\""),
        ("mqtt://[::1]x", "expected \":PORT\" after \"]\""),
        ("mqtt://[broker]:1883", "is not an IPv6 address"),
        ("mqtt://user:pass@host", "credentials do not go in the URL"),
        ("mqtt://host/baton", "no path, query or fragment"),
        ("mqtt://host:1883?x=1", "no path, query or fragment"),
        ("mqtt://bro ker", "the host contains \" \""),
    ])
    func badURLs(text: String, expected: String) {
        #expect {
            try MQTTURL(parsing: text)
        } throws: { error in
            guard let e = error as? MQTTError, case .invalidURL = e else { return false }
            return e.description.hasPrefix("invalid broker URL: ") && e.description.contains(expected)
        }
    }

    @Test func descriptionIsCanonical() throws {
        #expect(try MQTTURL(parsing: "SSL://[fd00::10]").description == "mqtts://[fd00::10]:8883")
        #expect(try MQTTURL(parsing: "tcp://broker/").description == "mqtt://broker:1883")
    }
}
