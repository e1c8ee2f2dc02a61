// What libmosquitto's callbacks leave for `MQTTClient.poll` (architecture.md §5.6: callbacks
// record; they never re-enter the library or call user code).
//
// libmosquitto calls its callbacks from inside mosquitto_loop_read/_write/_misc, publish and
// disconnect, on our thread. Each callback below copies what it was given into the inbox and
// returns. `poll` reads the inbox after the library call has returned, decides what the
// record means for the connection (connected, refused, fall back to v3.1.1, retry) and only
// then hands events to the caller. So user code never runs inside the library, and the
// library is never called from inside itself.

internal import CMosquitto
public import BatonLibc
internal import CLibc

/// One fact a callback saw. `attempt` numbers the connection attempt it belongs to, so a
/// record left over from an earlier connection (say, the close after `disconnect()`, read by
/// a `poll` that comes after the next `start`) is not taken for the current one.
enum MQTTRecord: Sendable {
    /// CONNACK: `code` is a v5 reason code or a v3.1.1 return code (0 = accepted), `flags`
    /// the Connect Acknowledge Flags (bit 0: session present; MQTT 5.0 §3.2.2.1).
    case connack(code: Int32, flags: Int32, attempt: Int)
    /// The socket closed: a MOSQ_ERR_* code, or a v5 DISCONNECT reason code (≥ 0x80), and
    /// errno as it was when the library noticed.
    case closed(code: Int32, errno: Int32, attempt: Int)
    case message(MQTTMessage)
    /// mosquitto_connect_async / mosquitto_reconnect_async failed before any socket existed;
    /// `text` says so, naming the node it was for (the client moves on before it is delivered).
    case attemptFailed(code: Int32, errno: Int32, text: String)
}

/// Allocated once per client and handed to libmosquitto as its userdata pointer, unretained:
/// the client holds the only strong reference and destroys the `mosquitto *` before it.
final class MQTTInbox {
    var records: [MQTTRecord] = []
    /// How many times the disconnect callback ran: tells `MQTTClient` whether a failed call
    /// already reported its close (libmosquitto 2.0.11 drops a failed TLS handshake without
    /// calling it; later versions call it).
    var closes = 0
    /// The last error line libmosquitto logged while connecting (e.g. OpenSSL's "certificate
    /// verify failed"); its error codes alone say only "A TLS error occurred".
    var lastLibraryError: String?
    /// The current connection attempt's number (MQTTClient counts them).
    var attempt = 0

    init() {
        records.reserveCapacity(32)
    }

    static func from(_ userdata: UnsafeMutableRawPointer?) -> MQTTInbox? {
        guard let userdata else { return nil }
        return Unmanaged<MQTTInbox>.fromOpaque(userdata).takeUnretainedValue()
    }
}

// MARK: - The callbacks (C function pointers: they capture nothing and reach the inbox through userdata)

let onConnectRecord: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?, Int32, Int32, OpaquePointer?) -> Void = {
    _, userdata, code, flags, _ in
    guard let inbox = MQTTInbox.from(userdata) else { return }
    inbox.records.append(.connack(code: code, flags: flags, attempt: inbox.attempt))
}

let onDisconnectRecord: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?, Int32, OpaquePointer?) -> Void = {
    _, userdata, code, _ in
    let saved = errno
    guard let inbox = MQTTInbox.from(userdata) else { return }
    inbox.closes += 1
    inbox.records.append(.closed(code: code, errno: saved, attempt: inbox.attempt))
}

let onMessageRecord: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?, UnsafePointer<mosquitto_message>?, OpaquePointer?) -> Void = {
    _, userdata, message, properties in
    guard let inbox = MQTTInbox.from(userdata), let m = message?.pointee else { return }
    let topic = m.topic.map { String(cString: $0) } ?? ""
    let payload: [UInt8] = if let bytes = m.payload, m.payloadlen > 0 {
        Array(UnsafeRawBufferPointer(start: bytes, count: Int(m.payloadlen)))
    } else {
        []
    }
    inbox.records.append(.message(MQTTMessage(topic: topic, payload: payload, qos: m.qos, retained: m.retain,
                                              properties: MQTTProperties(reading: properties))))
}

/// Keeps error and warning lines only, and only while connecting (MQTTClient installs it per
/// attempt and removes it on CONNACK: with a log callback set, libmosquitto formats every
/// debug line into a fresh buffer, per packet).
let onLogRecord: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?, Int32, UnsafePointer<CChar>?) -> Void = {
    _, userdata, level, line in
    guard level & (MOSQ_LOG_ERR | MOSQ_LOG_WARNING) != 0, let line, let inbox = MQTTInbox.from(userdata) else { return }
    inbox.lastLibraryError = String(cString: line)
}

/// An encrypted TLS key would make OpenSSL prompt on the terminal and block the gateway;
/// answering "no password" makes loading it fail with an error instead.
let noKeyPassword: @convention(c) (UnsafeMutablePointer<CChar>?, Int32, Int32, UnsafeMutableRawPointer?) -> Int32 = {
    _, _, _, _ in 0
}

// MARK: - MQTT v5 properties (MQTT 5.0 §3.3.2.3)

extension MQTTProperties {
    /// Copies the publish properties Baton uses out of a received PUBLISH. The library
    /// allocates every string it hands back; each is freed here.
    init(reading list: OpaquePointer?) {
        self.init()
        guard let list else { return }
        var expiry: UInt32 = 0
        if mosquitto_property_read_int32(list, Int32(MQTT_PROP_MESSAGE_EXPIRY_INTERVAL.rawValue), &expiry, false) != nil {
            messageExpiry = expiry
        }
        contentType = Self.readString(list, MQTT_PROP_CONTENT_TYPE)
        responseTopic = Self.readString(list, MQTT_PROP_RESPONSE_TOPIC)
        var data: UnsafeMutableRawPointer?
        var length: UInt16 = 0
        if mosquitto_property_read_binary(list, Int32(MQTT_PROP_CORRELATION_DATA.rawValue), &data, &length, false) != nil {
            correlationData = data.map { Array(UnsafeRawBufferPointer(start: $0, count: Int(length))) } ?? []
            free(data)
        }
        // A user property may repeat (§3.3.2.3.7, order preserved): read the first, then each
        // next one after the last found (skip_first = true).
        let identifier = Int32(MQTT_PROP_USER_PROPERTY.rawValue)
        var name: UnsafeMutablePointer<CChar>?
        var value: UnsafeMutablePointer<CChar>?
        var found = mosquitto_property_read_string_pair(list, identifier, &name, &value, false)
        while let at = found {
            userProperties.append(MQTTUserProperty(name.map { String(cString: $0) } ?? "", value.map { String(cString: $0) } ?? ""))
            free(name)
            free(value)
            name = nil
            value = nil
            found = mosquitto_property_read_string_pair(at, identifier, &name, &value, true)
        }
    }

    private static func readString(_ list: OpaquePointer, _ property: mqtt5_property) -> String? {
        var text: UnsafeMutablePointer<CChar>?
        guard mosquitto_property_read_string(list, Int32(property.rawValue), &text, false) != nil, let text else { return nil }
        defer { free(text) }
        return String(cString: text)
    }

    /// Builds libmosquitto's property list for a PUBLISH into `list` (the caller frees it with
    /// mosquitto_property_free_all, also when this throws).
    func add(to list: inout OpaquePointer?) throws(MQTTError) {
        func check(_ rc: Int32, _ what: String) throws(MQTTError) {
            if rc != MOSQ_ERR_SUCCESS.rawValue { throw MQTTError.mosquitto(rc, "publish property \(what)", errno: errno) }
        }
        if let messageExpiry {
            try check(mosquitto_property_add_int32(&list, Int32(MQTT_PROP_MESSAGE_EXPIRY_INTERVAL.rawValue), messageExpiry),
                      "message expiry")
        }
        if let contentType {
            try check(try addString(&list, MQTT_PROP_CONTENT_TYPE, contentType, "content type"), "content type")
        }
        if let responseTopic {
            try check(try addString(&list, MQTT_PROP_RESPONSE_TOPIC, responseTopic, "response topic"), "response topic")
        }
        if let correlationData {
            // Binary Data is a two-byte length and the bytes (MQTT 5.0 §1.5.6).
            guard correlationData.count <= Int(UInt16.max) else {
                throw .invalidConfiguration("correlation data is \(correlationData.count) bytes; MQTT allows at most 65535 (MQTT 5.0 §1.5.6)")
            }
            let rc = correlationData.withUnsafeBytes { bytes in
                mosquitto_property_add_binary(&list, Int32(MQTT_PROP_CORRELATION_DATA.rawValue), bytes.baseAddress,
                                              UInt16(bytes.count))
            }
            try check(rc, "correlation data")
        }
        for p in userProperties {
            try rejectNUL(p.name, "user property name")
            try rejectNUL(p.value, "user property value")
            let rc = p.name.withCString { n in
                p.value.withCString { v in mosquitto_property_add_string_pair(&list, Int32(MQTT_PROP_USER_PROPERTY.rawValue), n, v) }
            }
            try check(rc, "user property \"\(p.name)\"")
        }
    }

    private func addString(_ list: inout OpaquePointer?, _ property: mqtt5_property, _ value: String,
                           _ what: String) throws(MQTTError) -> Int32 {
        try rejectNUL(value, what)
        return value.withCString { mosquitto_property_add_string(&list, Int32(property.rawValue), $0) }
    }
}

/// A UTF-8 string in MQTT must not contain U+0000 (MQTT 5.0 §1.5.4), and a C string would end
/// there silently; say so instead.
func rejectNUL(_ s: String, _ what: String) throws(MQTTError) {
    if s.utf8.contains(0) {
        throw .invalidConfiguration("\(what) contains a NUL character, which MQTT strings may not (MQTT 5.0 §1.5.4)")
    }
}
