// Every MOSQ_ERR_* code passes through `MQTTError.mosquitto(_:_:errno:)` (architecture.md §5.6),
// and every refused CONNACK and broker DISCONNECT through the texts below, so what a user
// reads in the log is written in one place. docs/broker.md shows the lines.

internal import CMosquitto
public import BatonLibc
internal import CLibc

extension MQTTError {
    /// The one mapping from a libmosquitto return code to an `MQTTError`.
    ///
    /// `savedErrno` is `errno` read right after the call: MOSQ_ERR_ERRNO means "look at
    /// errno", and mosquitto_strerror reads the live errno, so it is put back first.
    /// MOSQ_ERR_EAI carries getaddrinfo's code in errno (lib/net_mosq.c, net__try_connect_tcp).
    static func mosquitto(_ code: Int32, _ operation: String, errno savedErrno: Int32) -> MQTTError {
        if code == MOSQ_ERR_NO_CONN.rawValue { return .notConnected }
        errno = savedErrno
        var text = String(cString: mosquitto_strerror(code))
        if code == MOSQ_ERR_EAI.rawValue {
            // "Lookup error." → "Lookup error: Name or service not known"
            if text.hasSuffix(".") { text.removeLast() }
            text += ": " + String(cString: gai_strerror(savedErrno))
        }
        return .library(code: code, operation: operation, text: text)
    }

    /// Which errors retrying cannot fix by itself. The list is lib/loop.c's
    /// (mosquitto_loop_forever returns on these instead of reconnecting), plus MOSQ_ERR_ERRNO
    /// with EPROTO, which loop.c also treats as final. A gateway never gives up, so here
    /// "fatal" means the reconnect backoff jumps to its maximum (docs/broker.md "Reconnect").
    static func isFatal(code: Int32, errno savedErrno: Int32) -> Bool {
        switch code {
        case MOSQ_ERR_NOMEM.rawValue, MOSQ_ERR_PROTOCOL.rawValue, MOSQ_ERR_INVAL.rawValue,
             MOSQ_ERR_NOT_FOUND.rawValue, MOSQ_ERR_TLS.rawValue, MOSQ_ERR_PAYLOAD_SIZE.rawValue,
             MOSQ_ERR_NOT_SUPPORTED.rawValue, MOSQ_ERR_AUTH.rawValue, MOSQ_ERR_ACL_DENIED.rawValue,
             MOSQ_ERR_UNKNOWN.rawValue, MOSQ_ERR_EAI.rawValue, MOSQ_ERR_PROXY.rawValue:
            true
        case MOSQ_ERR_ERRNO.rawValue:
            savedErrno == EPROTO
        default:
            false
        }
    }

    /// The broker is not there: nothing listens on its port (ECONNREFUSED), or the network has
    /// no route to it for now (ENETUNREACH, EHOSTUNREACH: an interface coming back). Retrying
    /// such a connection costs next to nothing, so it is retried within a second
    /// (Backoff.absentCeiling) instead of on the doubling ceiling.
    static func isBrokerAbsent(code: Int32, errno savedErrno: Int32) -> Bool {
        code == MOSQ_ERR_ERRNO.rawValue
            && (savedErrno == ECONNREFUSED || savedErrno == ENETUNREACH || savedErrno == EHOSTUNREACH)
    }

    /// The text of `.library`, or the description of the other cases.
    var text: String {
        if case .library(_, _, let text) = self { text } else { description }
    }
}

/// What the user reads when the broker answers CONNECT with a refusal.
///
/// MQTT v5 reason codes are MQTT 5.0 §3.2.2.2; MQTT v3.1.1 return codes §3.2.2.3. On a v3.1.1
/// connection libmosquitto hands the v3.1.1 code to the connect callback, on v5 the v5 reason
/// code (lib/handle_connack.c), so `version` says which table `code` belongs to. The names
/// come from libmosquitto (mosquitto_reason_string, mosquitto_connack_string); the hint after
/// them says what to change.
func refusalReason(code: Int32, version: MQTTProtocol) -> String {
    var name: String
    if version == .v5 {
        name = String(cString: mosquitto_reason_string(code))
    } else {
        name = String(cString: mosquitto_connack_string(code))
        // "Connection Refused: not authorised." → "not authorised"
        if let colon = name.firstIndex(of: ":") { name = String(name[name.index(after: colon)...]) }
    }
    name = sentence(name)

    let hint: String
    switch (version, code) {
    case (.v5, 0x86), (.v5, 0x87), (.v311, 4), (.v311, 5):
        // Bad User Name or Password / Not authorized; v3.1.1: bad user name or password /
        // not authorised. mosquitto answers both for a wrong password.
        hint = "check broker.username and broker.password"
    case (.v5, 0x85), (.v311, 2):
        hint = "the broker rejected the client id; check the gateway id"
    case (.v5, 0x84), (.v311, 1):
        hint = "set broker.protocol to auto or 3.1.1 for this broker"
    case (.v5, 0x88), (.v5, 0x89), (.v311, 3):
        hint = "the broker is not ready; retrying"
    case (.v5, 0x8A):
        hint = "the broker banned this client; see the broker's configuration"
    case (.v5, 0x8C):
        hint = "the broker wants another authentication method; see its configuration"
    default:
        hint = "see the broker's log"
    }
    return "the broker refused the login: \(name) (\(hint))"
}

/// Why a connection that was up went down, or why an attempt failed, for `.disconnected`.
///
/// `code` is what libmosquitto passed to the disconnect callback: a MOSQ_ERR_* code, or, when
/// the broker sent an MQTT v5 DISCONNECT, its reason code (MQTT 5.0 §3.14.2.1, always ≥ 0x80
/// for an error; lib/handle_disconnect.c passes it through).
func connectionReason(code: Int32, errno savedErrno: Int32, keepalive: Int, clientID: String) -> String {
    if code >= 0x80 {
        var text = "the broker disconnected this client: \(sentence(String(cString: mosquitto_reason_string(code))))"
        if code == 0x8E {  // Session taken over
            text += " (another client connected with the same client id \"\(clientID)\"; every gateway needs its own id)"
        }
        return text
    }
    switch code {
    case MOSQ_ERR_CONN_LOST.rawValue:
        return "the broker closed the connection"
    case MOSQ_ERR_KEEPALIVE.rawValue:
        return "no answer from the broker within the keepalive (\(keepalive) s)"
    default:
        return MQTTError.mosquitto(code, "", errno: savedErrno).text
    }
}

/// "Bad User Name or Password" → "bad user name or password"; " not authorised." → "not authorised".
private func sentence(_ s: String) -> String {
    var t = Substring(s)
    while t.first == " " { t = t.dropFirst() }
    while t.last == "." || t.last == " " { t = t.dropLast() }
    return t.isEmpty ? "unknown reason" : t.lowercased()
}
