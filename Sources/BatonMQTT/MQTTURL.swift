// Broker URLs (docs/broker.md "URL forms"). The grammar is the authority part of RFC 3986
// §3.2 with nothing after it: scheme "://" host [":" port] ["/"]. Only what a broker address
// needs is accepted; everything else is an error that says what to write instead.

/// A broker URL: `mqtt://host[:port]` (1883) or `mqtts://host[:port]` (8883).
///
/// `tcp://` is accepted as another name for `mqtt://`, and `ssl://` for `mqtts://`: Paho,
/// Node-RED and many Home Assistant guides write them. An IPv6 address goes in brackets,
/// `mqtt://[fd00::10]:1883`; `host` holds it without them. The scheme is case-insensitive
/// (RFC 3986 §3.1).
public struct MQTTURL: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var tls: Bool

    public init(parsing text: String) throws(MQTTError) {
        guard let schemeEnd = Self.range(of: "://", in: text) else {
            let hint = text.isEmpty ? "mqtt://HOST" : "mqtt://\(text)"
            throw .invalidURL("\"\(text)\" has no scheme; write \(hint) (or mqtts:// for TLS)")
        }
        let scheme = text[..<schemeEnd.lowerBound].lowercased()
        switch scheme {
        case "mqtt", "tcp":
            tls = false
            port = 1883
        case "mqtts", "ssl":
            tls = true
            port = 8883
        case "ws", "wss":
            throw .invalidURL("\"\(text)\": MQTT over WebSockets is not supported; use the broker's MQTT listener (mqtt://HOST:1883 or mqtts://HOST:8883)")
        default:
            throw .invalidURL("\"\(text)\": unknown scheme \"\(scheme)\"; use mqtt:// (plain, port 1883) or mqtts:// (TLS, port 8883)")
        }

        var rest = text[schemeEnd.upperBound...]
        // One trailing "/" is what people paste from a browser; a path is not.
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        if rest.contains("/") || rest.contains("?") || rest.contains("#") {
            throw .invalidURL("\"\(text)\": a broker URL has no path, query or fragment; write only \(scheme)://HOST[:PORT]")
        }
        if rest.contains("@") {
            throw .invalidURL("\"\(text)\": credentials do not go in the URL; set broker.username and broker.password")
        }

        // Host: "[IPv6]" or a name / IPv4 address, then an optional ":port".
        let hostPart: Substring
        let portPart: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else {
                throw .invalidURL("\"\(text)\": IPv6 address has no closing \"]\"")
            }
            hostPart = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if after.isEmpty {
                portPart = nil
            } else if after.hasPrefix(":") {
                portPart = after.dropFirst()
            } else {
                throw .invalidURL("\"\(text)\": expected \":PORT\" after \"]\", found \"\(after)\"")
            }
            // Hex digits, colons, an embedded IPv4 tail, and a zone ("%eth0") for link-local.
            let address = hostPart.split(separator: "%", maxSplits: 1).first ?? ""
            guard address.contains(":"), address.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }) else {
                throw .invalidURL("\"\(text)\": \"[\(hostPart)]\" is not an IPv6 address")
            }
        } else {
            let colons = rest.count(where: { $0 == ":" })
            if colons > 1 {
                throw .invalidURL("\"\(text)\": an IPv6 address goes in brackets, e.g. \(scheme)://[\(rest)]")
            }
            if let colon = rest.firstIndex(of: ":") {
                hostPart = rest[..<colon]
                portPart = rest[rest.index(after: colon)...]
            } else {
                hostPart = rest
                portPart = nil
            }
            // RFC 3986 §3.2.2 reg-name as DNS uses it: letters, digits, "-", "." (and "_",
            // which some local resolvers hand out).
            if let bad = hostPart.first(where: { !($0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_")) }) {
                throw .invalidURL("\"\(text)\": the host contains \"\(bad)\"")
            }
        }
        if hostPart.isEmpty {
            throw .invalidURL("\"\(text)\" names no host; write \(scheme)://HOST[:PORT]")
        }
        host = String(hostPart)

        if let portPart {
            guard !portPart.isEmpty else {
                throw .invalidURL("\"\(text)\": nothing after \":\"; give a port (1–65535) or leave out the colon")
            }
            // Digits only, and at most 5 of them so the conversion cannot overflow.
            guard portPart.count <= 5, portPart.allSatisfy({ $0.isASCII && $0.isNumber }),
                  let value = Int(portPart), (1...65535).contains(value) else {
                throw .invalidURL("\"\(text)\": port \"\(portPart)\" is not a number from 1 to 65535")
            }
            port = value
        }
    }

    /// The URL in its canonical form, e.g. `mqtts://[fd00::10]:8883`, for log lines.
    public var description: String {
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return "\(tls ? "mqtts" : "mqtt")://\(shownHost):\(port)"
    }
}

extension MQTTURL {
    /// A broker's nodes written on one line, separated by commas (`--broker`, docs/broker.md
    /// "Several nodes"): `mqtt://node-a:1883,mqtt://node-b:1883`. No URL holds a comma, so the
    /// split is exact; spaces around a comma are allowed. One URL is a list of one.
    public static func nodes(parsing text: String) throws(MQTTError) -> [MQTTURL] {
        let parts = text.split(separator: ",", omittingEmptySubsequences: false)
        var urls: [MQTTURL] = []
        for raw in parts {
            var part = raw
            while part.first == " " { part = part.dropFirst() }
            while part.last == " " { part = part.dropLast() }
            if part.isEmpty, parts.count > 1 {
                throw .invalidURL("an empty entry in the list \"\(text)\": separate the nodes' URLs with one comma each, "
                                  + "like mqtt://node-a:1883,mqtt://node-b:1883")
            }
            urls.append(try MQTTURL(parsing: String(part)))
        }
        try checkNodes(urls)
        return urls
    }

    /// What a list of nodes must be: not empty, at most `MQTTConfig.maxNodes`, one scheme for
    /// all (the client has one set of TLS settings, for every node), no node twice.
    public static func checkNodes(_ urls: [MQTTURL]) throws(MQTTError) {
        guard let first = urls.first else {
            throw .invalidURL("expected at least one broker URL, like mqtt://host:1883")
        }
        guard urls.count <= MQTTConfig.maxNodes else {
            throw .invalidURL("\(urls.count) broker nodes; at most \(MQTTConfig.maxNodes)")
        }
        for (i, url) in urls.enumerated() {
            if url.tls != first.tls {
                throw .invalidURL("every node takes the same scheme (one set of TLS settings serves them all): "
                                  + "\(first) is \(first.tls ? "mqtts" : "mqtt")://, \(url) is \(url.tls ? "mqtts" : "mqtt")://")
            }
            if urls[..<i].contains(url) {
                throw .invalidURL("\(url) is listed twice")
            }
        }
    }

    /// The first `needle` in `text`. `String.firstRange(of:)` lives in the string-processing
    /// library, which Embedded Swift does not have.
    static func range(of needle: String, in text: String) -> Range<String.Index>? {
        var start = text.startIndex
        while start < text.endIndex {
            if text[start...].hasPrefix(needle) {
                return start..<text.index(start, offsetBy: needle.count)
            }
            start = text.index(after: start)
        }
        return nil
    }
}
