// How Home Assistant finds the gateway (docs/esphome.md §7): mDNS `_esphomelib._tcp` with the
// TXT records ESPHome publishes (esphome/components/mdns/mdns_component.cpp), `mac` being the
// compact lower-case hex of `DeviceInfoResponse.mac_address` (Home Assistant's ESPHome config
// flow compares the two through `format_mac`). The gateway does not speak mDNS itself:
// avahi-daemon does, from a service file (avahi.service(5)) that the gateway writes at start.
import BatonLibc
import CLibc

public enum MDNSService {
    public static let serviceType = "_esphomelib._tcp"

    /// The service file announcing this server. `name` is the instance name (ESPHome: the node
    /// name), `mac` the compact form ("02ba70000001").
    public static func avahiXML(name: String, friendlyName: String, port: UInt16, mac: String, version: String,
                                encrypted: Bool) -> String {
        var s = "<?xml version=\"1.0\" standalone='no'?>\n"
        s += "<!DOCTYPE service-group SYSTEM \"avahi-service.dtd\">\n"
        s += "<!-- Written by baton gateway at start (esphome: in /etc/baton/baton.yaml); docs/esphome.md -->\n"
        s += "<service-group>\n"
        s += "  <name>\(escaped(name))</name>\n"
        s += "  <service>\n"
        s += "    <type>\(serviceType)</type>\n"
        s += "    <port>\(port)</port>\n"
        s += "    <txt-record>mac=\(escaped(mac))</txt-record>\n"
        s += "    <txt-record>friendly_name=\(escaped(friendlyName))</txt-record>\n"
        s += "    <txt-record>version=\(escaped(version))</txt-record>\n"
        s += "    <txt-record>platform=Baton</txt-record>\n"
        s += "    <txt-record>network=ethernet</txt-record>\n"
        if encrypted { s += "    <txt-record>api_encryption=\(NoiseHandshake.protocolName)</txt-record>\n" }
        s += "  </service>\n"
        s += "</service-group>\n"
        return s
    }

    /// What the file holds while the server is off: a group with no service, which avahi reads
    /// and announces nothing for.
    public static func emptyXML(name: String) -> String {
        "<?xml version=\"1.0\" standalone='no'?>\n<!DOCTYPE service-group SYSTEM \"avahi-service.dtd\">\n"
            + "<!-- baton gateway: the ESPHome API server is off (no esphome: section) -->\n"
            + "<service-group>\n  <name>\(escaped(name))</name>\n</service-group>\n"
    }

    /// Replaces the file's content (the package makes the file the gateway's to write; the
    /// directory is not, so it is rewritten in place, not renamed over). Avahi rereads the
    /// directory when a file in it changes.
    public static func write(_ text: String, to path: String) throws(Errno) {
        // Never created here: the package creates it, owned by the gateway's user (docs/install.md).
        let fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC)
        guard fd >= 0 else { throw Errno(errno, call: "open") }
        defer { Syscall.close(fd) }
        var bytes = Array(text.utf8)
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeMutableBytes { b in CLibc.write(fd, b.baseAddress! + done, b.count - done) }
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(errno, call: "write")
            }
            done += n
        }
        bytes.removeAll()
    }

    static func escaped(_ s: String) -> String {
        var out = ""
        for c in s.unicodeScalars {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}
